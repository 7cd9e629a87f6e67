// The fused decoder layer (namespace `workbench`) and the two small ops around it: a Llama-family block of
// a serving step in one call, so that a step costs a few dozen op calls instead of about forty a layer.
//
//   decoder_layer(x [N, D] f32 (updated in place), weights, qtypes, shape, cos, sin [N, hd/2] f32,
//                 key_cache, value_cache [slots, Hkv, hd], slot_mapping int64 [N], block_tables, token_sequence,
//                 positions, block_size, sliding_window?, scale, eps, activation, path) -> ()
//   rms_norm(x [N, D] f32, weight [D] f32, eps) -> [N, D] f32
//   rope_tables(positions int64 [N], inv_freq f32 [hd/2]) -> (cos, sin) f32 [N, hd/2]
//
// weights: attn_norm [D], qkv (packed), qkv bias [H*hd + 2*Hkv*hd] or empty, q_norm [hd] or empty, k_norm
// [hd] or empty, o (packed), ffn_norm [D], gate_up (packed: gate rows then up rows), down (packed),
// post_attn_norm [D] or empty, post_ffn_norm [D] or empty (Gemma's sandwich norms: both or neither); the
// float ones fp32, the packed ones as engine/kernels/cpu/pack.py lays them out. qtypes: the ggml types of
// qkv, o, gate_up, down. shape: H, Hkv, hd, I (the MLP's width). activation: 0 SiLU (Llama's SwiGLU),
// 1 tanh-approximated GELU (Gemma's GeGLU).
//
// The block, the residual stream x in fp32 throughout:
//   h = norm(x, attn_norm); qkv = qgemm(h) (+ bias); each q and k head normed (q_norm, k_norm) where given;
//   q and k rotated (RoPE); k and v written to the caches at slot_mapping, q rounded to the cache dtype;
//   a = paged attention of q (paged_attention.h); x = x + post(qgemm(a), post_attn_norm)  (o_proj)
//   h = norm(x, ffn_norm); g, u = qgemm(h); x = x + post(qgemm(act(g) * u), post_ffn_norm)  (gate_up, down)
// where post(y, w) is norm(y, w) with sandwich norms and y itself without, and
// where qgemm quantizes its input per 32-block and multiplies as qgemm.h defines, and per row:
//   norm(x, w)_k = (x_k * r) * w_k, r = 1 / sqrt(ss / n + eps), ss = ((l0 + l1) + (l2 + l3)) +
//                  ((l4 + l5) + (l6 + l7)) over lanes l[k % 8] = l[k % 8] + x_k * x_k, k in order
//   rope (HF's half rotation), i < hd/2:  v_i' = v_i * c_i - v_(i+hd/2) * s_i,
//                                         v_(i+hd/2)' = v_(i+hd/2) * c_i + v_i * s_i
//   silu(g) * u as swiglu.h defines it      (exp_f32 of paged_attention.h, vectorized with the same bits)
//   gelu(g) = (0.5f * g) * (1 + tanhf(c * (g + 0.044715f * ((g * g) * g)))), c = sqrt(2 / pi) in fp32
//   rope_tables: c_i = cos(p * f_i), s_i = sin(p * f_i), p * f_i an fp32 product, cos and sin in double,
//                rounded to fp32 once
// every fp32 operation rounded once (no contraction: build.py compiles with -ffp-contract=off). This file
// has one code path for every CPU; only qgemm's, attention's and SwiGLU's instructions change with `path`,
// never their arithmetic. So a row's result depends on its own inputs and its sequence's cache alone: not on N,
// the rows beside it, the thread count or the path.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "dispatch.h"
#include "drivers.h"
#include "swiglu.h"

