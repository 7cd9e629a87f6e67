// The contract between the dense op (dense_ops.cpp) and its code paths (dense_gemm_scalar/avx2/avx512.cpp):
// y = x @ W.T (+ bias) for float weights W [N, K] as they are stored (float32, bfloat16 or float16, row
// major, no repacking), with float32 activations x [M, K].
//
// Plain C++ only (no torch headers), for the reason qgemm.h gives.
//
// Arithmetic every path performs, per output element (row i, column n):
//   16 lane sums p[0..15], each starting at +0.0f;
//   for k = 0, 1, ..., K - 1 in order:  p[k % 16] = fma(x[i, k], float(W[n, k]), p[k % 16])
//   then a fixed tree: for h = 8, 4, 2, 1: p[j] = p[j] + p[j + h] for j < h
//   y = p[0], then y = y + bias[n] (one fp32 add) where there is a bias.
// float(W[n, k]) widens bfloat16 and float16 exactly. Every fma and add rounds to fp32 once, and lane j of
// a 16-wide register holds p[j], so a 512-bit register, a pair of 256-bit registers and the scalar loop
// compute the same bits. Nothing depends on M or on which rows share a call: a row's output is the same
// bits in any batch, with any thread count, on any path.
#pragma once

#include <cstdint>

namespace workbench_cpu {

constexpr int64_t LANES = 16;  // the lane sums of the arithmetic above

enum WeightType : int { W_F32 = 0, W_BF16 = 1, W_F16 = 2 };

struct DenseArgs {
  const float* x;        // [M, K]
  const void* w;         // [N, K] in `wtype`, row stride K
  int wtype;
  const float* bias;     // [N], or null
  int64_t M, N, K;
  float* out;            // [M, N]
};

// Each computes output columns [n0, n1) for all M rows.
void dense_scalar(const DenseArgs& a, int64_t n0, int64_t n1);
void dense_avx2(const DenseArgs& a, int64_t n0, int64_t n1);
void dense_avx512(const DenseArgs& a, int64_t n0, int64_t n1);

}  // namespace workbench_cpu
