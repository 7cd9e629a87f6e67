// The reference path of the paged attention op: plain C++ for any CPU and any head_dim, one value at a
// time in the order paged_attention.h defines. The AVX2 path must match it bit for bit
// (tests/kernels/test_cpu_paged_attention.py).
#include <cmath>
#include <cstring>

#include "paged_attention.h"

namespace workbench_cpu {
namespace {

float tree(const float l[ATTN_LANES]) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

float load(const AttnArgs& a, const void* base, int64_t i) {
  return a.bf16 ? bf16_to_float(static_cast<const uint16_t*>(base)[i]) : static_cast<const float*>(base)[i];
}

}  // namespace

void attend_scalar(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s) {
  const int64_t L = key_rows(a, t, g, s.rows), group = a.H / a.Hkv;
  for (int64_t hg = 0; hg < group; ++hg) {
    const int64_t h = g * group + hg, qoff = (t * a.H + h) * a.D;
    float* e = s.scores + hg * s.stride;
    for (int64_t i = 0; i < L; ++i) {
      float acc[ATTN_LANES] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      for (int64_t d = 0; d < a.D; ++d)
        acc[d % ATTN_LANES] = std::fma(load(a, a.q, qoff + d), load(a, a.k, s.rows[i] + d), acc[d % ATTN_LANES]);
      e[i] = tree(acc) * a.scale;
    }
    float m = e[0];
    for (int64_t i = 1; i < L; ++i) m = e[i] > m ? e[i] : m;
    float lanes[ATTN_LANES] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = 0; i < L; ++i) {
      e[i] = exp_f32(e[i] - m);
      lanes[i % ATTN_LANES] = lanes[i % ATTN_LANES] + e[i];
    }
    const float sum = tree(lanes);
    for (int64_t d = 0; d < a.D; ++d) {
      float acc = 0.0f;
      for (int64_t i = 0; i < L; ++i) acc = std::fma(e[i], load(a, a.v, s.rows[i] + d), acc);
      const float o = acc / sum;
      if (a.bf16) static_cast<uint16_t*>(a.out)[qoff + d] = bf16_bits(o);
      else static_cast<float*>(a.out)[qoff + d] = o;
    }
  }
}

}  // namespace workbench_cpu
