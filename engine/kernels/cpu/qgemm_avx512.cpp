// The AVX-512 VNNI path: the integer products for qgemm_tile.inc's micro-kernel with vpdpbusd (u8 x s8,
// four products summed into int32 without saturation), EVEX-encoded at 256 bits so it shares the packed
// layout and the epilogue with the AVX2 path. Compiled everywhere, run only where the CPU
// reports AVX512F/BW/VL and VNNI (ops.cpp checks).
//
// Q8_0 weights are signed, and AVX-512 has no byte sign instruction: w + 128 (w ^ 0x80) is the unsigned
// operand, and the block's sum is corrected by 128 * s_a, the activations' sum. Exact in int32. Q6_K, whose
// two halves are scaled apart, takes |w| x (a * sign(w)) instead (|w| <= 32). The other types' quants are
// unsigned already.
#include <immintrin.h>

#include "qgemm.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

namespace workbench_cpu {
namespace {

struct Isa {
  static constexpr int MAX_ROWS = 8;  // 32 registers (EVEX): 8 rows of int and float sums beside the weights
  static constexpr bool BIAS_Q8 = true;
  static __m256i dot(__m256i acc, __m256i w, __m256i a) { return _mm256_dpbusd_epi32(acc, w, a); }
};

#include "qgemm_tile.inc"

}  // namespace

void gemm_avx512(const GemmArgs& a, int64_t g0, int64_t g1) { gemm(a, g0, g1); }

}  // namespace workbench_cpu

#pragma GCC pop_options
