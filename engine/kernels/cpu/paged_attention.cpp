// The paged attention op (namespace `workbench`): argument checks, the choice of code path, the thread
// split.
//
//   paged_attention(q [N, H, D], key_cache [slots, Hkv, D], value_cache, block_tables int64 [B, W],
//                   token_sequence int64 [N], positions int64 [N], block_size, sliding_window?, scale,
//                   path) -> out [N, H, D]
// Every query token attends its own sequence's keys 0 .. p (the window's last W of them with a sliding
// window) through its block table, in the order paged_attention.h defines. The work items are (token,
// KV head) pairs, each computed alone with the same arithmetic whoever shares the call; threads claim
// runs of them of about equal cost (balanced_cuts), and the path depends on the CPU and head_dim only
// (head_dim not a multiple of 8 runs the scalar code in every path, which is the same arithmetic; AVX-512
// runs the AVX2 code for head_dim not a multiple of 16).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <optional>
#include <vector>

#include "dispatch.h"
#include "drivers.h"

namespace workbench_cpu {
namespace {

void check_index(const at::Tensor& t, const char* name, int64_t dim, const char* where) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, "workbench ", where, ": ", name, " must be int64, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, "workbench ", where, ": ", name, " must be ", dim, "-D, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device().is_cpu(), "workbench ", where, ": ", name, " must be on the CPU, got ", t.device());
}

at::Tensor paged_attention(const at::Tensor& q_in, const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const at::Tensor& block_tables_in, const at::Tensor& token_sequence_in,
                           const at::Tensor& positions_in, int64_t block_size, std::optional<int64_t> sliding_window,
                           double scale, int64_t path) {
  path = resolve(path);
  TORCH_CHECK_TYPE(q_in.scalar_type() == at::kFloat || q_in.scalar_type() == at::kBFloat16,
                   "workbench paged_attention: q must be float32 or bfloat16, got ", q_in.scalar_type());
  TORCH_CHECK_TYPE(key_cache.scalar_type() == q_in.scalar_type() && value_cache.scalar_type() == q_in.scalar_type(),
                   "workbench paged_attention: the key and value caches must be q's dtype (", q_in.scalar_type(),
                   "), got ", key_cache.scalar_type(), " and ", value_cache.scalar_type());
  TORCH_CHECK_VALUE(q_in.dim() == 3, "workbench paged_attention: q must be 3-D [N, H, D], got shape ", q_in.sizes());
  TORCH_CHECK_VALUE(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes(),
                    "workbench paged_attention: the caches must be [slots, Hkv, D] of one shape, got ",
                    key_cache.sizes(), " and ", value_cache.sizes());
  TORCH_CHECK_VALUE(key_cache.is_contiguous() && value_cache.is_contiguous(),
                    "workbench paged_attention: the caches must be contiguous (a layer's [slots, Hkv, D])");
  for (const at::Tensor* t : {&q_in, &key_cache, &value_cache})
    TORCH_CHECK_VALUE(t->device().is_cpu(), "workbench paged_attention: every input must be on the CPU, got ",
                      t->device());
  const int64_t N = q_in.size(0), H = q_in.size(1), D = q_in.size(2);
  const int64_t slots = key_cache.size(0), Hkv = key_cache.size(1);
  TORCH_CHECK_VALUE(D > 0 && key_cache.size(2) == D, "workbench paged_attention: head_dim of q (", D,
                    ") and of the caches (", key_cache.size(2), ") must agree and be positive");
  TORCH_CHECK_VALUE(Hkv > 0 && H % Hkv == 0, "workbench paged_attention: ", H,
                    " query heads are not a multiple of ", Hkv, " KV heads");
  TORCH_CHECK_VALUE(block_size > 0, "workbench paged_attention: block_size must be positive, got ", block_size);
  TORCH_CHECK_VALUE(!sliding_window.has_value() || *sliding_window > 0,
                    "workbench paged_attention: sliding_window must be positive or None, got ",
                    sliding_window.value_or(0));
  const at::Tensor q = q_in.contiguous(), tables = block_tables_in.contiguous();
  const at::Tensor sequence = token_sequence_in.contiguous(), positions = positions_in.contiguous();
  const int64_t window = sliding_window.value_or(0);
  const int64_t max_keys = check_attention_indexes(tables, sequence, positions, N, block_size, window,
                                                   slots / block_size, "paged_attention");
  at::Tensor out = at::empty({N, H, D}, q.options());
  if (N == 0) return out;
  const AttnArgs args{q.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), q.scalar_type() == at::kBFloat16,
                      N, H, Hkv, D, tables.data_ptr<int64_t>(), tables.size(1), sequence.data_ptr<int64_t>(),
                      positions.data_ptr<int64_t>(), block_size, window, static_cast<float>(scale), out.data_ptr()};
  run_attention(args, max_keys, path);
  return out;
}

}  // namespace

