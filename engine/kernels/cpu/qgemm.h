// The contract between the op layer (ops.cpp) and the code paths (qgemm_scalar/avx2/avx512/amx.cpp).
//
// Included by the SIMD files before their `#pragma GCC target`, so it holds only plain C++ and no torch
// headers: an inline function from a shared header compiled under a wider target could be the copy the
// linker keeps for every caller, and then run on a CPU without it.
//
// Packed weight layout (built once at load by engine/kernels/cpu/pack.py), output columns in groups of 8:
//   [groups = ceil(N / 8)][blocks = K / 32][group_bytes(qtype)] uint8, for each (group, block):
//     Q4_0: d fp16 [8] | nibbles [4 quads][8 columns][4]          144 bytes
//     Q4_1: d fp16 [8] | m fp16 [8] | nibbles [4][8][4]            160 bytes
//     Q8_0: d fp16 [8] | q int8 [8 quads][8 columns][4]           272 bytes
//     Q4_K: d fp32 [8] | m fp32 [8] | nibbles [4][8][4]            192 bytes
//     Q5_K: d fp32 [8] | m fp32 [8] | q int8 [8][8][4]             320 bytes
//     Q6_K: d fp16 [8] | c int8 [2][8] | q int8 [8][8][4]          288 bytes
//   The ggml types keep the file's bytes a weight (fp16 scales, widened to fp32 exactly where used). The
//   K-quants come re-encoded per 32-block (engine/loading/transcode.py): Q4_K and Q5_K as w = d * q + m
//   with d and m the fp32 products ggml's own dequantizer forms (sub-block scale times super-block scale,
//   exact), q in 0..15 or 0..31; Q6_K as w = d * c_h * q, q in -32..31, the integer sub-scale c_h of
//   each 16-element half h kept apart so the integer sum stays exact (Q5_1 travels as Q5_K).
//   The quants are column-interleaved, 4 bytes at a time: quad j (a block's elements 4j .. 4j + 3) of column
//   0, of column 1, ..., of column 7, then quad j + 1: one 256-bit load holds 4 consecutive k of each of the 8
//   columns, one per 32-bit lane. Int8 types: quads 0..7, 256 bytes. Nibble types: 4 loads of 32 bytes hold
//   ggml's bytes 4j .. 4j + 3 of each column, whose low nibbles are quad j and high nibbles quad j + 4.
//   Columns past N (the last group's padding) have d = m = c = 0 and q = 0.
//
// Arithmetic every path performs, per output element (row i, column n), blocks b = 0, 1, 2, ... in order:
//   isum = sum over the block's 32 k of q_w * q_a                      (exact int32)
//          Q6_K: c_0 * (sum over k < 16) + c_1 * (sum over k >= 16)   (exact int32)
//   Q4_0:       acc = fma(d_w * d_a, float(isum - 8 * s_a), acc)
//   Q4_1, Q4_K, Q5_K: acc = fma(d_w * d_a, float(isum), acc); acc = fma(m_w * d_a, float(s_a), acc)
//   Q8_0, Q6_K: acc = fma(d_w * d_a, float(isum), acc)
// with acc starting at +0.0f, every product and fma rounded to fp32 once, s_a the block's sum of q_a.
// Elementwise IEEE operations give the same bits at any vector width, so the paths agree bit for bit.
#pragma once

#include <cstdint>

namespace workbench_cpu {

constexpr int64_t QK = 32;   // ggml block size along K
constexpr int64_t GROUP = 8; // output columns per packed group

enum QType : int { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };  // ggml's type ids

constexpr bool known_qtype(int64_t qtype) {
  return qtype == Q4_0 || qtype == Q4_1 || qtype == Q8_0 || qtype == Q4_K || qtype == Q5_K || qtype == Q6_K;
}
constexpr int64_t group_bytes(int qtype) {
  switch (qtype) {
    case Q4_0: return 144;
    case Q4_1: return 160;
    case Q8_0: return 272;
    case Q4_K: return 192;
    case Q5_K: return 320;
    default: return 288;  // Q6_K
  }
}
// Where a group-block's parts start, and what they are.
constexpr bool nibbles(int qtype) { return qtype == Q4_0 || qtype == Q4_1 || qtype == Q4_K; }
constexpr bool fp32_scales(int qtype) { return qtype == Q4_K || qtype == Q5_K; }
constexpr bool has_min(int qtype) { return qtype == Q4_1 || qtype == Q4_K || qtype == Q5_K; }
constexpr int64_t min_offset(int qtype) { return fp32_scales(qtype) ? 32 : 16; }
constexpr int64_t quants_offset(int qtype) {
  return qtype == Q4_0 || qtype == Q8_0 ? 16 : qtype == Q4_1 || qtype == Q6_K ? 32 : 64;
}
constexpr const char* QTYPES_ACCEPTED = "2 (Q4_0), 3 (Q4_1), 8 (Q8_0), 12 (Q4_K), 13 (Q5_K) or 14 (Q6_K)";

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
void gemm_amx(const GemmArgs& a, int64_t g0, int64_t g1);  // for M >= AMX_TILE_ROWS
constexpr int64_t AMX_TILE_ROWS = 16;  // the rows of the AMX path's tiles
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
