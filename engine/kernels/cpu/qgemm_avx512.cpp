// The AVX-512 VNNI path: the integer products for qgemm_tile.inc's micro-kernel with vpdpbusd (u8 x s8,
// four products summed into int32 without saturation), EVEX-encoded at 256 bits so it shares the packed
// layout, the reduction and the epilogue with the AVX2 path. Compiled everywhere, run only where the CPU
// reports AVX512F/BW/VL and VNNI (ops.cpp checks).
//
// Q8_0 weights are signed, and AVX-512 has no byte sign instruction: w + 128 (w ^ 0x80) is the unsigned
// operand, and the block's sum is corrected by 128 * s_a, the activations' sum. Exact in int32. Q6_K, whose
// two halves are scaled apart, takes |w| x (a * sign(w)) instead (|w| <= 32).
#include <immintrin.h>

#include "qgemm.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

namespace workbench_cpu {
namespace {

struct Isa {
  static __m256i q4(const __m256i lo[4], const __m256i hi[4], __m256i alo, __m256i ahi);
  static __m256i q8_prep(__m256i w) { return _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80))); }
  static __m256i q8(__m256i w_biased, __m256i, __m256i aq) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w_biased, aq);
  }
  static __m256i q8_fix(__m256i isum, int32_t sa) { return _mm256_sub_epi32(isum, _mm256_set1_epi32(128 * sa)); }
  // The sign trick instead of the bias: a half-block's sum then needs no correction.
  static __m256i q8s(__m256i abs_w, __m256i w, __m256i aq) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), abs_w, _mm256_sign_epi8(aq, w));
  }
};

#include "qgemm_tile.inc"

inline __m256i Isa::q4(const __m256i lo[4], const __m256i hi[4], __m256i alo, __m256i ahi) {
  __m256i p[4];
  for (int j = 0; j < 4; ++j)
    p[j] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo[j], alo), hi[j], ahi);
  return reduce4(p);
}

}  // namespace

void gemm_avx512(const GemmArgs& a, int64_t g0, int64_t g1) { gemm(a, g0, g1); }

}  // namespace workbench_cpu

#pragma GCC pop_options