int64_t check_attention_indexes(const at::Tensor& tables, const at::Tensor& sequence, const at::Tensor& positions,
                                int64_t N, int64_t block_size, int64_t window, int64_t num_blocks, const char* where) {
  check_index(tables, "block_tables", 2, where);
  check_index(sequence, "token_sequence", 1, where);
  check_index(positions, "positions", 1, where);
  TORCH_CHECK_VALUE(sequence.size(0) == N && positions.size(0) == N, "workbench ", where,
                    ": token_sequence and positions must have one entry per query token (", N, "), got ",
                    sequence.size(0), " and ", positions.size(0));
  TORCH_CHECK_VALUE(tables.is_contiguous() && sequence.is_contiguous() && positions.is_contiguous(),
                    "workbench ", where, ": block_tables, token_sequence and positions must be contiguous");
  const int64_t B = tables.size(0), width = tables.size(1);
  // Every block a token reads must exist: its sequence's table entries lo / bs .. p / bs, checked once per
  // sequence over the span its tokens need.
  const int64_t* seq = sequence.data_ptr<int64_t>();
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* tab = tables.data_ptr<int64_t>();
  std::vector<int64_t> first(B, width), last(B, -1);
  int64_t max_keys = 1;
  for (int64_t t = 0; t < N; ++t) {
    TORCH_CHECK_VALUE(seq[t] >= 0 && seq[t] < B, "workbench ", where, ": token ", t, " names sequence ", seq[t],
                      ", not a row of the ", B, " block tables");
    TORCH_CHECK_VALUE(pos[t] >= 0 && pos[t] / block_size < width, "workbench ", where, ": token ", t,
                      " at position ", pos[t], " is past its block table (", width, " blocks of ", block_size, ")");
    const int64_t lo = window > 0 ? std::max<int64_t>(0, pos[t] - window + 1) : 0;
    first[seq[t]] = std::min(first[seq[t]], lo / block_size);
    last[seq[t]] = std::max(last[seq[t]], pos[t] / block_size);
    max_keys = std::max(max_keys, pos[t] - lo + 1);
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = first[b]; i <= last[b]; ++i)
      TORCH_CHECK_VALUE(tab[b * width + i] >= 0 && tab[b * width + i] < num_blocks, "workbench ", where,
                        ": sequence ", b, "'s block ", i, " is ", tab[b * width + i], ", not one of the cache's ",
                        num_blocks, " blocks");
  return max_keys;
}

namespace {

// Widening pays where a sequence has this many query tokens in the call; the widened copies of one call
// stay under WIDE_BYTES (a sequence that would pass it reads the cache, with the same bits).
constexpr int64_t WIDE_MIN_TOKENS = 8;
constexpr int64_t WIDE_BYTES = int64_t(64) << 20;

// The WideKeys of a call with a bfloat16 cache on a SIMD path: each sequence with at least
// WIDE_MIN_TOKENS query tokens gets its keys from its first token's window start to its last position
// (AVX-512: in 16-key blocks, the span rounded up).
struct WideCopies {
  std::vector<float> keys, values;
  std::vector<int64_t> base, first, blocks;

  WideKeys build(const AttnArgs& a, bool in_blocks) {
    int64_t B = 0;
    for (int64_t t = 0; t < a.N; ++t) B = std::max(B, a.sequence[t] + 1);
    std::vector<int64_t> count(B, 0), last(B, -1);
    first.assign(B, INT64_MAX);
    for (int64_t t = 0; t < a.N; ++t) {
      const int64_t b = a.sequence[t], p = a.positions[t];
      ++count[b];
      first[b] = std::min(first[b], a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0);
      last[b] = std::max(last[b], p);
    }
    base.assign(B, -1);
    blocks.assign(B, 0);
    int64_t total = 0;
    const int64_t row = a.Hkv * a.D;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t span = in_blocks ? (last[b] - first[b] + 16) / 16 * 16 : last[b] - first[b] + 1;
      if (count[b] < WIDE_MIN_TOKENS || (total + span * row) * 2 * int64_t(sizeof(float)) > WIDE_BYTES) continue;
      base[b] = total;
      blocks[b] = span / 16;
      total += span * row;
    }
    if (total == 0) return {};
    keys.resize(total);  // zeros: a block's keys past the span
    values.resize(total);
    for (int64_t b = 0; b < B; ++b) {
      if (base[b] < 0) continue;
      at::parallel_for(first[b], last[b] + 1, 64, [&](int64_t j0, int64_t j1) {
        if (in_blocks) {
          widen_keys_avx512(a, b, first[b], j0, j1 - 1, blocks[b], keys.data() + base[b], values.data() + base[b]);
        } else {
          widen_keys_avx2(a, b, j0, j1 - 1, keys.data() + base[b] + (j0 - first[b]) * row,
                          values.data() + base[b] + (j0 - first[b]) * row);
        }
      });
    }
    return {keys.data(), values.data(), base.data(), first.data(), in_blocks ? blocks.data() : nullptr};
  }
};