namespace workbench_cpu {
namespace {

// Rows a task takes at least in the row-wise phases: tiny steps (a decode) stay on the calling thread.
constexpr int64_t ROW_GRAIN_ELEMS = 1 << 14;
enum Weight : int64_t {
  ATTN_NORM, QKV, QKV_BIAS, Q_NORM, K_NORM, O, FFN_NORM, GATE_UP, DOWN, POST_ATTN_NORM, POST_FFN_NORM, WEIGHTS
};
enum Activation : int64_t { SILU = 0, GELU_TANH = 1 };
constexpr float GELU_C = 0.7978845608028654f;  // sqrt(2 / pi)

int64_t row_grain(int64_t width) { return std::max<int64_t>(1, ROW_GRAIN_ELEMS / width); }

float sum_squares(const float* x, int64_t n) {
  float l[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t k = 0; k < n; ++k) l[k % 8] = l[k % 8] + x[k] * x[k];
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// out may be x: every x_k is read (for ss) before any out_k is written.
void norm_row(const float* x, const float* w, int64_t n, float eps, float* out) {
  const float r = 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
  for (int64_t k = 0; k < n; ++k) out[k] = (x[k] * r) * w[k];
}

float gelu(float g) { return (0.5f * g) * (1.0f + std::tanh(GELU_C * (g + 0.044715f * ((g * g) * g)))); }

// out_k = act(g_k) * u_k for one row.
void gated(const float* g, const float* u, float* out, int64_t n, int64_t activation, int64_t path) {
  if (activation == GELU_TANH) {
    for (int64_t k = 0; k < n; ++k) out[k] = gelu(g[k]) * u[k];
  } else if (path == SCALAR) {
    swiglu_scalar(g, u, out, n);
  } else if (path == AVX2) {
    swiglu_avx2(g, u, out, n);
  } else {
    swiglu_avx512(g, u, out, n);
  }
}

void rope_head(float* v, const float* c, const float* s, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * c[i] - b * s[i];
    v[i + half] = b * c[i] + a * s[i];
  }
}

// Per-32-block int8 activations of N rows of width K (QuantArgs' outputs).
struct Activations {
  at::Tensor q, d, s;
  Activations(int64_t N, int64_t K, const at::TensorOptions& options)
      : q(at::empty({N, K}, options.dtype(at::kChar))),
        d(at::empty({N, K / QK}, options.dtype(at::kFloat))),
        s(at::empty({N, K / QK}, options.dtype(at::kInt))) {}
  QuantArgs row(const float* x, int64_t i) const {
    const int64_t K = q.size(1);
    return {x, false, 1, K, q.data_ptr<int8_t>() + i * K, d.data_ptr<float>() + i * (K / QK),
            s.data_ptr<int32_t>() + i * (K / QK)};
  }
};

// out [N, n] (=, or += with accumulate) = the activations times packed weight w.
void project(const Activations& a, const at::Tensor& w, int64_t qtype, int64_t n, float* out, bool accumulate,
             int64_t path) {
  GemmArgs g{a.q.data_ptr<int8_t>(), a.d.data_ptr<float>(), a.s.data_ptr<int32_t>(), w.data_ptr<uint8_t>(),
             int(qtype), a.q.size(0), n, a.q.size(1), out, nullptr};
  g.accumulate = accumulate;
  run_gemm(g, path);
}

void check_float(const at::Tensor& t, const char* name, int64_t numel, bool optional) {
  if (optional && t.numel() == 0) return;
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "workbench decoder_layer: ", name, " must be float32, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.is_contiguous() && t.numel() == numel && t.device().is_cpu(), "workbench decoder_layer: ",
                    name, " must be ", numel, " contiguous CPU values", optional ? " (or empty)" : "", ", got shape ",
                    t.sizes());
}

void check_packed(const at::Tensor& w, const char* name, int64_t qtype, int64_t n, int64_t K) {
  TORCH_CHECK_VALUE(known_qtype(qtype), "workbench decoder_layer: ", name, "'s qtype must be ", QTYPES_ACCEPTED,
                    ", got ", qtype);
  const int64_t bytes = (n + GROUP - 1) / GROUP * (K / QK) * group_bytes(int(qtype));
  TORCH_CHECK_VALUE(w.scalar_type() == at::kByte && w.is_contiguous() && w.numel() == bytes && w.device().is_cpu(),
                    "workbench decoder_layer: ", name, " [", n, ", ", K, "] packed must be ", bytes,
                    " contiguous uint8 on the CPU, got ", w.scalar_type(), " ", w.sizes());
}

void decoder_layer(const at::Tensor& x, at::TensorList weights, at::IntArrayRef qtypes, at::IntArrayRef shape,
                   const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& key_cache,
                   const at::Tensor& value_cache, const at::Tensor& slot_mapping_in, const at::Tensor& block_tables_in,
                   const at::Tensor& token_sequence_in, const at::Tensor& positions_in, int64_t block_size,
                   std::optional<int64_t> sliding_window, double scale, double eps_in, int64_t activation,
                   int64_t path) {
  path = resolve(path);
  TORCH_CHECK_VALUE(weights.size() == WEIGHTS && qtypes.size() == 4 && shape.size() == 4,
                    "workbench decoder_layer: takes 11 weights, 4 qtypes and 4 shape values, got ", weights.size(),
                    ", ", qtypes.size(), " and ", shape.size());
  TORCH_CHECK_VALUE(activation == SILU || activation == GELU_TANH,
                    "workbench decoder_layer: activation must be 0 (SiLU) or 1 (tanh GELU), got ", activation);
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "workbench decoder_layer: x must be float32, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(),
                    "workbench decoder_layer: x must be a contiguous [N, D] CPU tensor, got ", x.sizes());
  const int64_t N = x.size(0), D = x.size(1), H = shape[0], Hkv = shape[1], hd = shape[2], I = shape[3];
  TORCH_CHECK_VALUE(H > 0 && Hkv > 0 && H % Hkv == 0 && hd > 0 && hd % 2 == 0 && I > 0,
                    "workbench decoder_layer: shape (H, Hkv, hd, I) must be positive, H a multiple of Hkv and hd "
                    "even, got ", shape);
  const int64_t Dq = H * hd, Dkv = Hkv * hd, Dqkv = Dq + 2 * Dkv;
  TORCH_CHECK_VALUE(D % QK == 0 && Dq % QK == 0 && I % QK == 0, "workbench decoder_layer: D (", D, "), H * hd (",
                    Dq, ") and I (", I, ") must be multiples of 32");
  check_float(weights[ATTN_NORM], "attn_norm", D, false);
  check_float(weights[FFN_NORM], "ffn_norm", D, false);
  check_float(weights[QKV_BIAS], "qkv_bias", Dqkv, true);
  check_float(weights[Q_NORM], "q_norm", hd, true);
  check_float(weights[K_NORM], "k_norm", hd, true);
  check_float(weights[POST_ATTN_NORM], "post_attn_norm", D, true);
  check_float(weights[POST_FFN_NORM], "post_ffn_norm", D, true);
  TORCH_CHECK_VALUE((weights[POST_ATTN_NORM].numel() == 0) == (weights[POST_FFN_NORM].numel() == 0),
                    "workbench decoder_layer: post_attn_norm and post_ffn_norm come together (sandwich norms) or not "
                    "at all");
  check_packed(weights[QKV], "qkv", qtypes[0], Dqkv, D);
  check_packed(weights[O], "o", qtypes[1], D, Dq);
  check_packed(weights[GATE_UP], "gate_up", qtypes[2], 2 * I, D);
  check_packed(weights[DOWN], "down", qtypes[3], D, I);
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK_VALUE(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == N &&
                      t->size(1) == hd / 2, "workbench decoder_layer: cos and sin must be contiguous float32 [N, hd/2]"
                      " = [", N, ", ", hd / 2, "], got ", t->scalar_type(), " ", t->sizes());
  const at::ScalarType cache_type = key_cache.scalar_type();
  TORCH_CHECK_TYPE((cache_type == at::kBFloat16 || cache_type == at::kFloat) && value_cache.scalar_type() == cache_type,
                   "workbench decoder_layer: the caches must be both bfloat16 or both float32, got ", cache_type,
                   " and ", value_cache.scalar_type());
  TORCH_CHECK_VALUE(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes() && key_cache.size(1) == Hkv &&
                    key_cache.size(2) == hd && key_cache.is_contiguous() && value_cache.is_contiguous(),
                    "workbench decoder_layer: the caches must be contiguous [slots, ", Hkv, ", ", hd, "], got ",
                    key_cache.sizes(), " and ", value_cache.sizes());
  TORCH_CHECK_VALUE(block_size > 0 && key_cache.size(0) % block_size == 0, "workbench decoder_layer: block_size ",
                    block_size, " must be positive and divide the cache's ", key_cache.size(0), " slots");
  TORCH_CHECK_VALUE(!sliding_window.has_value() || *sliding_window > 0,
                    "workbench decoder_layer: sliding_window must be positive or None");
  const at::Tensor slots = slot_mapping_in.contiguous(), tables = block_tables_in.contiguous();
  const at::Tensor sequence = token_sequence_in.contiguous(), positions = positions_in.contiguous();
  TORCH_CHECK_VALUE(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.size(0) == N,
                    "workbench decoder_layer: slot_mapping must be int64 [N] = [", N, "], got ", slots.sizes());
  const int64_t num_slots = key_cache.size(0);
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < N; ++t)
    TORCH_CHECK_VALUE(slot[t] >= 0 && slot[t] < num_slots, "workbench decoder_layer: token ", t, "'s slot ", slot[t],
                      " is not one of the cache's ", num_slots);
  const int64_t window = sliding_window.value_or(0);
  const int64_t max_keys = check_attention_indexes(tables, sequence, positions, N, block_size, window,
                                                   num_slots / block_size, "decoder_layer");
  if (N == 0) return;

  const float eps = static_cast<float>(eps_in);
  const bool bf16 = cache_type == at::kBFloat16;
  const auto options = x.options();
  float* xs = x.data_ptr<float>();
  const float* bias = weights[QKV_BIAS].numel() ? weights[QKV_BIAS].data_ptr<float>() : nullptr;
  const float* q_norm = weights[Q_NORM].numel() ? weights[Q_NORM].data_ptr<float>() : nullptr;
  const float* k_norm = weights[K_NORM].numel() ? weights[K_NORM].data_ptr<float>() : nullptr;

  // Norm and quantize each row of x (scratch row per task).
  const auto norm_quantize = [&](const Activations& a, const float* w) {
    at::parallel_for(0, N, row_grain(D), [&](int64_t r0, int64_t r1) {
      std::vector<float> h(D);
      for (int64_t i = r0; i < r1; ++i) {
        norm_row(xs + i * D, w, D, eps, h.data());
        run_quantize(a.row(h.data(), i), path);  // one row: runs inline
      }
    });
  };

  // x += a @ w, or with sandwich norms x += norm(a @ w, post): the projection in a row of its own first.
  const bool sandwich = weights[POST_ATTN_NORM].numel() > 0;
  const auto add_projection = [&](const Activations& a, const at::Tensor& w, int64_t qtype, Weight post) {
    if (!sandwich) {
      project(a, w, qtype, D, xs, true, path);
      return;
    }
    at::Tensor projected = at::empty({N, D}, options);
    float* y = projected.data_ptr<float>();
    project(a, w, qtype, D, y, false, path);
    const float* pw = weights[post].data_ptr<float>();
    at::parallel_for(0, N, row_grain(D), [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        norm_row(y + i * D, pw, D, eps, y + i * D);
        for (int64_t k = 0; k < D; ++k) xs[i * D + k] = xs[i * D + k] + y[i * D + k];
      }
    });
  };

  // Attention.
  const Activations hidden(N, D, options);
  norm_quantize(hidden, weights[ATTN_NORM].data_ptr<float>());
  at::Tensor qkv = at::empty({N, Dqkv}, options);
  float* qkvs = qkv.data_ptr<float>();
  project(hidden, weights[QKV], qtypes[0], Dqkv, qkvs, false, path);
  at::Tensor q = at::empty({N, H, hd}, options.dtype(cache_type));
  const int64_t half = hd / 2;
  at::parallel_for(0, N, row_grain(Dqkv), [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t) {
      float* row = qkvs + t * Dqkv;
      if (bias)
        for (int64_t n = 0; n < Dqkv; ++n) row[n] = row[n] + bias[n];
      for (int64_t h = 0; h < H + Hkv; ++h) {
        float* v = row + h * hd;
        const float* w = h < H ? q_norm : k_norm;
        if (w) norm_row(v, w, hd, eps, v);
        rope_head(v, cos.data_ptr<float>() + t * half, sin.data_ptr<float>() + t * half, half);
      }
      // q to its buffer, k and v to their slot, in the cache's dtype.
      const auto put = [&](const float* from, int64_t count, void* base, int64_t offset) {
        if (bf16) {
          uint16_t* to = static_cast<uint16_t*>(base) + offset;
          for (int64_t k = 0; k < count; ++k) to[k] = bf16_bits(from[k]);
        } else {
          std::copy(from, from + count, static_cast<float*>(base) + offset);
        }
      };
      put(row, Dq, q.data_ptr(), t * Dq);
      put(row + Dq, Dkv, key_cache.data_ptr(), slot[t] * Dkv);
      put(row + Dq + Dkv, Dkv, value_cache.data_ptr(), slot[t] * Dkv);
    }
  });
  at::Tensor attended = at::empty({N, H, hd}, options.dtype(cache_type));
  const AttnArgs attn{q.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), bf16, N, H, Hkv, hd,
                      tables.data_ptr<int64_t>(), tables.size(1), sequence.data_ptr<int64_t>(),
                      positions.data_ptr<int64_t>(), block_size, window, static_cast<float>(scale),
                      attended.data_ptr()};
  run_attention(attn, max_keys, path);
  const Activations heads(N, Dq, options);
  run_quantize({attended.data_ptr(), bf16, N, Dq, heads.q.data_ptr<int8_t>(), heads.d.data_ptr<float>(),
                heads.s.data_ptr<int32_t>()}, path);
  add_projection(heads, weights[O], qtypes[1], POST_ATTN_NORM);

  // MLP.
  norm_quantize(hidden, weights[FFN_NORM].data_ptr<float>());
  at::Tensor gate_up = at::empty({N, 2 * I}, options);
  float* gu = gate_up.data_ptr<float>();
  project(hidden, weights[GATE_UP], qtypes[2], 2 * I, gu, false, path);
  const Activations act(N, I, options);
  at::parallel_for(0, N, row_grain(2 * I), [&](int64_t r0, int64_t r1) {
    std::vector<float> a(I);
    for (int64_t t = r0; t < r1; ++t) {
      const float* g = gu + t * 2 * I;
      gated(g, g + I, a.data(), I, activation, path);
      run_quantize(act.row(a.data(), t), path);
    }
  });
  add_projection(act, weights[DOWN], qtypes[3], POST_FFN_NORM);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
                   "workbench rms_norm: x and weight must be float32, got ", x.scalar_type(), " and ",
                   weight.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && x.device().is_cpu() && weight.device().is_cpu() && weight.dim() == 1 &&
                    weight.size(0) == x.size(1), "workbench rms_norm: x must be [N, D] and weight [D] on the CPU, got ",
                    x.sizes(), " and ", weight.sizes());
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  const int64_t N = xc.size(0), D = xc.size(1);
  at::Tensor out = at::empty({N, D}, xc.options());
  const float* xs = xc.data_ptr<float>();
  const float* w = wc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, N, row_grain(D), [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) norm_row(xs + i * D, w, D, static_cast<float>(eps), o + i * D);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, const at::Tensor& inv_freq) {
  TORCH_CHECK_TYPE(positions.scalar_type() == at::kLong && inv_freq.scalar_type() == at::kFloat,
                   "workbench rope_tables: positions must be int64 and inv_freq float32, got ",
                   positions.scalar_type(), " and ", inv_freq.scalar_type());
  TORCH_CHECK_VALUE(positions.dim() == 1 && inv_freq.dim() == 1 && positions.device().is_cpu() &&
                    inv_freq.device().is_cpu(), "workbench rope_tables: positions [N] and inv_freq [hd/2] on the "
                    "CPU, got ", positions.sizes(), " and ", inv_freq.sizes());
  const at::Tensor pc = positions.contiguous(), fc = inv_freq.contiguous();
  const int64_t N = pc.size(0), half = fc.size(0);
  at::Tensor cos = at::empty({N, half}, fc.options()), sin = at::empty({N, half}, fc.options());
  const int64_t* p = pc.data_ptr<int64_t>();
  const float* f = fc.data_ptr<float>();
  float* c = cos.data_ptr<float>();
  float* s = sin.data_ptr<float>();
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(static_cast<float>(p[t]) * f[i]);
      c[t * half + i] = static_cast<float>(std::cos(angle));
      s[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return {cos, sin};
}

}  // namespace
}  // namespace workbench_cpu

TORCH_LIBRARY_FRAGMENT(workbench, m) {
  m.def("decoder_layer(Tensor(a!) x, Tensor[] weights, int[] qtypes, int[] shape, Tensor cos, Tensor sin, "
        "Tensor(b!) key_cache, Tensor(c!) value_cache, Tensor slot_mapping, Tensor block_tables, "
        "Tensor token_sequence, Tensor positions, int block_size, int? sliding_window, float scale, float eps, "
        "int activation=0, int path=-1) -> ()");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rope_tables(Tensor positions, Tensor inv_freq) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(workbench, CPU, m) {
  m.impl("decoder_layer", &workbench_cpu::decoder_layer);
  m.impl("rms_norm", &workbench_cpu::rms_norm);
  m.impl("rope_tables", &workbench_cpu::rope_tables);
}
