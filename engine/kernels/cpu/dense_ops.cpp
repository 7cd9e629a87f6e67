// The dense float GEMM as a torch op (namespace `workbench`), the float weights' counterpart of qlinear:
//
//   dense_linear(x [M, K] f32/bf16/f16, w [N, K] f32/bf16/f16, bias [N]?, path) -> y [M, N] in x's dtype
//
// y = x @ w.T + bias computed in fp32 in dense_gemm.h's fixed order, then rounded once to x's dtype (as
// F.linear returns it). Threads split the output columns, never K, and the path never depends on M, so a
// row's result is the same bits in any batch, with any thread count, on any path. This is what torch's
// matmuls do not promise: oneDNN and MKL choose their blocking (and on AMX their tiles) by the row count.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>

#include "dense_gemm.h"
#include "dispatch.h"

namespace workbench_cpu {
namespace {

// Output columns a thread takes at least: one row of a 576-wide projection still splits over two threads.
constexpr int64_t DENSE_GRAIN_COLUMNS = 64;

bool float_type(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

int weight_type(at::ScalarType t) { return t == at::kFloat ? W_F32 : t == at::kBFloat16 ? W_BF16 : W_F16; }

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                        int64_t path) {
  path = resolve(path);
  TORCH_CHECK_VALUE(x.device().is_cpu() && w.device().is_cpu(), "workbench dense_linear: x and w must be on the "
                    "CPU, got ", x.device(), " and ", w.device());
  TORCH_CHECK_TYPE(float_type(x.scalar_type()) && float_type(w.scalar_type()), "workbench dense_linear: x and w "
                   "must be float32, bfloat16 or float16, got ", x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "workbench dense_linear: x must be "
                    "[M, K] and w [N, K], got ", x.sizes(), " and ", w.sizes());
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  at::Tensor b;
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->device().is_cpu() && float_type(bias->scalar_type()) && bias->dim() == 1 &&
                      bias->size(0) == N, "workbench dense_linear: bias must be a float [", N, "] on the CPU, got ",
                      bias->scalar_type(), " ", bias->sizes(), " on ", bias->device());
    b = bias->to(at::kFloat).contiguous();
  }
  const at::Tensor xf = x.to(at::kFloat).contiguous(), wc = w.contiguous();
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  if (M > 0 && N > 0) {
    const DenseArgs args{xf.data_ptr<float>(), wc.data_ptr(), weight_type(w.scalar_type()),
                         b.defined() ? b.data_ptr<float>() : nullptr, M, N, K, y.data_ptr<float>()};
    at::parallel_for(0, N, DENSE_GRAIN_COLUMNS, [&](int64_t n0, int64_t n1) {
      if (path == SCALAR) dense_scalar(args, n0, n1);
      else if (path == AVX2) dense_avx2(args, n0, n1);
      else dense_avx512(args, n0, n1);
    });
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace
}  // namespace workbench_cpu

TORCH_LIBRARY_FRAGMENT(workbench, m) {
  m.def("dense_linear(Tensor x, Tensor w, Tensor? bias=None, int path=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(workbench, CPU, m) { m.impl("dense_linear", &workbench_cpu::dense_linear); }
