// The AVX-512 path of the paged attention op, for head_dim a multiple of 16 (else the AVX2 code runs):
// paged_attention.h's arithmetic at 16 lanes where the layout lets each lane do one key's or one d's
// operations in their order, so the same bits as the scalar path.
//
// - Scores of a widened sequence (a prompt or a chunk: WideKeys) come from its keys laid out 16 keys to a
//   vector (the `blocks` layout): one vector holds one d of 16 keys, so the 8 partial sums a[d % 8] of 16
//   keys are 8 vectors and the tree is 7 vector adds, lane by lane. Other tokens' scores (decode) read the
//   cache 8 keys at a time, as the AVX2 path does. Either way up to 3 query heads of the KV group are
//   scored together, each key row loaded once for all of them.
// - The weights' sum stays 8 lanes (lane l adds keys i = l mod 8), as in the AVX2 path.
// - Outputs go 16 of d a vector, for up to 3 query heads at once: they read the same value rows, so each
//   row is loaded (and widened from bfloat16) once for all of them.
#include <immintrin.h>

#include "paged_attention.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")

namespace workbench_cpu {
namespace {

#define WORKBENCH_EXP16
#include "paged_attention_lanes.inc"

constexpr int64_t KEYS = 16;        // keys a vector in the blocks layout
constexpr int HEADS_AT_ONCE = 3;    // query heads per pass over the keys and over the value rows
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

// weights8 at 16 lanes for the max and the exponentials; the sum still adds keys i = l mod 8 in lane l,
// a vector's first 8 keys before its last 8.
inline float weights16(float* e, int64_t L) {
  const int64_t padded = (L + 15) / 16 * 16;
  for (int64_t i = L; i < padded; ++i) e[i] = -__builtin_inff();  // exp gives +0 there, and +0 adds nothing
  __m512 mv = _mm512_set1_ps(-__builtin_inff());
  for (int64_t i = 0; i < padded; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(e + i));
  const __m512 mb = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m256 lanes = _mm256_setzero_ps();
  for (int64_t i = 0; i < padded; i += 16) {
    const __m512 w = exp16(_mm512_sub_ps(_mm512_loadu_ps(e + i), mb));
    _mm512_storeu_ps(e + i, w);
    lanes = _mm256_add_ps(_mm256_add_ps(lanes, _mm512_castps512_ps256(w)), _mm512_extractf32x8_ps(w, 1));
  }
  return tree(lanes);
}

// Scores of HP query heads (queries[h]: D values in fp32) against one key block at kb ([D][16]) into
// out[h]: each key row is loaded once for all the heads (a prompt's keys for one KV head outgrow L1).
template <int HP>
inline void block_scores(const float* const* queries, const float* kb, int64_t D, __m512 scale, float* const* out) {
  __m512 acc[HP][8];
  for (int h = 0; h < HP; ++h)
    for (int l = 0; l < 8; ++l) acc[h][l] = _mm512_setzero_ps();
  for (int64_t d0 = 0; d0 < D; d0 += 8) {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      const __m512 k = _mm512_loadu_ps(kb + (d0 + l) * KEYS);
      for (int h = 0; h < HP; ++h) acc[h][l] = _mm512_fmadd_ps(_mm512_set1_ps(queries[h][d0 + l]), k, acc[h][l]);
    }
  }
  for (int h = 0; h < HP; ++h) _mm512_storeu_ps(out[h], tree16(acc[h], scale));
}

// The scores of HP query heads against the cache's keys at rows (decode: no widened copy), scores8's
// arithmetic for each head, each key chunk loaded (and widened) once for all of them: 8 keys x HP heads
// of accumulators, which AVX-512's 32 vector registers hold.
template <bool KV16, int HP>
void cached_scores(const float* const* queries, const void* k, const int64_t* rows, int64_t L, int64_t D, float scale_f,
                   float* const* e) {
  const __m256 scale = _mm256_set1_ps(scale_f);
  prefetch_first<KV16>(k, rows, L, SCORE_PREFETCH_KEYS, 0, D);
  int64_t i0 = 0;
  for (; i0 + 8 <= L; i0 += 8) {
    __m256 acc[HP][8];
    for (int h = 0; h < HP; ++h)
      for (int r = 0; r < 8; ++r) acc[h][r] = _mm256_setzero_ps();
    for (int64_t r = i0 + SCORE_PREFETCH_KEYS; r < i0 + SCORE_PREFETCH_KEYS + 8 && r < L; ++r)
      prefetch_row<KV16>(k, rows[r], D);
    for (int64_t r = i0 + SCORE_L2_KEYS; r < i0 + SCORE_L2_KEYS + 8 && r < L; ++r)
      prefetch_row<KV16, _MM_HINT_T1>(k, rows[r], D);
    for (int64_t c = 0; c < D; c += 8) {
      __m256 qv[HP];
      for (int h = 0; h < HP; ++h) qv[h] = _mm256_loadu_ps(queries[h] + c);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        const __m256 key = load8<KV16>(k, rows[i0 + r] + c);
        for (int h = 0; h < HP; ++h) acc[h][r] = _mm256_fmadd_ps(qv[h], key, acc[h][r]);
      }
    }
    for (int h = 0; h < HP; ++h) _mm256_storeu_ps(e[h] + i0, _mm256_mul_ps(reduce8(acc[h]), scale));
  }
  if (i0 < L)
    for (int h = 0; h < HP; ++h) scores8<KV16>(queries[h], k, rows + i0, L - i0, D, scale_f, e[h] + i0);
}

