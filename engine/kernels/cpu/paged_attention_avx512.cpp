// The AVX-512 path of the paged attention op, for head_dim a multiple of 16 (else the AVX2 code runs):
// paged_attention.h's arithmetic at 16 lanes where the layout lets each lane do one key's or one d's
// operations in their order, so the same bits as the scalar path.
//
// - Scores of a widened sequence (a prompt or a chunk: WideKeys) come from its keys laid out 16 keys to a
//   vector (the `blocks` layout): one vector holds one d of 16 keys, so the 8 partial sums a[d % 8] of 16
//   keys are 8 vectors and the tree is 7 vector adds, lane by lane; two key blocks share each broadcast of
//   q[d]. Other tokens' scores (decode) read the cache 8 keys at a time, as the AVX2 path does.
// - The weights' sum stays 8 lanes (lane l adds keys i = l mod 8), shared with the AVX2 path.
// - Outputs go 16 of d a vector, for up to 4 query heads of the KV group at once: they read the same value
//   rows, so each row is loaded (and widened from bfloat16) once for all of them.
#include <immintrin.h>

#include "paged_attention.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")

namespace workbench_cpu {
namespace {

#include "paged_attention_lanes.inc"

constexpr int64_t KEYS = 16;        // keys a vector in the blocks layout
constexpr int HEADS_AT_ONCE = 4;    // query heads per pass over the value rows
constexpr int OUT_VECTORS = 4;      // output vectors per head and pass: 64 of d

template <bool KV16>
inline __m512 load16(const void* base, int64_t i) {
  if constexpr (KV16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
  }
}

// bf16_bits lane by lane (round to nearest even, a NaN made quiet), in integer operations.
inline __m256i bf16_bits16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));  // each lane below 2^16
}

// s = tree(a) * scale, lane by lane.
inline __m512 tree16(const __m512 a[8], __m512 scale) {
  const __m512 lo = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
  const __m512 hi = _mm512_add_ps(_mm512_add_ps(a[4], a[5]), _mm512_add_ps(a[6], a[7]));
  return _mm512_mul_ps(_mm512_add_ps(lo, hi), scale);
}

// Scores of NB consecutive key blocks at kb (each [D][16]) into out, out + 16, ...
template <int NB>
inline void block_scores(const float* query, const float* kb, int64_t D, __m512 scale, float* out) {
  __m512 acc[NB][8];
  for (int n = 0; n < NB; ++n)
    for (int l = 0; l < 8; ++l) acc[n][l] = _mm512_setzero_ps();
  for (int64_t d0 = 0; d0 < D; d0 += 8) {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      const __m512 qd = _mm512_set1_ps(query[d0 + l]);
      for (int n = 0; n < NB; ++n)
        acc[n][l] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(kb + (n * D + d0 + l) * KEYS), acc[n][l]);
    }
  }
  for (int n = 0; n < NB; ++n) _mm512_storeu_ps(out + n * KEYS, tree16(acc[n], scale));
}

// One query head's scores e[0 .. L-1] of keys i_first .. i_first + L - 1 of a widened sequence (kt: its
// KV head's blocks). Whole blocks are scored, so e[-15 .. -1] and e[L .. L + 15] may be written too
// (AttnScratch leaves room): keys outside the token's range, never read.
inline void blocked_scores(const float* query, const float* kt, int64_t i_first, int64_t L, int64_t D, float scale_f,
                           float* e) {
  const __m512 scale = _mm512_set1_ps(scale_f);
  const int64_t b1 = (i_first + L - 1) / KEYS + 1;
  int64_t b = i_first / KEYS;
  for (; b + 2 <= b1; b += 2) block_scores<2>(query, kt + b * D * KEYS, D, scale, e + b * KEYS - i_first);
  if (b < b1) block_scores<1>(query, kt + b * D * KEYS, D, scale, e + b * KEYS - i_first);
}

// Outputs of HP query heads (weights e[h], sums sum[h], output offsets qoff[h]) for d0 .. d0 + 16 NV - 1.
template <bool BF16, bool KV16, int HP, int NV>
void outputs(const AttnArgs& a, const void* v, const int64_t* rows, int64_t L, float* const* e, const float* sum,
             const int64_t* qoff, int64_t d0) {
  __m512 acc[HP][NV];
  for (int h = 0; h < HP; ++h)
    for (int u = 0; u < NV; ++u) acc[h][u] = _mm512_setzero_ps();
  for (int64_t i = 0; i < L; ++i) {
    __m512 value[NV];
    for (int u = 0; u < NV; ++u) value[u] = load16<KV16>(v, rows[i] + d0 + 16 * u);
    for (int h = 0; h < HP; ++h) {
      const __m512 w = _mm512_set1_ps(e[h][i]);
      for (int u = 0; u < NV; ++u) acc[h][u] = _mm512_fmadd_ps(w, value[u], acc[h][u]);
    }
  }
  for (int h = 0; h < HP; ++h) {
    const __m512 total = _mm512_set1_ps(sum[h]);
    for (int u = 0; u < NV; ++u) {
      const __m512 o = _mm512_div_ps(acc[h][u], total);
      const int64_t off = qoff[h] + d0 + 16 * u;
      if constexpr (BF16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(a.out) + off), bf16_bits16(o));
      else _mm512_storeu_ps(static_cast<float*>(a.out) + off, o);
    }
  }
}

