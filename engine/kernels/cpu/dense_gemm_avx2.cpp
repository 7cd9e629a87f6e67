// The AVX2 path of the dense GEMM: a pair of 256-bit registers is one output's 16 lane sums (dense_gemm.h),
// lanes 0-7 in the first, 8-15 in the second; a tile of 2 rows x 2 columns.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "dense_gemm.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace workbench_cpu {
namespace {

struct Pair {
  __m256 lo, hi;
};

struct Isa {
  using V = Pair;
  static constexpr int ROWS = 2, COLS = 2;  // 8 accumulator registers beside 4 of weights and 2 of activations
  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  // Lanes [0, n) of a 256-bit register set, n of 0..8.
  static __m256 first(int n) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  }
  static V fma(V a, V b, V c, int n) {
    const V f = {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
    if (n == LANES) return f;
    return {_mm256_blendv_ps(c.lo, f.lo, first(std::min(n, 8))), _mm256_blendv_ps(c.hi, f.hi, first(std::max(n - 8, 0)))};
  }
  // The tail (K not a multiple of 16) goes through a zeroed copy: it happens once per output.
  template <typename Elem>
  static const Elem* padded(const Elem* p, int n, Elem (&buffer)[LANES]) {
    if (n == LANES) return p;
    std::fill(buffer, buffer + LANES, Elem(0));
    std::copy(p, p + n, buffer);
    return buffer;
  }
  static V load_x(const float* p, int n) {
    float buffer[LANES];
    const float* q = padded(p, n, buffer);
    return {_mm256_loadu_ps(q), _mm256_loadu_ps(q + 8)};
  }
  static __m256 widen(__m128i h, bool bf16) {
    return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
  }
  template <int T, typename Elem>
  static V load_w(const Elem* p, int n) {
    if constexpr (T == W_F32) {
      return load_x(p, n);
    } else {
      uint16_t buffer[LANES];
      const uint16_t* q = padded(p, n, buffer);
      return {widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), T == W_BF16),
              widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 8)), T == W_BF16)};
    }
  }
  static float reduce(V v) {
    const __m256 s8 = _mm256_add_ps(v.lo, v.hi);                                               // p[j] + p[j + 8]
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));    // + p[j + 4]
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                   // + p[j + 2]
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                            // + p[1]
  }
};

#include "dense_gemm_tile.inc"

}  // namespace

void dense_avx2(const DenseArgs& a, int64_t n0, int64_t n1) { dense_any(a, n0, n1); }

}  // namespace workbench_cpu

#pragma GCC pop_options