// The scores e[h][0 .. L-1] of HP query heads for keys i_first .. i_first + L - 1 of a widened sequence
// (kt: its KV head's blocks). Whole blocks are scored, so e[h][-15 .. -1] and e[h][L .. L + 15] may be
// written too (AttnScratch leaves room): keys outside the token's range, never read.
template <int HP>
void blocked_scores(const float* const* queries, const float* kt, int64_t i_first, int64_t L, int64_t D, float scale_f,
                    float* const* e) {
  const __m512 scale = _mm512_set1_ps(scale_f);
  for (int64_t b = i_first / KEYS; b * KEYS < i_first + L; ++b) {
    float* out[HP];
    for (int h = 0; h < HP; ++h) out[h] = e[h] + b * KEYS - i_first;
    block_scores<HP>(queries, kt + b * D * KEYS, D, scale, out);
  }
}

// Outputs of HP query heads (weights e[h], sums sum[h], output offsets qoff[h]) for d0 .. d0 + 16 NV - 1.
template <bool BF16, bool KV16, int HP, int NV>
void outputs(const AttnArgs& a, const void* v, const int64_t* rows, int64_t L, float* const* e, const float* sum,
             const int64_t* qoff, int64_t d0) {
  __m512 acc[HP][NV];
  for (int h = 0; h < HP; ++h)
    for (int u = 0; u < NV; ++u) acc[h][u] = _mm512_setzero_ps();
  prefetch_first<KV16>(v, rows, L, OUTPUT_PREFETCH_KEYS, d0, 16 * NV);
  for (int64_t i = 0; i < L; ++i) {
    if (i + OUTPUT_PREFETCH_KEYS < L) prefetch_row<KV16>(v, rows[i + OUTPUT_PREFETCH_KEYS] + d0, 16 * NV);
    if (i + OUTPUT_L2_KEYS < L) prefetch_row<KV16, _MM_HINT_T1>(v, rows[i + OUTPUT_L2_KEYS] + d0, 16 * NV);
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
    const float* queries[HEADS_AT_ONCE];
    float sum[HEADS_AT_ONCE];
    int64_t qoff[HEADS_AT_ONCE];
    for (int h = 0; h < heads; ++h) {
      qoff[h] = (t * a.H + g * group + hg0 + h) * D;
      float* query = s.query + h * D;
      for (int64_t c = 0; c < D; c += 8) _mm256_storeu_ps(query + c, load8<BF16>(a.q, qoff[h] + c));
      queries[h] = query;
      e[h] = s.scores + (hg0 + h) * s.stride + KEYS;
    }
    if (kt) {
      switch (heads) {
        case 1: blocked_scores<1>(queries, kt, i_first, L, D, a.scale, e); break;
        case 2: blocked_scores<2>(queries, kt, i_first, L, D, a.scale, e); break;
        default: blocked_scores<3>(queries, kt, i_first, L, D, a.scale, e); break;
      }
    } else {
      switch (heads) {
        case 1: cached_scores<KV16, 1>(queries, k, s.rows, L, D, a.scale, e); break;
        case 2: cached_scores<KV16, 2>(queries, k, s.rows, L, D, a.scale, e); break;
        default: cached_scores<KV16, 3>(queries, k, s.rows, L, D, a.scale, e); break;
      }
    }
    for (int h = 0; h < heads; ++h) sum[h] = weights16(e[h], L);
    switch (heads) {
      case 1: outputs_for<BF16, KV16, 1>(a, v, s.rows, L, e, sum, qoff); break;
      case 2: outputs_for<BF16, KV16, 2>(a, v, s.rows, L, e, sum, qoff); break;
      default: outputs_for<BF16, KV16, 3>(a, v, s.rows, L, e, sum, qoff); break;
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
