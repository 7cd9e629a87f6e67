// The reference path of the dense GEMM: plain C++ for any CPU, one output at a time, in dense_gemm.h's
// order. The SIMD paths must match it bit for bit (tests/kernels/test_cpu_dense_gemm.py).
#include <cmath>

#include "dense_gemm.h"
#include "qgemm.h"

namespace workbench_cpu {
namespace {

float weight(const DenseArgs& a, int64_t n, int64_t k) {
  const int64_t at = n * a.K + k;
  if (a.wtype == W_F32) return static_cast<const float*>(a.w)[at];
  const uint16_t bits = static_cast<const uint16_t*>(a.w)[at];
  return a.wtype == W_BF16 ? bf16_to_float(bits) : half_to_float(bits);
}

}  // namespace

void dense_scalar(const DenseArgs& a, int64_t n0, int64_t n1) {
  for (int64_t i = 0; i < a.M; ++i) {
    const float* x = a.x + i * a.K;
    for (int64_t n = n0; n < n1; ++n) {
      float p[LANES] = {};
      for (int64_t k = 0; k < a.K; ++k) p[k % LANES] = std::fma(x[k], weight(a, n, k), p[k % LANES]);
      for (int64_t h = LANES / 2; h >= 1; h /= 2)
        for (int64_t j = 0; j < h; ++j) p[j] = p[j] + p[j + h];
      float y = p[0];
      if (a.bias) y = y + a.bias[n];
      a.out[i * a.N + n] = y;
    }
  }
}

}  // namespace workbench_cpu