template <bool BF16, bool KV16, int HP>
void outputs_for(const AttnArgs& a, const void* v, const int64_t* rows, int64_t L, float* const* e, const float* sum,
                 const int64_t* qoff) {
  for (int64_t d0 = 0; d0 < a.D; d0 += 16 * OUT_VECTORS) {
    switch ((a.D - d0) / 16 < OUT_VECTORS ? (a.D - d0) / 16 : OUT_VECTORS) {
      case 1: outputs<BF16, KV16, HP, 1>(a, v, rows, L, e, sum, qoff, d0); break;
      case 2: outputs<BF16, KV16, HP, 2>(a, v, rows, L, e, sum, qoff, d0); break;
      case 3: outputs<BF16, KV16, HP, 3>(a, v, rows, L, e, sum, qoff, d0); break;
      default: outputs<BF16, KV16, HP, 4>(a, v, rows, L, e, sum, qoff, d0); break;
    }
  }
}

// BF16: q and out in bfloat16; KV16: the cache (keys and values at s.rows) in bfloat16; kt: the token's
// widened KV head's key blocks (then values are the widened fp32 rows at s.rows), or null.
template <bool BF16, bool KV16>
void attend(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s, const float* kt, int64_t i_first,
            const void* k, const void* v, int64_t L) {
  const int64_t group = a.H / a.Hkv, D = a.D;
  for (int64_t hg0 = 0; hg0 < group; hg0 += HEADS_AT_ONCE) {
    const int heads = group - hg0 < HEADS_AT_ONCE ? int(group - hg0) : HEADS_AT_ONCE;
    float* e[HEADS_AT_ONCE];
    float sum[HEADS_AT_ONCE];
    int64_t qoff[HEADS_AT_ONCE];
    for (int h = 0; h < heads; ++h) {
      qoff[h] = (t * a.H + g * group + hg0 + h) * D;
      for (int64_t c = 0; c < D; c += 8) _mm256_storeu_ps(s.query + c, load8<BF16>(a.q, qoff[h] + c));
      e[h] = s.scores + (hg0 + h) * s.stride + KEYS;
      if (kt) blocked_scores(s.query, kt, i_first, L, D, a.scale, e[h]);
      else scores8<KV16>(s.query, k, s.rows, L, D, a.scale, e[h]);
      sum[h] = weights8(e[h], L);
    }
    switch (heads) {
      case 1: outputs_for<BF16, KV16, 1>(a, v, s.rows, L, e, sum, qoff); break;
      case 2: outputs_for<BF16, KV16, 2>(a, v, s.rows, L, e, sum, qoff); break;
      case 3: outputs_for<BF16, KV16, 3>(a, v, s.rows, L, e, sum, qoff); break;
      default: outputs_for<BF16, KV16, 4>(a, v, s.rows, L, e, sum, qoff); break;
    }
  }
}

}  // namespace

void attend_avx512(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s) {
  if (!a.bf16) return attend<false, false>(a, t, g, s, nullptr, 0, a.k, a.v, key_rows(a, t, g, s.rows));
  const int64_t b = a.sequence[t];
  if (s.wide.base && s.wide.base[b] >= 0) {
    const int64_t L = wide_key_rows(a, s.wide, t, g, s.rows), i_first = a.positions[t] - L + 1 - s.wide.first[b];
    const float* kt = s.wide.keys + s.wide.base[b] + g * s.wide.blocks[b] * KEYS * a.D;
    return attend<true, false>(a, t, g, s, kt, i_first, nullptr, s.wide.values, L);
  }
  attend<true, true>(a, t, g, s, nullptr, 0, a.k, a.v, key_rows(a, t, g, s.rows));
}

void widen_keys_avx512(const AttnArgs& a, int64_t b, int64_t first, int64_t j0, int64_t j1, int64_t blocks,
                       float* keys, float* values) {
  const int64_t* table = a.tables + b * a.table_width;
  const int64_t row = a.Hkv * a.D;  // every KV head of one slot, contiguous in the cache
  for (int64_t j = j0; j <= j1; ++j) {
    const int64_t slot = table[j / a.block_size] * a.block_size + j % a.block_size, i = j - first;
    const uint16_t* k = static_cast<const uint16_t*>(a.k) + slot * row;
    for (int64_t g = 0; g < a.Hkv; ++g) {
      float* to = keys + ((g * blocks + i / KEYS) * a.D) * KEYS + i % KEYS;
      for (int64_t d = 0; d < a.D; ++d) to[d * KEYS] = bf16_to_float(k[g * a.D + d]);
    }
    for (int64_t e = 0; e < row; e += 8) _mm256_storeu_ps(values + i * row + e, load8<true>(a.v, slot * row + e));
  }
}

}  // namespace workbench_cpu

#pragma GCC pop_options
