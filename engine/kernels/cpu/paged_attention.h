// The contract between the paged attention op (paged_attention.cpp) and its code paths
// (paged_attention_scalar.cpp, paged_attention_avx2.cpp, paged_attention_avx512.cpp).
//
// Plain C++ only, no torch headers, for the reason qgemm.h gives: the SIMD file includes it before its
// `#pragma GCC target`.
//
// Arithmetic every path performs, per query token t and query head h (KV head g = h / (H / Hkv)), all in
// fp32 with every operation rounded once, at position p = positions[t] over keys j = lo .. p of its
// sequence (lo = max(0, p - W + 1) with a sliding window W, else 0), key j at cache slot
// table[j / block_size] * block_size + j % block_size, i = j - lo:
//   score   a[0..7] = +0; for d = 0 .. D-1: a[d % 8] = fma(q[d], k_j[d], a[d % 8])
//           s_i = (((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))) * scale
//   max     m = max over i of s_i (exact: any order gives the same value)
//   weights e_i = exp_f32(s_i - m)                       (exp_f32 below, the same operations everywhere)
//           b[0..7] = +0; for i = 0 .. L-1: b[i % 8] = b[i % 8] + e_i; sum = the tree above over b
//   output  for each d: acc = +0; for i = 0 .. L-1: acc = fma(e_i, v_j[d], acc); out[d] = acc / sum
// and the bfloat16 output is out rounded once (bf16_bits). Nothing here depends on which other tokens are
// in the call, how they are split over threads, or the vector width: the SIMD paths do these very
// operations lane by lane (AVX2: 8 keys' scores at once, 8 of d at once; AVX-512: 16 keys' scores or 16 of
// d at once where the layout allows), so they give the scalar path's bits.
//
// exp_f32(x), for x <= 0 (Cephes' expf): x < EXP_LOW gives +0; else n = nearbyint(x * LOG2E),
//   r = fma(n, -LN2_HI, x); r = fma(n, -LN2_LO, r); p = P0; p = fma(p, r, P1) .. fma(p, r, P5);
//   y = fma(p, r * r, r) + 1; result = y * 2^n (2^n built from its exponent bits, n >= -126).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "qgemm.h"  // bf16_bits, bf16_to_float

namespace workbench_cpu {

constexpr int64_t ATTN_LANES = 8;

constexpr float EXP_LOW = -87.0f;  // exp(-87) ~ 1.6e-38: below it a weight is 0 (and 2^n stays normal)
constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693359375f;
constexpr float LN2_LO = -2.12194440e-4f;
constexpr float EXP_P[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// exp_f32 above, one value at a time (the scalar paths' and the reference for the lanes in exp_lanes.inc).
inline float exp_f32(float x) {
  if (!(x >= EXP_LOW)) return 0.0f;  // NaN too, as the lanes' mask gives it
  const float n = std::nearbyint(x * LOG2E);
  float r = std::fma(n, -LN2_HI, x);
  r = std::fma(n, -LN2_LO, r);
  float p = EXP_P[0];
  for (int c = 1; c < 6; ++c) p = std::fma(p, r, EXP_P[c]);
  const float y = std::fma(p, r * r, r) + 1.0f;
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}

struct AttnArgs {
  const void* q;              // [N, H, D] float32 or bfloat16 (bits as uint16), contiguous
  const void* k;              // [slots, Hkv, D] the same dtype, contiguous
  const void* v;
  bool bf16;
  int64_t N, H, Hkv, D;
  const int64_t* tables;      // [B, table_width] block ids
  int64_t table_width;
  const int64_t* sequence;    // [N] row of `tables` of each token
  const int64_t* positions;   // [N]
  int64_t block_size;
  int64_t window;             // 0: none
  float scale;
  void* out;                  // [N, H, D] q's dtype
};

// A bfloat16 cache's keys and values widened to fp32 (exact) once per call for the sequences with many
// query tokens in it (a prompt or a chunk): every (token, KV head) item of such a sequence then reads fp32
// rows instead of widening the same keys again, per query head and per token. The same values in the
// same order, so the same bits; the SIMD paths use it, the scalar path reads the cache.
struct WideKeys {
  const float* keys = nullptr;    // AVX2: [span][Hkv][D]; AVX-512: per sequence [Hkv][blocks][D][16], a
                                  // vector holding one d of 16 consecutive keys (+0 past the span)
  const float* values = nullptr;  // [span][Hkv][D] at the same offsets (AVX-512: blocks * 16 rows a sequence)
  const int64_t* base = nullptr;  // [B] element offset of the sequence's first widened key, -1: not widened
  const int64_t* first = nullptr; // [B] the position of that key
  const int64_t* blocks = nullptr;  // [B] AVX-512: the sequence's 16-key blocks; null on AVX2
};

// Per-thread scratch an item needs: scores for every head of a KV group, and the keys' row offsets.
struct AttnScratch {
  float* scores;              // [H / Hkv][stride]: a head's scores from its row's 16th float (room before
                              // and after for whole 16-key blocks; the 8-lane paths start at the row)
  int64_t* rows;              // [max_keys] element offset of each key's row (slot * Hkv * D)
  int64_t stride;             // scores per head
  float* query;               // [H / Hkv][D] the query heads of the item in fp32
  WideKeys wide;              // shared by the threads, read only
};

// Fills rows[0 .. L-1] with the element offset of KV head g's row of each key token t attends, in key
// order; returns L.
inline int64_t key_rows(const AttnArgs& a, int64_t t, int64_t g, int64_t* rows) {
  const int64_t p = a.positions[t];
  const int64_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  const int64_t* table = a.tables + a.sequence[t] * a.table_width;
  int64_t block = lo / a.block_size, offset = lo % a.block_size;  // stepped, not divided, key by key
  for (int64_t j = lo; j <= p; ++j) {
    rows[j - lo] = ((table[block] * a.block_size + offset) * a.Hkv + g) * a.D;
    if (++offset == a.block_size) offset = 0, ++block;
  }
  return p - lo + 1;
}

// The same for the widened keys of token t's sequence (wide.base of it not -1).
inline int64_t wide_key_rows(const AttnArgs& a, const WideKeys& wide, int64_t t, int64_t g, int64_t* rows) {
  const int64_t p = a.positions[t], b = a.sequence[t];
  const int64_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  for (int64_t j = lo; j <= p; ++j) rows[j - lo] = wide.base[b] + ((j - wide.first[b]) * a.Hkv + g) * a.D;
  return p - lo + 1;
}

// Item = (token t, KV head g): the query heads of g at token t.
void attend_scalar(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s);
void attend_avx2(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s);
void attend_avx512(const AttnArgs& a, int64_t t, int64_t g, const AttnScratch& s);  // head_dim % 16 == 0
// Keys first .. last of sequence b, every KV head, from the bfloat16 caches into keys and values
// ([last - first + 1][Hkv][D] each).
void widen_keys_avx2(const AttnArgs& a, int64_t b, int64_t first, int64_t last, float* keys, float* values);
// Keys j0 .. j1 of sequence b, whose widened span starts at key `first`, into its blocks layout (keys, of
// `blocks` blocks) and its value rows (values), both at the sequence's base.
void widen_keys_avx512(const AttnArgs& a, int64_t b, int64_t first, int64_t j0, int64_t j1, int64_t blocks,
                       float* keys, float* values);

}  // namespace workbench_cpu
