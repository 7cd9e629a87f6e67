// The AVX-512 VNNI path: the integer products for qgemm_tile.inc's micro-kernel with vpdpbusd (u8 x s8,
// four products summed into int32 without saturation), EVEX-encoded at 256 bits so it shares the packed
// layout and the epilogue with the AVX2 path; every type but Q6_K runs two packed groups a 512-bit vector
// with the same operations lane by lane (below), from one row on Intel and from 12 on AMD (gemm_avx512).
// Compiled everywhere, run only where the CPU reports AVX512F/BW/VL and VNNI (ops.cpp checks).
//
// Q8_0 weights are signed, and AVX-512 has no byte sign instruction: w + 128 (w ^ 0x80) is the unsigned
// operand, and the block's sum is corrected by 128 * s_a, the activations' sum. Exact in int32. Q6_K, whose
// two halves are scaled apart, takes |w| x (a * sign(w)) instead (|w| <= 32). The other types' quants are
// unsigned already.
#include <immintrin.h>

#include "qgemm.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

namespace workbench_cpu {
namespace {

struct Isa {
  static constexpr int MAX_ROWS = 8;  // 32 registers (EVEX): 8 rows of int and float sums beside the weights
  static constexpr bool BIAS_Q8 = true;
  static __m256i dot(__m256i acc, __m256i w, __m256i a) { return _mm256_dpbusd_epi32(acc, w, a); }
};

#include "qgemm_tile.inc"

// Two packed groups at once, 16 columns a 512-bit vector (lanes 0-7 group g's, 8-15 group g + 1's): each
// lane does the 256-bit micro-kernel's operations for its column in the same order, so the same bits,
// with every activation broadcast and each row's epilogue serving 16 columns instead of 8 (half the
// instructions: the 256-bit kernel spends about as many on those as on the products). Q6_K keeps the
// 256-bit kernel: its sign trick has no 512-bit instruction.
inline __m512i join(const uint8_t* lo, const uint8_t* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)), 1);
}

template <int QT>
inline __m512 load_scales16(const uint8_t* lo, const uint8_t* hi) {
  const __m256 first = load_scales<QT>(lo), second = load_scales<QT>(hi);
  return _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_castps_si256(first)),
                                                _mm256_castps_si256(second), 1));
}

// isum[r] += quad j's products of row r's activations and the 16 columns' quants w.
template <int R>
__attribute__((always_inline)) inline void quad16(__m512i w, const int8_t* const q[R], int j, __m512i isum[R]) {
  for (int r = 0; r < R; ++r) {
    int32_t four;
    __builtin_memcpy(&four, q[r] + 4 * j, 4);
    isum[r] = _mm512_dpbusd_epi32(isum[r], w, _mm512_set1_epi32(four));
  }
}

template <int QT, int R>
inline void block_step16(const GemmArgs& a, const uint8_t* blk0, const uint8_t* blk1, int64_t i0, int64_t b,
                         __m512 acc[R]) {
  const int64_t nb = a.K / QK;
  const uint8_t* w0 = blk0 + quants_offset(QT);
  const uint8_t* w1 = blk1 + quants_offset(QT);
  const int8_t* q[R];
  __m512i isum[R];
  for (int r = 0; r < R; ++r) {
    q[r] = a.q + (i0 + r) * a.K + b * QK;
    isum[r] = _mm512_setzero_si512();
  }
  if constexpr (nibbles(QT)) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i v = join(w0 + 32 * j, w1 + 32 * j);
      quad16<R>(_mm512_and_si512(v, m4), q, j, isum);
      quad16<R>(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), q, j + 4, isum);
    }
  } else {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i w = join(w0 + 32 * j, w1 + 32 * j);
      quad16<R>(QT == Q8_0 ? _mm512_xor_si512(w, _mm512_set1_epi8(char(0x80))) : w, q, j, isum);
    }
  }
  if constexpr (QT == Q8_0) {
    for (int r = 0; r < R; ++r)
      isum[r] = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(128 * a.s[(i0 + r) * nb + b]));
  }
  const __m512 dw = load_scales16<QT>(blk0, blk1);
  const __m512 mw = has_min(QT) ? load_scales16<QT>(blk0 + min_offset(QT), blk1 + min_offset(QT)) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    const float da = a.d[(i0 + r) * nb + b];
    const int32_t sa = a.s[(i0 + r) * nb + b];
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(da));
    if constexpr (QT == Q4_0) {
      const __m512i t = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(8 * sa));
      acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(t), acc[r]);
    } else {
      acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum[r]), acc[r]);
      if constexpr (has_min(QT))
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(mw, _mm512_set1_ps(da)), _mm512_set1_ps(float(sa)), acc[r]);
    }
  }
}

template <int QT, int R>
void tile16(const GemmArgs& a, int64_t g, int64_t i0) {
  const int64_t nb = a.K / QK, gb = group_bytes(QT);
  const uint8_t* first = a.w + g * nb * gb;
  const uint8_t* second = first + nb * gb;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) block_step16<QT, R>(a, first + b * gb, second + b * gb, i0, b, acc);
  for (int r = 0; r < R; ++r) {
    store(a, i0 + r, g, _mm512_castps512_ps256(acc[r]));
    store(a, i0 + r, g + 1, _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(acc[r]), 1)));
  }
}

constexpr int ROWS16 = 12;  // rows a 16-column tile holds in registers (2 x 12 of the 32)

template <int QT, int R = ROWS16>
void rest16(const GemmArgs& a, int64_t g, int64_t i, int64_t left) {
  if constexpr (R > 1) {
    if (left < R) return rest16<QT, R - 1>(a, g, i, left);
  }
  tile16<QT, R>(a, g, i);
}

template <int QT>
void groups16(const GemmArgs& a, int64_t g0, int64_t g1) {
  int64_t g = g0;
  for (; g + 1 < g1; g += 2) {
    int64_t i = 0;
    for (; i + ROWS16 <= a.M; i += ROWS16) tile16<QT, ROWS16>(a, g, i);
    if (i < a.M) rest16<QT>(a, g, i, a.M - i);
  }
  if (g < g1) groups<QT>(a, g, g1);
}

}  // namespace

void gemm_avx512(const GemmArgs& a, int64_t g0, int64_t g1) {
  // Where the pairs start. On an AMD EPYC (Zen 4: 512-bit operations in two halves) they took the head's
  // Q8_0 weight (30 MB) 2.3x as long at one row and 1.2-1.5x at eight, while from 12 rows on they are 2-15%
  // faster on every shape; so there fewer rows go on the 256-bit kernel. On Intel's AVX-512 Xeons (full
  // 512-bit units) the pairs are faster at every row count: 15-27% at 1-8 rows for the Q4_1 shapes, equal
  // to 20% for the head (bench/qgemm_paths.py). Q6_K has no 512-bit sign trick. The bits are the same.
  static const int64_t pairs_from = __builtin_cpu_is("amd") ? ROWS16 : 1;
  if (a.M < pairs_from || a.qtype == Q6_K) {
    gemm(a, g0, g1);
  } else {
    switch (a.qtype) {
      case Q4_0: groups16<Q4_0>(a, g0, g1); break;
      case Q4_1: groups16<Q4_1>(a, g0, g1); break;
      case Q8_0: groups16<Q8_0>(a, g0, g1); break;
      case Q4_K: groups16<Q4_K>(a, g0, g1); break;
      default: groups16<Q5_K>(a, g0, g1); break;
    }
  }
  _mm256_zeroupper();  // as qgemm_amx.cpp says: the scalar code after would pay a transition at every instruction
}

}  // namespace workbench_cpu

#pragma GCC pop_options
