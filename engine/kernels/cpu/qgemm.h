// The contract between the op layer (ops.cpp) and the code paths (qgemm_scalar/avx2/avx512.cpp).
//
// Included by the SIMD files before their `#pragma GCC target`, so it holds only plain C++ and no torch
// headers: an inline function from a shared header compiled under a wider target could be the copy the
// linker keeps for every caller, and then run on a CPU without it.
//
// Packed weight layout (built once at load by engine/kernels/cpu/pack.py), output columns in groups of 8:
//   [groups = ceil(N / 8)][blocks = K / 32][GROUP_BYTES[qtype]] uint8, for each (group, block):
//     Q4_0: d fp16 [8] | nibbles [4][32]                 144 bytes
//     Q4_1: d fp16 [8] | m fp16 [8] | nibbles [4][32]    160 bytes
//     Q8_0: d fp16 [8] | q int8 [8][32]                  272 bytes
//   (ggml's own bytes a weight: the scales stay fp16, widened to fp32 exactly where they are used).
//   Q4 nibble row j (j = 0..3) is column j's 16 ggml bytes then column j + 4's: one 256-bit load holds two
//   columns, low nibbles elements 0-15 and high nibbles 16-31, and a two-level hadd of the four rows'
//   partial sums lands the 8 columns in their natural order. Q8_0 row j is column j's 32 int8.
//   Columns past N (the last group's padding) have d = m = 0 and q = 0.
//
// Arithmetic every path performs, per output element (row i, column n), blocks b = 0, 1, 2, ... in order:
//   isum = sum over the block's 32 k of q_w * q_a                      (exact int32)
//   Q4_0: acc = fma(d_w * d_a, float(isum - 8 * s_a), acc)
//   Q4_1: acc = fma(d_w * d_a, float(isum), acc); acc = fma(m_w * d_a, float(s_a), acc)
//   Q8_0: acc = fma(d_w * d_a, float(isum), acc)
// with acc starting at +0.0f, every product and fma rounded to fp32 once, s_a the block's sum of q_a.
// Elementwise IEEE operations give the same bits at any vector width, so the paths agree bit for bit.
#pragma once

#include <cstdint>

namespace workbench_cpu {

constexpr int64_t QK = 32;   // ggml block size along K
constexpr int64_t GROUP = 8; // output columns per packed group

enum QType : int { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };  // ggml's type ids

constexpr int64_t group_bytes(int qtype) {
  return qtype == Q4_0 ? 144 : qtype == Q4_1 ? 160 : 272;
}

// Activations quantized per 32-block (ggml's Q8_1 idea): q = clamp(nearbyint(x / d), -127, 127) with
// d = amax / 127 (id = 1 / d, 0 for an all-zero block), s = sum of the block's q.
struct QuantArgs {
  const void* x;         // [M, K] float32 or bfloat16 (bits as uint16)
  bool x_bf16;
  int64_t M, K;
  int8_t* q;             // [M, K]
  float* d;              // [M, K / 32]
  int32_t* s;            // [M, K / 32]
};

struct GemmArgs {
  const int8_t* q;       // [M, K]
  const float* d;        // [M, K / 32]
  const int32_t* s;      // [M, K / 32]
  const uint8_t* w;      // packed, see above
  int qtype;
  int64_t M, N, K;
  float* out_f32;        // [M, N], or null when out_bf16 is set
  uint16_t* out_bf16;    // [M, N] bfloat16 bits
  bool accumulate = false;  // out_f32 = out_f32 + the product (one fp32 add: a residual), not out_f32 = it
};

// Each computes output column groups [g0, g1) for all M rows (or quantizes rows [r0, r1)).
void gemm_scalar(const GemmArgs& a, int64_t g0, int64_t g1);
void gemm_avx2(const GemmArgs& a, int64_t g0, int64_t g1);
void gemm_avx512(const GemmArgs& a, int64_t g0, int64_t g1);
void quantize_scalar(const QuantArgs& a, int64_t r0, int64_t r1);
void quantize_avx2(const QuantArgs& a, int64_t r0, int64_t r1);

// float -> bfloat16 bits, round to nearest even (NaN stays a quiet NaN), as torch rounds.
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half -> float, exact (normals, subnormals, infinities, NaN), for the paths without F16C.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t u;
  if (exponent == 0x1fu) {
    u = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int shift = 0;
    uint32_t m = mantissa;
    while (!(m & 0x400u)) { m <<= 1; ++shift; }
    u = sign | (uint32_t(113 - shift) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace workbench_cpu
