// The SwiGLU product's three versions (swiglu.h gives the arithmetic). A row's elements are independent, so
// the vector versions run the scalar operations lane by lane and finish the row's tail with the scalar one.
#include "swiglu.h"

#include <immintrin.h>

#include <cmath>

#include "paged_attention.h"  // exp_f32 and its constants

namespace workbench_cpu {

void swiglu_scalar(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    const float t = exp_f32(-std::fabs(g[k]));
    out[k] = ((g[k] >= 0.0f ? g[k] : g[k] * t) / (1.0f + t)) * u[k];
  }
}

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace {
namespace lanes8 {
#include "exp_lanes.inc"
}  // namespace lanes8
}  // namespace

void swiglu_avx2(const float* g, const float* u, float* out, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 x = _mm256_loadu_ps(g + k);
    const __m256 t = lanes8::exp8(_mm256_or_ps(x, sign));  // -|g|
    const __m256 num = _mm256_blendv_ps(_mm256_mul_ps(x, t), x, _mm256_cmp_ps(x, zero, _CMP_GE_OQ));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(one, t)), _mm256_loadu_ps(u + k)));
  }
  swiglu_scalar(g + k, u + k, out + k, n - k);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512dq")
namespace {
namespace lanes16 {
#define WORKBENCH_EXP16
#include "exp_lanes.inc"
#undef WORKBENCH_EXP16
}  // namespace lanes16
}  // namespace

void swiglu_avx512(const float* g, const float* u, float* out, int64_t n) {
  const __m512 sign = _mm512_set1_ps(-0.0f), one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512 x = _mm512_loadu_ps(g + k);
    const __m512 t = lanes16::exp16(_mm512_or_ps(x, sign));  // -|g|
    const __m512 num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GE_OQ), _mm512_mul_ps(x, t), x);
    _mm512_storeu_ps(out + k, _mm512_mul_ps(_mm512_div_ps(num, _mm512_add_ps(one, t)), _mm512_loadu_ps(u + k)));
  }
  _mm256_zeroupper();  // the scalar tail and what runs after: no AVX-SSE transition on every instruction
  swiglu_scalar(g + k, u + k, out + k, n - k);
}
#pragma GCC pop_options

}  // namespace workbench_cpu
