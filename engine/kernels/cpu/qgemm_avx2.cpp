// The AVX2 path (with FMA and F16C): the integer products for qgemm_tile.inc's micro-kernel, and the
// activation quantizer.
//
// Unsigned quants (nibbles, Q5_K's 0..31) times int8 activations with maddubs (u8 x s8 pairs summed to
// int16); signed ones (Q8_0, Q6_K) with the sign trick, |w| x (a * sign(w)): |w| <= 128 and |a| <= 127 (the
// quantizer clamps), so a pair stays <= 32512 and maddubs never saturates. Exact throughout.
#include <immintrin.h>

#include "qgemm.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace workbench_cpu {
namespace {

struct Isa {
  static constexpr int MAX_ROWS = 4;  // 16 registers: 4 rows of int and float sums beside the weights
  static constexpr bool BIAS_Q8 = false;  // (w + 128) * a would saturate maddubs' int16 pairs
  // maddubs: u8 x s8 pairs summed to int16, at most 2 * 128 * 127 = 32512 (the sign trick's |w| <= 128,
  // nibbles <= 15, Q5_K <= 31): never saturates; madd widens each pair of pairs to the lane's int32.
  static __m256i dot(__m256i acc, __m256i w, __m256i a) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
  }
};

#include "qgemm_tile.inc"

}  // namespace

void gemm_avx2(const GemmArgs& a, int64_t g0, int64_t g1) { gemm(a, g0, g1); }

void quantize_avx2(const QuantArgs& a, int64_t r0, int64_t r1) {
  const int64_t nb = a.K / QK;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t off = i * a.K + b * QK;
      __m256 x[4];
      for (int c = 0; c < 4; ++c) {
        if (a.x_bf16) {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
              static_cast<const uint16_t*>(a.x) + off + 8 * c));
          x[c] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        } else {
          x[c] = _mm256_loadu_ps(static_cast<const float*>(a.x) + off + 8 * c);
        }
      }
      __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, x[0]), _mm256_andnot_ps(sign, x[1])),
                               _mm256_max_ps(_mm256_andnot_ps(sign, x[2]), _mm256_andnot_ps(sign, x[3])));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4);
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const __m256 vid = _mm256_set1_ps(id);
      __m256i sum = _mm256_setzero_si256();
      __m256i qi[4];
      for (int c = 0; c < 4; ++c) {
        // cvtps rounds half to even (the default MXCSR mode), as nearbyint does in the scalar path.
        qi[c] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x[c], vid)), lim), nlim);
        sum = _mm256_add_epi32(sum, qi[c]);
      }
      // int32 -> int8 in order: packs interleaves 128-bit lanes, the permute restores element order.
      const __m256i p16 = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
      const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.q + off), p8);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      a.d[i * nb + b] = d;
      a.s[i * nb + b] = _mm_cvtsi128_si32(s4);
    }
  }
}

}  // namespace workbench_cpu

#pragma GCC pop_options
