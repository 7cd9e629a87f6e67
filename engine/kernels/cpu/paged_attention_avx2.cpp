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

template <bool BF16>
inline __m256 load8(const void* base, int64_t i) {
  if constexpr (BF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  }
}

// v[r] holds key r's eight lane sums; lane r of the result is ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
// of key r: hadd adds neighbours, twice, and the last add joins the halves (d % 8 < 4 with d % 8 >= 4).
inline __m256 reduce8(const __m256 v[8]) {
  const __m256 lo = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 hi = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

inline __m256 exp8(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LOW), _CMP_GE_OQ);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
  __m256 p = _mm256_set1_ps(EXP_P[0]);
  for (int c = 1; c < 6; ++c) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P[c]));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // n < -126 only where x < EXP_LOW, which the mask zeroes: the bits are never used there.
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(bits)), keep);
}

inline float tree(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

constexpr int64_t OUT_VECTORS = 8;  // output accumulators per pass over the keys: 64 of d

// BF16: q and out in bfloat16; KV16: the keys and values read (k, v at s.rows) in bfloat16, else fp32.
template <bool BF16, bool KV16>
void attend(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s, const void* k, const void* v, int64_t L) {
  const int64_t group = a.H / a.Hkv, D = a.D, chunks = D / 8;
  const int64_t padded = (L + 7) / 8 * 8;
  for (int64_t hg = 0; hg < group; ++hg) {
    const int64_t h = g * group + hg, qoff = (t * a.H + h) * D;
    for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(s.query + 8 * c, load8<BF16>(a.q, qoff + 8 * c));
    float* e = s.scores + hg * s.stride;
    const __m256 scale = _mm256_set1_ps(a.scale);
    for (int64_t i0 = 0; i0 < L; i0 += 8) {
      const int keys = L - i0 < 8 ? int(L - i0) : 8;
      __m256 acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
      if (keys == 8) {
        for (int64_t c = 0; c < chunks; ++c) {
          const __m256 qv = _mm256_loadu_ps(s.query + 8 * c);
#pragma GCC unroll 8
          for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qv, load8<KV16>(k, s.rows[i0 + r] + 8 * c), acc[r]);
        }
      } else {
        for (int64_t c = 0; c < chunks; ++c) {
          const __m256 qv = _mm256_loadu_ps(s.query + 8 * c);
          for (int r = 0; r < keys; ++r) acc[r] = _mm256_fmadd_ps(qv, load8<KV16>(k, s.rows[i0 + r] + 8 * c), acc[r]);
        }
      }
      _mm256_storeu_ps(e + i0, _mm256_mul_ps(reduce8(acc), scale));
    }
    for (int64_t i = L; i < padded; ++i) e[i] = -__builtin_inff();  // exp gives +0 there, and +0 adds nothing
    __m256 mv = _mm256_set1_ps(-__builtin_inff());
    for (int64_t i = 0; i < padded; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(e + i));
    alignas(32) float ml[8];
    _mm256_store_ps(ml, mv);
    float m = ml[0];
    for (int r = 1; r < 8; ++r) m = ml[r] > m ? ml[r] : m;
    const __m256 mb = _mm256_set1_ps(m);
    __m256 lanes = _mm256_setzero_ps();
    for (int64_t i = 0; i < padded; i += 8) {
      const __m256 w = exp8(_mm256_sub_ps(_mm256_loadu_ps(e + i), mb));
      _mm256_storeu_ps(e + i, w);
      lanes = _mm256_add_ps(lanes, w);
    }
    const __m256 sum = _mm256_set1_ps(tree(lanes));
    for (int64_t c0 = 0; c0 < chunks; c0 += OUT_VECTORS) {
      const int64_t nv = chunks - c0 < OUT_VECTORS ? chunks - c0 : OUT_VECTORS;
      __m256 acc[OUT_VECTORS];
      for (int u = 0; u < OUT_VECTORS; ++u) acc[u] = _mm256_setzero_ps();
      if (nv == OUT_VECTORS) {
        for (int64_t i = 0; i < L; ++i) {
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
