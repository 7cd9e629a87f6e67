// The AVX2 path (with FMA) of the paged attention op, for head_dim a multiple of 8: the arithmetic of
// paged_attention.h with 8 lanes a vector. Scores go 8 keys at a time (one accumulator vector per key,
// lane l summing d = l, l + 8, ..., then a transposing reduction that adds each key's lanes in the tree's
// order); the softmax weights 8 keys at a time (lane l sums keys i = l mod 8); the output 8 of d at a time.
#include <immintrin.h>

#include "paged_attention.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace workbench_cpu {
namespace {

#include "paged_attention_lanes.inc"

constexpr int64_t OUT_VECTORS = 8;  // output accumulators per pass over the keys: 64 of d

// BF16: q and out in bfloat16; KV16: the keys and values read (k, v at s.rows) in bfloat16, else fp32.
template <bool BF16, bool KV16>
void attend(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s, const void* k, const void* v, int64_t L) {
  const int64_t group = a.H / a.Hkv, D = a.D, chunks = D / 8;
  for (int64_t hg = 0; hg < group; ++hg) {
    const int64_t h = g * group + hg, qoff = (t * a.H + h) * D;
    for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(s.query + 8 * c, load8<BF16>(a.q, qoff + 8 * c));
    float* e = s.scores + hg * s.stride;
    scores8<KV16>(s.query, k, s.rows, L, D, a.scale, e);
    const __m256 sum = _mm256_set1_ps(weights8(e, L));
    for (int64_t c0 = 0; c0 < chunks; c0 += OUT_VECTORS) {
      const int64_t nv = chunks - c0 < OUT_VECTORS ? chunks - c0 : OUT_VECTORS;
      __m256 acc[OUT_VECTORS];
      for (int u = 0; u < OUT_VECTORS; ++u) acc[u] = _mm256_setzero_ps();
      if (nv == OUT_VECTORS) {
        prefetch_first<KV16>(v, s.rows, L, OUTPUT_PREFETCH_KEYS, 8 * c0, 8 * OUT_VECTORS);
        for (int64_t i = 0; i < L; ++i) {
          if (i + OUTPUT_PREFETCH_KEYS < L)
            prefetch_row<KV16>(v, s.rows[i + OUTPUT_PREFETCH_KEYS] + 8 * c0, 8 * OUT_VECTORS);
          if (i + OUTPUT_L2_KEYS < L)
            prefetch_row<KV16, _MM_HINT_T1>(v, s.rows[i + OUTPUT_L2_KEYS] + 8 * c0, 8 * OUT_VECTORS);
          const __m256 w = _mm256_broadcast_ss(e + i);
          const int64_t row = s.rows[i] + 8 * c0;
#pragma GCC unroll 8
          for (int u = 0; u < OUT_VECTORS; ++u) acc[u] = _mm256_fmadd_ps(w, load8<KV16>(v, row + 8 * u), acc[u]);
        }
      } else {
        for (int64_t i = 0; i < L; ++i) {
          const __m256 w = _mm256_broadcast_ss(e + i);
          const int64_t row = s.rows[i] + 8 * c0;
          for (int u = 0; u < nv; ++u) acc[u] = _mm256_fmadd_ps(w, load8<KV16>(v, row + 8 * u), acc[u]);
        }
      }
      for (int u = 0; u < nv; ++u) {
        const __m256 o = _mm256_div_ps(acc[u], sum);
        const int64_t off = qoff + 8 * (c0 + u);
        if constexpr (BF16) {
          alignas(32) float t8[8];
          _mm256_store_ps(t8, o);
          for (int l = 0; l < 8; ++l) static_cast<uint16_t*>(a.out)[off + l] = bf16_bits(t8[l]);
        } else {
          _mm256_storeu_ps(static_cast<float*>(a.out) + off, o);
        }
      }
    }
  }
}

}  // namespace

void attend_avx2(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s) {
  if (!a.bf16) return attend<false, false>(a, t, g, s, a.k, a.v, key_rows(a, t, g, s.rows));
  if (s.wide.base && s.wide.base[a.sequence[t]] >= 0)
    return attend<true, false>(a, t, g, s, s.wide.keys, s.wide.values, wide_key_rows(a, s.wide, t, g, s.rows));
  attend<true, true>(a, t, g, s, a.k, a.v, key_rows(a, t, g, s.rows));
}

void widen_keys_avx2(const AttnArgs& a, int64_t b, int64_t first, int64_t last, float* keys, float* values) {
  const int64_t* table = a.tables + b * a.table_width;
  const int64_t row = a.Hkv * a.D;  // every KV head of one slot, contiguous in the cache
  for (int64_t j = first; j <= last; ++j) {
    const int64_t slot = table[j / a.block_size] * a.block_size + j % a.block_size, out = (j - first) * row;
    for (int64_t e = 0; e < row; e += 8) {
      _mm256_storeu_ps(keys + out + e, load8<true>(a.k, slot * row + e));
      _mm256_storeu_ps(values + out + e, load8<true>(a.v, slot * row + e));
    }
  }
}

}  // namespace workbench_cpu

#pragma GCC pop_options
