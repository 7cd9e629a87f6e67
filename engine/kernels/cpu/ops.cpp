// The torch ops (namespace `workbench`): argument checks, the choice of code path, and the thread split.
//
//   quantize_q8_1(x [M, K] f32/bf16, path) -> (q int8 [M, K], d f32 [M, K/32], s int32 [M, K/32])
//   qgemm(q, d, s, w packed uint8, qtype, n, out_dtype, path) -> y [M, n]   y = x @ W.T
//   qlinear(x, w, qtype, n, out_dtype, path) -> y [M, n]   both in one call (one dispatch, not two)
//   cpu_paths() -> int[]   the paths this CPU can run (0 scalar, 1 AVX2, 2 AVX-512 VNNI, 3 AMX-INT8)
// path -1 is the best the CPU has. Threads split the output columns in tiles of a fixed size, never the
// K reduction, and the path never depends on M: a row's result is the same bits in any batch, with any
// thread count.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "dispatch.h"
#include "drivers.h"

namespace workbench_cpu {
namespace {

// Column groups (8 columns each) a thread takes at least: 32 columns, so even one row of a 576-wide
// projection is shared by the threads.
constexpr int64_t TILE_GROUPS = 4;
// Quantizer rows per task: rows are independent, the split only keeps tiny inputs on one thread.
constexpr int64_t QUANT_GRAIN_ELEMS = 1 << 14;

std::vector<int64_t> cpu_paths() {
  std::vector<int64_t> paths{SCALAR};
  if (has_avx2()) paths.push_back(AVX2);
  if (has_avx512()) paths.push_back(AVX512);
  if (has_amx()) paths.push_back(AMX);
  return paths;
}

void check_x(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), "workbench cpu kernel: x must be on the CPU, got ", x.device());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                   "workbench cpu kernel: x must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2, "workbench cpu kernel: x must be 2-D [M, K], got shape ", x.sizes());
  TORCH_CHECK_VALUE(x.size(1) > 0 && x.size(1) % QK == 0,
                    "workbench cpu kernel: K (x.shape[1]) must be a positive multiple of 32, got ", x.size(1));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_into(const at::Tensor& x_in, int64_t path) {
  check_x(x_in);
  path = resolve(path);
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, K / QK}, x.options().dtype(at::kFloat));
  at::Tensor s = at::empty({M, K / QK}, x.options().dtype(at::kInt));
  const QuantArgs args{x.data_ptr(), x.scalar_type() == at::kBFloat16, M, K,
                       q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<int32_t>()};
  run_quantize(args, path);
  return {q, d, s};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_q8_1(const at::Tensor& x, int64_t path) {
  return quantize_into(x, path);
}

