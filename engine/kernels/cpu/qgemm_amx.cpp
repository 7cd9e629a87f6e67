// The AMX-INT8 path: each block's integer sums for 16 rows and 16 columns at once on the tile unit, the
// fp32 epilogue in AVX-512 registers, the same arithmetic as every other path (qgemm.h), so the same bits.
//
// Why it gives the same bits: a block's isum is an exact int32 sum whatever computes it (a tile's dot
// product, vpdpbusd, a scalar loop), and the epilogue is the same elementwise fp32 operations, in block
// order, as qgemm_tile.inc's, at 16 lanes instead of 8. So rows may go through the tiles or through the
// VNNI code without a bit changing: full 16-row tiles take the tile unit, the rows after the last full
// tile the AVX-512 path (a call with fewer than 16 rows, as a small decode batch, never comes here:
// ops.cpp sends it to the AVX-512 path).
//
// Layout: a weight tile is 8 rows of 64 bytes, row j holding quad j (k = 4j .. 4j + 3) of 16 columns,
// 4 bytes each: exactly two packed groups' quad j side by side, so two groups' blocks are copied (and
// the nibble types' quants unpacked to bytes) into a per-thread buffer once per column pair, then reused by
// every row tile. The activations' tile reads the quantized rows in place (stride K).
//
// Signs: the activations are signed; nibble and Q5_K quants are unsigned (tdpbsud), Q8_0 and Q6_K signed
// (tdpbssd), so no bias correction is needed. Q6_K's two halves are summed apart (two half-depth tiles),
// as its two integer sub-scales need.
//
// Compiled everywhere, run only where the CPU reports AMX-TILE and AMX-INT8 and the kernel granted this
// process the tile state (dispatch.h asks for it).
#include <immintrin.h>

#include <vector>

#include "qgemm.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")

namespace workbench_cpu {
namespace {

struct Isa {  // qgemm_tile.inc asks for one; only its scale loads and stores are used here
  static constexpr int MAX_ROWS = 8;
  static constexpr bool BIAS_Q8 = true;
  static __m256i dot(__m256i acc, __m256i w, __m256i a) { return _mm256_dpbusd_epi32(acc, w, a); }
};

#include "qgemm_tile.inc"

constexpr int64_t TILE_ROWS = AMX_TILE_ROWS, PAIR_COLUMNS = 2 * GROUP, WEIGHT_TILE_BYTES = 8 * 64;

// Tile registers: 0 activations (16 rows x 32 k), 1 weights (8 quads x 16 columns x 4), 2 and 6 sums (16 x
// 16 int32: two slots, so one block's sums are computed while the previous block's epilogue runs); for
// Q6_K's halves: 3 activations (16 x 16 k), 4 weights (4 quads), 5 and 7 the second half's sums.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {32, 64, 64, 16, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 8, 16, 16, 4, 16, 16, 16};
};

// Both groups' block b as one weight tile (row j: group g's quad j, then group g + 1's), at out. A pair
// whose second group is past N gets zeros there (its d and m are never read).
template <int QT>
void unpack_block(const uint8_t* first, const uint8_t* second, uint8_t* out) {
  const uint8_t* src[2] = {first + quants_offset(QT), second ? second + quants_offset(QT) : nullptr};
  for (int h = 0; h < 2; ++h) {
    uint8_t* dst = out + 32 * h;
    if (!src[h]) {
      for (int j = 0; j < 8; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * j), _mm256_setzero_si256());
    } else if constexpr (nibbles(QT)) {  // bytes 4j .. 4j + 3 of each column: quad j low, quad j + 4 high
      const __m256i m4 = _mm256_set1_epi8(0x0f);
      for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[h] + 32 * j));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * j), _mm256_and_si256(v, m4));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * (j + 4)),
                            _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
      }
    } else {
      for (int j = 0; j < 8; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * j),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[h] + 32 * j)));
    }
  }
}

// 16 columns' scales (or offsets) at byte offset `at` of both groups' block, zeros for an absent second.
template <int QT>
inline __m512 pair_scales(const uint8_t* first, const uint8_t* second, int64_t at) {
  const __m256 hi = second ? load_scales<QT>(second + at) : _mm256_setzero_ps();
  return _mm512_insertf32x8(_mm512_castps256_ps512(load_scales<QT>(first + at)), hi, 1);
}

// Q6_K's integer sub-scales c_h of 16 columns, widened to int32.
inline __m512i pair_subscales(const uint8_t* first, const uint8_t* second, int h) {
  int64_t lo, hi = 0;
  __builtin_memcpy(&lo, first + 16 + 8 * h, 8);
  if (second) __builtin_memcpy(&hi, second + 16 + 8 * h, 8);
  return _mm512_cvtepi8_epi32(_mm_set_epi64x(hi, lo));
}

