"""The small building blocks of a Llama decoder layer: RMSNorm, the gated MLP, and Linear/Embedding
that skip their random initialisation on the meta device.

Float projections on the CPU run on our dense kernel (engine/kernels/cpu/dense.py) wherever it is built:
its rows are the same bits at every row count, on every CPU, where torch's F.linear changes its blocking
(and on AMX its tiles) with the row count. On CUDA they run on the Triton GEMM of the same promise
(engine/kernels/gpu/triton_linear.py) where the engine chose it (`invariant_gemm_choice`), since cuBLAS
picks its algorithm by shape. Training (autograd through the weights), other devices, and a machine
without the kernels take F.linear."""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from engine.kernels import cpu as cpu_kernels


def float_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 invariant_gemm: bool = False) -> torch.Tensor:
    """F.linear's result, batch-invariant where our dense kernel can compute it (CPU), or the Triton GEMM
    (CUDA, where `invariant_gemm`)."""
    # Neither op has a backward: only a forward that autograd records (training) takes F.linear.
    records = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if (x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype in cpu_kernels.DENSE_DTYPES
            and weight.dtype in cpu_kernels.DENSE_DTYPES and not records and cpu_kernels.native_available()):
        return cpu_kernels.dense_linear(x, weight, bias)
    if invariant_gemm and x.is_cuda and not records:
        from engine.kernels.gpu import triton_linear  # imports triton: only where the engine chose it

        return triton_linear.invariant_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def invariant_gemm_choice(device: torch.device, allowed: bool = True) -> tuple[bool, str]:
    """(whether float projections on `device` take the batch-invariant Triton GEMM, why): on CUDA where
    triton imports, unless `allowed` is off (EngineConfig.invariant_gemm); the CPU has its own kernel."""
    if device.type != "cuda":
        return False, f"the Triton GEMM is for CUDA, not {device.type}"
    if not allowed:
        return False, "ARC_INVARIANT_GEMM is off"
    from engine.kernels.gpu import triton_linear

    if not triton_linear.available():
        return False, "the triton package is not installed"
    return True, "CUDA and triton present"


class Linear(nn.Linear):
    """nn.Linear that does not draw random weights on the meta device: the loader builds the model there
    and loads real weights after, and the first random init on meta imports torch._dynamo (1.2 s of
    every process start, measured). Anywhere else (training) it initialises as nn.Linear does."""

    invariant_gemm = False  # float_linear's; set for a whole model by LlamaForCausalLM.set_invariant_gemm

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return float_linear(x, self.weight, self.bias, self.invariant_gemm)


class FusedFloatLinear:
    """Several float projections of one input as one matmul over fuse_linears' weight. Not a module, so
    that the parts keep their own parameters and HF names."""

    invariant_gemm = False  # as Linear's

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return float_linear(x, self.weight, self.bias, self.invariant_gemm)


class Embedding(nn.Embedding):
    """nn.Embedding with the same exception as Linear."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class RMSNorm(nn.Module):
    """Root-mean-square norm; the statistics run in fp32 whatever the activation dtype (as HF does)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the casts below are no-ops in fp32; skipping them saves op overhead
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        input_dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(input_dtype)

    def triton_forward(self, x: torch.Tensor) -> torch.Tensor:
        """forward as one Triton row kernel (engine/kernels/gpu/triton_add_rmsnorm.py): a row's bits do not
        depend on the row count, and a step on the Triton backend launches one kernel, not eight ops."""
        from engine.kernels.gpu.triton_add_rmsnorm import rmsnorm

        return rmsnorm(x, self.weight, self.eps)

    def triton_add(self, out: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(forward(residual + out), residual + out) in one Triton kernel, with the module path's roundings."""
        from engine.kernels.gpu.triton_add_rmsnorm import add_rmsnorm

        return add_rmsnorm(out, residual, self.weight, self.eps)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh")}


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with silu (Llama), GeGLU with tanh-approximated gelu (Gemma)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, activation: str = "silu") -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)
        self.activation = activation  # HF's hidden_act name
        self.act = ACTIVATIONS[activation]
        self._gate_up: Callable[[torch.Tensor], torch.Tensor] | None = None

    def fuse_for_inference(self) -> None:
        self._gate_up = fuse_projections(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._gate_up is None:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self._gate_up(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)

    def triton_forward(self, x: torch.Tensor) -> torch.Tensor:
        """forward in a step on the Triton backend: with the projections fused, the activation and the
        multiply in one kernel (engine/kernels/gpu/triton_gated_act.py), the same roundings."""
        if self._gate_up is None:
            return self.forward(x)
        from engine.kernels.gpu.triton_gated_act import gated_act

        return self.down_proj(gated_act(self._gate_up(x), self.activation))


def fuse_projections(*projections: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """One call computing several projections of the same input, concatenated: one larger matmul per
    step instead of several. Float Linears share one weight (fuse_linears); quantized ones (GGUF
    weights served as stored, on the CPU or on CUDA) one module. For inference, after the weights are
    loaded."""
    linears = [p for p in projections if isinstance(p, nn.Linear)]
    if len(linears) == len(projections):
        return FusedFloatLinear(*fuse_linears(*linears))
    # Imported only here: they need the gguf package, which a float model (and the GPU image) lacks.
    from engine.kernels.gpu.cuda_int4 import CudaInt4Linear, fuse_cuda_int4
    from engine.model.quantized import QuantizedLinear, fuse_quantized

    quantized = [p for p in projections if isinstance(p, QuantizedLinear)]
    if len(quantized) == len(projections):
        return fuse_quantized(*quantized)
    on_cuda = [p for p in projections if isinstance(p, CudaInt4Linear)]
    if len(on_cuda) == len(projections) and len({p.qtype for p in on_cuda}) == 1:
        return fuse_cuda_int4(*on_cuda)
    if on_cuda and not quantized:
        # On CUDA a file may mix Q4_0/Q4_1 parts (served int4) with parts of other types (dequantized):
        # each part its own matmul, the outputs concatenated.
        return partial(_concatenated, projections)
    raise ValueError("cannot fuse quantized and float projections of one input")


def _concatenated(projections: tuple[nn.Module, ...], x: torch.Tensor) -> torch.Tensor:
    return torch.cat([projection(x) for projection in projections], dim=-1)


def fuse_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several projections of the same input, so a step runs one matmul
    instead of several; each module's parameters become views into it, so memory is not doubled and
    their HF names stay valid. For inference: the fused tensors are not parameters."""
    with torch.no_grad():
        weight = torch.cat([linear.weight for linear in linears])
        sizes = [linear.out_features for linear in linears]
        for linear, part in zip(linears, weight.split(sizes)):
            linear.weight.data = part
        bias = None
        if linears[0].bias is not None:
            bias = torch.cat([linear.bias for linear in linears])
            for linear, part in zip(linears, bias.split(sizes)):
                linear.bias.data = part
    return weight, bias