at::Tensor gemm(const at::Tensor& q, const at::Tensor& d, const at::Tensor& s, const at::Tensor& w,
                int64_t qtype, int64_t n, std::optional<at::ScalarType> out_dtype, int64_t path) {
  path = resolve(path);
  TORCH_CHECK_VALUE(known_qtype(qtype), "workbench qgemm: qtype must be ", QTYPES_ACCEPTED, ", got ", qtype);
  TORCH_CHECK_TYPE(q.scalar_type() == at::kChar && d.scalar_type() == at::kFloat && s.scalar_type() == at::kInt,
                   "workbench qgemm: activations must be (int8, float32, int32), got (", q.scalar_type(), ", ",
                   d.scalar_type(), ", ", s.scalar_type(), ")");
  TORCH_CHECK_VALUE(q.dim() == 2 && q.size(1) > 0 && q.size(1) % QK == 0,
                    "workbench qgemm: q must be [M, K] with K a positive multiple of 32, got ", q.sizes());
  const int64_t M = q.size(0), K = q.size(1), nb = K / QK;
  TORCH_CHECK_VALUE(d.sizes() == s.sizes() && d.dim() == 2 && d.size(0) == M && d.size(1) == nb,
                    "workbench qgemm: d and s must be [M, K/32] = [", M, ", ", nb, "], got ", d.sizes(), " and ",
                    s.sizes());
  TORCH_CHECK_VALUE(n > 0, "workbench qgemm: n (output features) must be positive, got ", n);
  const int64_t G = (n + GROUP - 1) / GROUP;
  TORCH_CHECK_TYPE(w.scalar_type() == at::kByte, "workbench qgemm: packed weights must be uint8, got ",
                   w.scalar_type());
  TORCH_CHECK_VALUE(w.is_contiguous() && w.numel() == G * nb * group_bytes(qtype),
                    "workbench qgemm: packed weights for n=", n, ", K=", K, " must be ", G * nb * group_bytes(qtype),
                    " contiguous bytes, got ", w.numel(), " (shape ", w.sizes(), ")");
  const at::ScalarType odt = out_dtype.value_or(at::kFloat);
  TORCH_CHECK_TYPE(odt == at::kFloat || odt == at::kBFloat16, "workbench qgemm: out_dtype must be float32 or "
                   "bfloat16, got ", odt);
  for (const at::Tensor* t : {&q, &d, &s, &w})
    TORCH_CHECK_VALUE(t->device().is_cpu(), "workbench qgemm: every input must be on the CPU, got ", t->device());
  const at::Tensor qc = q.contiguous(), dc = d.contiguous(), sc = s.contiguous();
  at::Tensor y = at::empty({M, n}, q.options().dtype(odt));
  if (M == 0) return y;
  const bool bf16 = odt == at::kBFloat16;
  const GemmArgs args{qc.data_ptr<int8_t>(), dc.data_ptr<float>(), sc.data_ptr<int32_t>(), w.data_ptr<uint8_t>(),
                      int(qtype), M, n, K, bf16 ? nullptr : y.data_ptr<float>(),
                      bf16 ? reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()) : nullptr};
  run_gemm(args, path);
  return y;
}

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& w, int64_t qtype, int64_t n,
                   std::optional<at::ScalarType> out_dtype, int64_t path) {
  auto [q, d, s] = quantize_into(x, path);
  return gemm(q, d, s, w, qtype, n, out_dtype, path);
}

}  // namespace

void run_quantize(const QuantArgs& a, int64_t path) {
  const int64_t grain = std::max<int64_t>(1, QUANT_GRAIN_ELEMS / a.K);
  at::parallel_for(0, a.M, grain, [&](int64_t r0, int64_t r1) {
    if (path == SCALAR) quantize_scalar(a, r0, r1);
    else quantize_avx2(a, r0, r1);  // the AVX-512 path quantizes with AVX2: same bits either way
  });
}

void run_gemm(const GemmArgs& a, int64_t path) {
  at::parallel_for(0, (a.N + GROUP - 1) / GROUP, TILE_GROUPS, [&](int64_t g0, int64_t g1) {
    if (path == SCALAR) gemm_scalar(a, g0, g1);
    else if (path == AVX2) gemm_avx2(a, g0, g1);
    else if (path == AVX512 || a.M < AMX_TILE_ROWS) gemm_avx512(a, g0, g1);  // no full tile: the same bits
    else gemm_amx(a, g0, g1);
  });
}

}  // namespace workbench_cpu

TORCH_LIBRARY(workbench, m) {
  m.def("quantize_q8_1(Tensor x, int path=-1) -> (Tensor, Tensor, Tensor)");
  m.def("qgemm(Tensor q, Tensor d, Tensor s, Tensor w, int qtype, int n, ScalarType? out_dtype=None, "
        "int path=-1) -> Tensor");
  m.def("qlinear(Tensor x, Tensor w, int qtype, int n, ScalarType? out_dtype=None, int path=-1) -> Tensor");
  m.def("cpu_paths() -> int[]", &workbench_cpu::cpu_paths);  // no tensor to dispatch on: a catch-all
}

TORCH_LIBRARY_IMPL(workbench, CPU, m) {
  m.impl("quantize_q8_1", &workbench_cpu::quantize_q8_1);
  m.impl("qgemm", &workbench_cpu::gemm);
  m.impl("qlinear", &workbench_cpu::qlinear);
}