// What an item costs, in widened keys' time: the keys it reads (one read through the block table costs
// about 4/3 of a widened one, measured on decodes beside a prompt chunk) and a fixed part.
constexpr int64_t ITEM_FIXED_COST = 48, WIDE_KEY_COST = 3, CACHED_KEY_COST = 4;
// Runs per thread: threads claim runs as they finish the last, so a cost the estimate misjudges (a cache
// read slower in a large pool than in the measurement) leaves a thread waiting at most one small run.
constexpr int64_t RUNS_PER_THREAD = 8;

// The items (token, KV head), in token order, cut into `runs` runs of about equal cost: a step's tokens
// cost anything from one key (a prompt's first) to thousands (a long decode), so equal counts of items
// left one thread waiting on the other when decodes and a prompt chunk share a call. Each item is computed
// alone, so where the cuts fall changes which thread computes it, never a bit.
std::vector<int64_t> balanced_cuts(const AttnArgs& a, const WideKeys& wide, int64_t runs) {
  std::vector<int64_t> cost(a.N);
  int64_t total = 0;
  for (int64_t t = 0; t < a.N; ++t) {
    const int64_t p = a.positions[t], keys = a.window > 0 ? std::min(p + 1, a.window) : p + 1;
    const bool widened = wide.base && wide.base[a.sequence[t]] >= 0;
    cost[t] = ITEM_FIXED_COST + keys * (widened ? WIDE_KEY_COST : CACHED_KEY_COST);
    total += cost[t] * a.Hkv;
  }
  runs = std::max<int64_t>(1, std::min(runs, a.N * a.Hkv));
  std::vector<int64_t> cuts{0};
  int64_t done = 0;
  for (int64_t i = 0; i < a.N * a.Hkv && int64_t(cuts.size()) < runs; ++i) {
    done += cost[i / a.Hkv];
    if (done * runs >= total * int64_t(cuts.size())) cuts.push_back(i + 1);
  }
  cuts.push_back(a.N * a.Hkv);
  return cuts;
}

}  // namespace

void run_attention(const AttnArgs& a, int64_t max_keys, int64_t path) {
  const bool simd = path != SCALAR && a.D % ATTN_LANES == 0, wide16 = simd && path >= AVX512 && a.D % 16 == 0;
  // Room for whole 16-key blocks before and after a head's scores (AttnScratch).
  const int64_t group = a.H / a.Hkv, stride = (max_keys + 15) / 16 * 16 + 32;
  WideCopies copies;
  const WideKeys wide = simd && a.bf16 ? copies.build(a, wide16) : WideKeys{};
  const int64_t threads = at::get_num_threads();
  const std::vector<int64_t> cuts = balanced_cuts(a, wide, threads * RUNS_PER_THREAD);
  const int64_t runs = int64_t(cuts.size()) - 1;
  std::atomic<int64_t> next_run{0};
  at::parallel_for(0, std::min(threads, runs), 1, [&](int64_t, int64_t) {
    std::vector<float> scores(group * stride), query(group * a.D);
    std::vector<int64_t> rows(max_keys);
    const AttnScratch scratch{scores.data(), rows.data(), stride, query.data(), wide};
    for (int64_t run = next_run++; run < runs; run = next_run++) {
      for (int64_t i = cuts[run]; i < cuts[run + 1]; ++i) {
        const int64_t t = i / a.Hkv, g = i % a.Hkv;
        if (wide16) attend_avx512(a, t, g, scratch);
        else if (simd) attend_avx2(a, t, g, scratch);
        else attend_scalar(a, t, g, scratch);
      }
    }
  });
}
}  // namespace workbench_cpu

TORCH_LIBRARY_FRAGMENT(workbench, m) {
  m.def("paged_attention(Tensor q, Tensor key_cache, Tensor value_cache, Tensor block_tables, "
        "Tensor token_sequence, Tensor positions, int block_size, int? sliding_window, float scale, "
        "int path=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(workbench, CPU, m) { m.impl("paged_attention", &workbench_cpu::paged_attention); }