// The sums of block b for rows i0 .. i0 + 15 into sums (and, for Q6_K, second), 16 int32 a row, in tile
// slot 0 (registers 2 and 5) or slot 1 (6 and 7). GCC's tile intrinsics paste their register numbers into
// the assembly text, so a slot's registers must be literals: a macro writes one function per slot.
#define WORKBENCH_TILE_SUMS(NAME, SUMS, SECOND)                                                                 \
  template <int QT>                                                                                           \
  inline void NAME(const GemmArgs& a, const uint8_t* weights, int64_t i0, int64_t b, int32_t* sums,         \
                   int32_t* second) {                                                                         \
    const int8_t* rows = a.q + i0 * a.K + b * QK;                                                             \
    _tile_zero(SUMS);                                                                                         \
    if constexpr (QT == Q6_K) {                                                                               \
      _tile_zero(SECOND);                                                                                     \
      _tile_loadd(3, rows, a.K);                                                                              \
      _tile_loadd(4, weights, 64);                                                                            \
      _tile_dpbssd(SUMS, 3, 4);                                                                               \
      _tile_loadd(3, rows + 16, a.K);                                                                         \
      _tile_loadd(4, weights + 4 * 64, 64);                                                                   \
      _tile_dpbssd(SECOND, 3, 4);                                                                             \
      _tile_stored(SECOND, second, 64);                                                                       \
    } else {                                                                                                  \
      _tile_loadd(0, rows, a.K);                                                                              \
      _tile_loadd(1, weights, 64);                                                                            \
      if constexpr (QT == Q8_0) _tile_dpbssd(SUMS, 0, 1);                                                     \
      else _tile_dpbsud(SUMS, 0, 1);                                                                          \
    }                                                                                                         \
    _tile_stored(SUMS, sums, 64);                                                                             \
  }
WORKBENCH_TILE_SUMS(tile_sums_slot0, 2, 5)
WORKBENCH_TILE_SUMS(tile_sums_slot1, 6, 7)
#undef WORKBENCH_TILE_SUMS

// acc[r] += block b's contribution for row i0 + r: qgemm_tile.inc's block_step epilogue at 16 lanes.
template <int QT>
__attribute__((always_inline)) inline void epilogue(const GemmArgs& a, const uint8_t* first, const uint8_t* second, int64_t i0, int64_t b,
                     const int32_t* sums, const int32_t* second_sums, const float* block_sums, __m512 acc[TILE_ROWS]) {
  const int64_t nb = a.K / QK;
  const __m512 dw = pair_scales<QT>(first, second, 0);
  const __m512 mw = has_min(QT) ? pair_scales<QT>(first, second, min_offset(QT)) : _mm512_setzero_ps();
  __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
  if constexpr (QT == Q6_K) c0 = pair_subscales(first, second, 0), c1 = pair_subscales(first, second, 1);
#pragma GCC unroll 16
  for (int r = 0; r < TILE_ROWS; ++r) {
    const float da = a.d[(i0 + r) * nb + b];
    const int32_t sa = a.s[(i0 + r) * nb + b];
    __m512i isum = _mm512_loadu_si512(sums + 16 * r);
    if constexpr (QT == Q6_K)
      isum = _mm512_add_epi32(_mm512_mullo_epi32(isum, c0), _mm512_mullo_epi32(_mm512_loadu_si512(second_sums + 16 * r), c1));
    if constexpr (QT == Q4_0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(8 * sa));
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(da));
    acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[r]);
    if constexpr (has_min(QT))
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(mw, _mm512_set1_ps(da)), _mm512_set1_ps(block_sums[(i0 + r) * nb + b]), acc[r]);
  }
}

inline void prefetch(const uint8_t* bytes, int64_t count) {
  for (int64_t at = 0; at < count; at += 64) _mm_prefetch(reinterpret_cast<const char*>(bytes + at), _MM_HINT_T0);
}

// Rows i .. M - 1 of groups g .. g_end - 1 on the AVX-512 VNNI path, right after the unpacking read the
// same packed weights (so they come from the cache).
inline void avx512_rows(const GemmArgs& a, int64_t i, int64_t g, int64_t g_end) {
  if (i == a.M) return;
  const int64_t nb = a.K / QK;
  GemmArgs rest = a;
  rest.q += i * a.K, rest.d += i * nb, rest.s += i * nb, rest.M = a.M - i;
  if (a.out_f32) rest.out_f32 += i * a.N;
  else rest.out_bf16 += i * a.N;
  gemm_avx512(rest, g, g_end);
}

