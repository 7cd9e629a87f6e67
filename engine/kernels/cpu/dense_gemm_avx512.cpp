// The AVX-512 path of the dense GEMM: one 512-bit register is one output's 16 lane sums (dense_gemm.h), a
// tile of 4 rows x 4 columns. Compiled everywhere, run only where the CPU reports AVX-512 (ops.cpp checks).
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "dense_gemm.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

namespace workbench_cpu {
namespace {

struct Isa {
  using V = __m512;
  static constexpr int ROWS = 4, COLS = 4;  // 16 accumulators beside 4 weights and an activation: 21 of 32
  static V zero() { return _mm512_setzero_ps(); }
  static __mmask16 first(int n) { return __mmask16((1u << n) - 1u); }
  static V fma(V a, V b, V c, int n) {
    return n == LANES ? _mm512_fmadd_ps(a, b, c) : _mm512_mask3_fmadd_ps(a, b, c, first(n));
  }
  static V load_x(const float* p, int n) {
    return n == LANES ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(first(n), p);
  }
  template <int T, typename Elem>
  static V load_w(const Elem* p, int n) {
    if constexpr (T == W_F32) {
      return load_x(p, n);
    } else {
      const __m256i h = n == LANES ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                   : _mm256_maskz_loadu_epi16(first(n), p);
      if constexpr (T == W_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      else return _mm512_cvtph_ps(h);
    }
  }
  static float reduce(V v) {
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 s8 = _mm256_add_ps(lo, hi);                                                   // p[j] + p[j + 8]
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));    // + p[j + 4]
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                   // + p[j + 2]
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                            // + p[1]
  }
};

#include "dense_gemm_tile.inc"

}  // namespace

void dense_avx512(const DenseArgs& a, int64_t n0, int64_t n1) { dense_any(a, n0, n1); }

}  // namespace workbench_cpu

#pragma GCC pop_options
