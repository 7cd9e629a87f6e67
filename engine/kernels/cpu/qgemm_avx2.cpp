// The AVX2 path (with FMA and F16C): the integer products for qgemm_tile.inc's micro-kernel, and the
// activation quantizer.
//
// Q4 nibbles (0..15, unsigned) times int8 activations with maddubs (u8 x s8 pairs summed to int16, at
// most 2 * 15 * 127); Q8_0 with the sign trick, |w| x (a * sign(w)): |w| <= 128 and |a| <= 127 (the
// quantizer clamps), so a pair stays <= 32512 and maddubs never saturates. Exact throughout.
#include <immintrin.h>

#include "qgemm.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace workbench_cpu {
namespace {

struct Isa {
  // Reduced in int16 as far as it is exact: a lane of p is at most 2 * 2 * 15 * 127 = 7620, four of them
  // summed (two hadds) 30480 < 2^15; the last step, madd, widens to int32. Lane n ends as column n.
  static __m256i q4(const __m256i lo[4], const __m256i hi[4], __m256i alo, __m256i ahi) {
    __m256i p[4];
    for (int j = 0; j < 4; ++j)
      p[j] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[j], alo), _mm256_maddubs_epi16(hi[j], ahi));
    const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
    return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
  }
  static __m256i q8_prep(__m256i w) { return _mm256_sign_epi8(w, w); }  // |w| as u8 (128 for -128)
  static __m256i q8(__m256i abs_w, __m256i w, __m256i aq) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(aq, w)), _mm256_set1_epi16(1));
  }
  static __m256i q8_fix(__m256i isum, int32_t) { return isum; }
  static __m256i q8s(__m256i abs_w, __m256i w, __m256i aq) { return q8(abs_w, w, aq); }
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
