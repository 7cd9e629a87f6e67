// The CPU's sampled rows in one op: for each row of probabilities, the token torch.multinomial(probs, 1,
// generator=g) draws, with g left where multinomial leaves it (engine/sampling_draws.py says how torch
// draws: probs / q over the row, q = -log1p(-u) from one 64-bit draw per element, the first best wins).
//
//   multinomial_draws(Tensor[] probs, Generator?[] generators) -> int[]
//     probs: float32 CPU rows [V]; generators: one CPU generator per row. Rows with distinct generators
//     run side by side on torch's threads, each drawing what it draws alone; rows sharing one run in order.
//
// Per row:
// - the 2V 32-bit words its V random64 draws take come from a copy of the generator's mt19937 state,
//   twisted and tempered in bulk (the same recurrence as at::mt19937), and the copy is put back after;
// - every score p/q is bracketed without a logarithm, u <= -log1p(-u) <= u / (1 - u), so the best lower
//   bound is a floor under the best score, and only the elements whose upper bound reaches that floor
//   (usually one) get the exact score, as torch computes it: float(-log1p(-u)) in double with libm's log1p,
//   then float32 division. A NaN probability, a u of 0 (q = 0) or a row without a positive bound takes the
//   exact score everywhere instead, as the argmax sees it (the first NaN wins, else the first largest).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace workbench_cpu {
namespace {

constexpr int STATE_N = 624, STATE_M = 397;
constexpr uint32_t MATRIX_A = 0x9908b0df, UPPER_MASK = 0x80000000, LOWER_MASK = 0x7fffffff;
constexpr uint32_t HIGH_BITS_KEPT = (1u << 21) - 1;  // u takes the low 53 of a draw's 64 bits: 21 of its high word
// Scores are within 2^-21 of their bounds' arithmetic and of each other's rounding; candidates are the
// elements whose upper bound is within 2^-16 of the floor, far more than that.
constexpr double MARGIN = 1.0 - 0x1p-16;

inline uint32_t twist(uint32_t u, uint32_t v) {
  return (((u & UPPER_MASK) | (v & LOWER_MASK)) >> 1) ^ ((v & 1u) ? MATRIX_A : 0u);
}

// at::mt19937's next_state: the next 624 words of state.
void next_state(uint32_t* s) {
  int k = 0;
  for (; k < STATE_N - STATE_M; ++k) s[k] = s[k + STATE_M] ^ twist(s[k], s[k + 1]);
  for (; k < STATE_N - 1; ++k) s[k] = s[k + STATE_M - STATE_N] ^ twist(s[k], s[k + 1]);
  s[STATE_N - 1] = s[STATE_M - 1] ^ twist(s[STATE_N - 1], s[0]);
}

inline uint32_t temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  return y ^ (y >> 18);
}

// The next n outputs of at::mt19937's operator() into out, and the state advanced as n calls advance it.
// A call decrements left_ and twists when it reaches 0, so left_ - 1 words are ready before the next twist;
// a twist leaves N ready (left_ = N after the call that twisted): here left_ = N + 1 before that call.
void draw_words(at::mt19937_data_pod& state, uint32_t* out, int64_t n) {
  while (n > 0) {
    if (state.left_ == 1) {
      next_state(state.state_.data());
      state.left_ = STATE_N + 1;
      state.next_ = 0;
    }
    TORCH_CHECK(state.left_ > 1 && state.next_ + state.left_ - 1 <= STATE_N,
                "workbench multinomial_draws: a generator's mt19937 state is inconsistent (left ", state.left_,
                ", next ", state.next_, ")");
    const int64_t take = std::min<int64_t>(n, state.left_ - 1);
    const uint32_t* from = state.state_.data() + state.next_;
    for (int64_t i = 0; i < take; ++i) out[i] = temper(from[i]);
    state.next_ += take;
    state.left_ -= int(take);
    out += take;
    n -= take;
  }
}

// u = the draw's low 53 bits times 2^-53, exactly: its high word's 21 bits and low word's 32 in two doubles.
inline double uniform(uint32_t high, uint32_t low) {
  return double(high & HIGH_BITS_KEPT) * 0x1p-21 + double(low) * 0x1p-53;
}

// The score torch's argmax compares: float32 probability over float32 noise.
inline float exact_score(float probability, double u) { return probability / float(-std::log1p(-u)); }

struct Bounds {
  double floor;   // the best lower bound of any score
  bool exact_everywhere;  // a NaN probability or a zero u: the bounds say nothing, every score is computed
};

