// The reference path: plain C++ for any CPU, one output element at a time, in the order qgemm.h defines.
// The SIMD paths must match it bit for bit (tests/kernels/test_cpu_qgemm.py).
#include <cmath>
#include <cstring>

#include "qgemm.h"

namespace workbench_cpu {
namespace {

float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

float load_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// Column j's scale (d) and offset (m) in a group-block.
float scale_of(int qtype, const uint8_t* blk, int64_t j) {
  return fp32_scales(qtype) ? load_f32(blk + 4 * j) : load_f16(blk + 2 * j);
}
float min_of(int qtype, const uint8_t* blk, int64_t j) {
  const uint8_t* m = blk + min_offset(qtype);
  return fp32_scales(qtype) ? load_f32(m + 4 * j) : load_f16(m + 2 * j);
}

// Quant k (0..31) of column j in a group-block: its byte, and for the nibble types which nibble.
uint8_t quant_byte(int qtype, const uint8_t* blk, int64_t j, int k) {
  const int quad = nibbles(qtype) ? (k % 16) / 4 : k / 4;
  return blk[quants_offset(qtype) + 32 * quad + 4 * j + k % 4];
}

int32_t quant(int qtype, const uint8_t* blk, int64_t j, int k) {
  const uint8_t byte = quant_byte(qtype, blk, j, k);
  if (nibbles(qtype)) return k < 16 ? byte & 0x0f : byte >> 4;
  return int32_t(static_cast<int8_t>(byte));
}

// Integer dot of column j's block with the activation block a[32].
int32_t block_dot(int qtype, const uint8_t* blk, int64_t j, const int8_t* a) {
  if (qtype == Q6_K) {  // each half's sum times its integer sub-scale
    const int8_t* c = reinterpret_cast<const int8_t*>(blk + 16);
    int32_t isum = 0;
    for (int h = 0; h < 2; ++h) {
      int32_t half = 0;
      for (int k = 16 * h; k < 16 * h + 16; ++k) half += quant(qtype, blk, j, k) * int32_t(a[k]);
      isum += int32_t(c[8 * h + j]) * half;
    }
    return isum;
  }
  int32_t isum = 0;
  for (int k = 0; k < 32; ++k) isum += quant(qtype, blk, j, k) * int32_t(a[k]);
  return isum;
}

}  // namespace

void gemm_scalar(const GemmArgs& a, int64_t g0, int64_t g1) {
  const int64_t nb = a.K / QK, gb = group_bytes(a.qtype);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* wg = a.w + g * nb * gb;
    for (int64_t i = 0; i < a.M; ++i) {
      for (int64_t j = 0; j < GROUP && g * GROUP + j < a.N; ++j) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = wg + b * gb;
          const float dw = scale_of(a.qtype, blk, j), da = a.d[i * nb + b];
          const int32_t sa = a.s[i * nb + b];
          const int32_t isum = block_dot(a.qtype, blk, j, a.q + i * a.K + b * QK);
          if (a.qtype == Q4_0) {
            acc = std::fma(dw * da, float(isum - 8 * sa), acc);
          } else {
            acc = std::fma(dw * da, float(isum), acc);
            if (has_min(a.qtype)) acc = std::fma(min_of(a.qtype, blk, j) * da, float(sa), acc);
          }
        }
        const int64_t n = g * GROUP + j;
        if (a.out_bf16) a.out_bf16[i * a.N + n] = bf16_bits(acc);
        else a.out_f32[i * a.N + n] = a.accumulate ? a.out_f32[i * a.N + n] + acc : acc;
      }
    }
  }
}

void quantize_scalar(const QuantArgs& a, int64_t r0, int64_t r1) {
  const int64_t nb = a.K / QK;
  float x[QK];
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t off = i * a.K + b * QK;
      for (int k = 0; k < QK; ++k) {
        x[k] = a.x_bf16 ? bf16_to_float(static_cast<const uint16_t*>(a.x)[off + k])
                        : static_cast<const float*>(a.x)[off + k];
      }
      float amax = 0.0f;
      for (int k = 0; k < QK; ++k) amax = std::fmax(amax, std::fabs(x[k]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int32_t sum = 0;
      for (int k = 0; k < QK; ++k) {
        // nearbyint rounds half to even in the default mode, as the SIMD conversion does.
        float r = std::nearbyint(x[k] * id);
        r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
        const int32_t v = r == r ? int32_t(r) : -127;  // NaN: a defined value (the SIMD conversion's), not UB
        a.q[off + k] = int8_t(v);
        sum += v;
      }
      a.d[i * nb + b] = d;
      a.s[i * nb + b] = sum;
    }
  }
}

}  // namespace workbench_cpu
