// SwiGLU's product for one row of the fused decoder layer's MLP (decoder_layer.cpp), out_k = silu(g_k) * u_k:
//   t = exp_f32(-|g|)   (paged_attention.h's exp_f32: its argument never positive, so it never overflows)
//   silu(g) = (g >= 0 ? g : g * t) / (1 + t)   (the logistic's two halves, each from the same t)
// every fp32 operation rounded once. The AVX2 and AVX-512 versions do these operations lane by lane, so
// they give the scalar version's bits; none of them calls the C library's expf, whose bits and speed
// vary with the machine.
//
// Plain C++ only, for the reason qgemm.h gives.
#pragma once

#include <cstdint>

namespace workbench_cpu {

void swiglu_scalar(const float* g, const float* u, float* out, int64_t n);
void swiglu_avx2(const float* g, const float* u, float* out, int64_t n);
void swiglu_avx512(const float* g, const float* u, float* out, int64_t n);

}  // namespace workbench_cpu