// Compiled for each ISA and chosen at load: the loop is plain arithmetic on every element.
__attribute__((target_clones("avx512f", "avx2", "default")))
Bounds lower_bounds(const float* p, const uint32_t* words, double* upper, int64_t V) {
  double floor = -INFINITY;
  int special = 0;
  // A max over doubles is not reassociated without leave: a NaN bound makes the row exact anyway.
#pragma omp simd reduction(max : floor) reduction(| : special)
  for (int64_t j = 0; j < V; ++j) {
    const double u = uniform(words[2 * j], words[2 * j + 1]);
    const double up = double(p[j]) / u;  // >= p / q, as q >= u
    const double low = up * (1.0 - u);    // <= p / q, as q <= u / (1 - u)
    upper[j] = up;
    floor = low > floor ? low : floor;
    special |= (p[j] != p[j]) | (u == 0.0);
  }
  return {floor, special != 0};
}

// The first best exact score (the argmax's: the first NaN, else the first largest) over the elements whose
// upper bound reaches `reach`, or over all of them without `upper`.
int64_t first_best(const float* p, const uint32_t* words, int64_t V, const double* upper, double reach) {
  int64_t best = -1;
  float best_score = 0.0f;
  for (int64_t j = 0; j < V; ++j) {
    if (upper && !(upper[j] >= reach)) continue;
    const float score = exact_score(p[j], uniform(words[2 * j], words[2 * j + 1]));
    if (score != score) return j;
    if (best < 0 || score > best_score) best = j, best_score = score;
  }
  return best;  // never -1: V > 0, and the element that set the floor reaches it
}

int64_t draw_row(const float* p, int64_t V, at::Generator& generator, std::vector<uint32_t>& words,
                 std::vector<double>& upper) {
  words.resize(2 * V);
  upper.resize(V);
  {
    auto* impl = at::check_generator<at::CPUGeneratorImpl>(generator);
    std::lock_guard<std::mutex> lock(generator.mutex());
    at::mt19937 engine = impl->engine();
    at::mt19937_data_pod state = engine.data();
    draw_words(state, words.data(), 2 * V);
    engine.set_data(state);
    impl->set_engine(engine);
  }
  const Bounds bounds = lower_bounds(p, words.data(), upper.data(), V);
  if (bounds.exact_everywhere || !(bounds.floor > 0.0)) return first_best(p, words.data(), V, nullptr, 0.0);
  return first_best(p, words.data(), V, upper.data(), bounds.floor * MARGIN);
}

std::vector<int64_t> multinomial_draws(const std::vector<at::Tensor>& probs,
                                       const std::vector<at::Generator>& generators) {
  TORCH_CHECK_VALUE(probs.size() == generators.size(), "workbench multinomial_draws: ", probs.size(),
                    " rows for ", generators.size(), " generators");
  std::unordered_set<const void*> distinct;
  for (size_t r = 0; r < probs.size(); ++r) {
    const at::Tensor& row = probs[r];
    TORCH_CHECK_VALUE(row.device().is_cpu() && row.scalar_type() == at::kFloat && row.dim() == 1 &&
                      row.is_contiguous() && row.numel() > 0,
                      "workbench multinomial_draws: each row must be a non-empty contiguous float32 CPU vector, "
                      "row ", r, " is ", row.scalar_type(), " ", row.sizes(), " on ", row.device());
    TORCH_CHECK_VALUE(generators[r].defined(), "workbench multinomial_draws: row ", r, " has no generator");
    at::check_generator<at::CPUGeneratorImpl>(generators[r]);  // a CPU generator, before any row draws
    distinct.insert(generators[r].unsafeGetGeneratorImpl());
  }
  std::vector<int64_t> tokens(probs.size());
  const auto rows = [&](int64_t r0, int64_t r1) {
    // Kept per thread: a row's buffers are large enough to be fresh pages, faulted in, on every call.
    static thread_local std::vector<uint32_t> words;
    static thread_local std::vector<double> upper;
    for (int64_t r = r0; r < r1; ++r) {
      at::Generator generator = generators[r];
      tokens[r] = draw_row(probs[r].data_ptr<float>(), probs[r].numel(), generator, words, upper);
    }
  };
  const int64_t count = int64_t(probs.size());
  if (distinct.size() == probs.size()) at::parallel_for(0, count, 1, rows);
  else rows(0, count);  // a shared generator draws its rows one after the other, in row order
  return tokens;
}

}  // namespace
}  // namespace workbench_cpu

TORCH_LIBRARY_FRAGMENT(workbench, m) {
  m.def("multinomial_draws(Tensor[] probs, Generator?[] generators) -> int[]");
}

TORCH_LIBRARY_IMPL(workbench, CPU, m) { m.impl("multinomial_draws", &workbench_cpu::multinomial_draws); }