// Output groups g and g + 1 (when g + 1 < g_end) for all rows (at least one full tile of them: ops.cpp).
template <int QT>
void pair(const GemmArgs& a, int64_t g, int64_t g_end, uint8_t* unpacked, const float* block_sums) {
  const int64_t nb = a.K / QK, gb = group_bytes(QT);
  const uint8_t* first = a.w + g * nb * gb;
  const uint8_t* second = g + 1 < g_end ? first + nb * gb : nullptr;
  const int64_t full_rows = a.M / TILE_ROWS * TILE_ROWS;
  // The next pair's groups (contiguous; one where this share ends on an odd group), fetched during this
  // pair's first row tile: unpacking them would otherwise wait on memory at every block.
  const uint8_t* next = g + 2 < g_end ? first + 2 * nb * gb : nullptr;
  const int64_t next_groups = g + 3 < g_end ? 2 : 1;
  for (int64_t b = 0; b < nb; ++b)
    unpack_block<QT>(first + b * gb, second ? second + b * gb : nullptr, unpacked + b * WEIGHT_TILE_BYTES);
  // Two slots of sums: the next block's tile work (in this row tile, or the next tile's first block) is
  // issued before this block's epilogue, which reads the other slot, so the tile unit's latency hides
  // behind the vector work instead of stalling it every block. `step` counts blocks over all row tiles:
  // its parity is the slot.
  alignas(64) int32_t sums[2][TILE_ROWS * PAIR_COLUMNS], second_sums[2][TILE_ROWS * PAIR_COLUMNS];
  const auto issue = [&](int64_t i0, int64_t b, int64_t step) {
    if (step & 1) tile_sums_slot1<QT>(a, unpacked + b * WEIGHT_TILE_BYTES, i0, b, sums[1], second_sums[1]);
    else tile_sums_slot0<QT>(a, unpacked + b * WEIGHT_TILE_BYTES, i0, b, sums[0], second_sums[0]);
  };
  int64_t step = 0;
  if (full_rows) issue(0, 0, 0);
  for (int64_t i0 = 0; i0 < full_rows; i0 += TILE_ROWS) {
    __m512 acc[TILE_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < TILE_ROWS; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, ++step) {
      if (i0 == 0 && next) prefetch(next + next_groups * b * gb, next_groups * gb);  // a block's share of them
      if (b + 1 < nb) issue(i0, b + 1, step + 1);
      else if (i0 + TILE_ROWS < full_rows) issue(i0 + TILE_ROWS, 0, step + 1);
      epilogue<QT>(a, first + b * gb, second ? second + b * gb : nullptr, i0, b, sums[step & 1],
                   second_sums[step & 1], block_sums, acc);
    }
#pragma GCC unroll 16
    for (int r = 0; r < TILE_ROWS; ++r) {
      store(a, i0 + r, g, _mm512_castps512_ps256(acc[r]));
      if (second) store(a, i0 + r, g + 1, _mm512_extractf32x8_ps(acc[r], 1));
    }
  }
  avx512_rows(a, full_rows, g, second ? g + 2 : g + 1);
}

template <int QT>
void pairs(const GemmArgs& a, int64_t g0, int64_t g1) {
  static thread_local std::vector<uint8_t> unpacked;
  static thread_local std::vector<float> block_sums;  // float(s_a), converted once, broadcast from memory
  unpacked.resize(a.K / QK * WEIGHT_TILE_BYTES);
  if constexpr (has_min(QT)) {
    block_sums.resize(a.M * (a.K / QK));
    for (size_t i = 0; i < block_sums.size(); ++i) block_sums[i] = float(a.s[i]);
  }
  const TileConfig config;
  _tile_loadconfig(&config);
  // Plain pointers from here on: reaching a thread_local inside the loops is a call (__tls_get_addr), and
  // around a call every vector register is spilled, the row tile's accumulators included.
  uint8_t* const tiles = unpacked.data();
  const float* const sums_as_float = block_sums.data();
  for (int64_t g = g0; g < g1; g += 2) pair<QT>(a, g, g1, tiles, sums_as_float);
  _tile_release();
}

}  // namespace

void gemm_amx(const GemmArgs& a, int64_t g0, int64_t g1) {
  switch (a.qtype) {
    case Q4_0: pairs<Q4_0>(a, g0, g1); break;
    case Q4_1: pairs<Q4_1>(a, g0, g1); break;
    case Q8_0: pairs<Q8_0>(a, g0, g1); break;
    case Q4_K: pairs<Q4_K>(a, g0, g1); break;
    case Q5_K: pairs<Q5_K>(a, g0, g1); break;
    default: pairs<Q6_K>(a, g0, g1); break;
  }
  // GCC leaves the upper vector state dirty on the way out of this file (its vzeroupper pass skips these
  // functions); the scalar code and libm calls that run next on this thread would then pay a transition
  // on every SSE instruction (the decoder layer's SiLU ran 50x slower).
  _mm256_zeroupper();
}

}  // namespace workbench_cpu

#pragma GCC pop_options
