"""Residual add and RMSNorm in one Triton kernel: a decoder layer's `x = residual + x; h = norm(x)`.

A decode step runs this pair twice per layer on a few rows; as two torch ops it reads x and the
residual, writes their sum, reads the sum back and writes the normed rows: four passes and two launches
where one pass and one launch do. One program per row:

    total  = round(x + residual)                              (to the activations' dtype, as torch's add)
    normed = weight * round(total * rsqrt(mean(total^2) + eps))  (statistics in float32, as RMSNorm)

and both come back: `total` is the residual stream the next sublayer adds to. `rmsnorm` is the same
kernel without the add, for the norms no add precedes. The arithmetic follows
engine/model/layers.py's RMSNorm step for step (in float32 the roundings are no-ops). Gemma's `1 + w`
scale needs no variant: the loader folds the 1 into the stored weight (engine/loading/loader.py). Runs
on CUDA, and on the CPU under TRITON_INTERPRET=1 (tests only).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path serves where Triton is missing
    triton = None


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, residual_ptr, weight_ptr, normed_ptr, total_ptr, eps,
                            stride_x, stride_r, stride_n, stride_t,
                            HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < HIDDEN
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            residual = tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
            total = (x + residual).to(total_ptr.dtype.element_ty)        # [HIDDEN]: the residual stream
            tl.store(total_ptr + row * stride_t + cols, total, mask=ok)
            total32 = total.to(tl.float32)
        else:  # the norm alone: x is the "total", already in its dtype
            total32 = x
        mean_square = tl.sum(total32 * total32, 0) / HIDDEN
        scaled = (total32 * tl.rsqrt(mean_square + eps)).to(total_ptr.dtype.element_ty).to(tl.float32)
        weight = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(normed_ptr + row * stride_n + cols, (weight * scaled).to(normed_ptr.dtype.element_ty), mask=ok)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., hidden] (same dtype), weight [hidden] -> (normed, x + residual): normed in
    torch's promotion of weight and x (as `weight * rows` gives), the sum in x's dtype."""
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} and residual {tuple(residual.shape)} {residual.dtype} differ")
    return _launch(x, residual, weight, eps)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The norm alone, x [..., hidden] -> normed: the RMSNorm module's arithmetic, one program per row, so
    that a row's bits never follow the row count (torch's reduction may split a row across blocks when
    the rows are few). For the norms that no add precedes: the first layer's, q/k norms, Gemma's
    sandwich norms."""
    return _launch(x, None, weight, eps)[0]


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if triton is None:
        raise RuntimeError("Triton add + RMSNorm: the triton package is not installed")
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight {tuple(weight.shape)} does not match hidden size {hidden}")
    rows_x = x.reshape(-1, hidden)  # a view where the rows are strided
    rows_r = rows_x if residual is None else residual.reshape(-1, hidden)
    if rows_x.stride(-1) != 1 or rows_r.stride(-1) != 1:
        rows_x, rows_r = rows_x.contiguous(), rows_r.contiguous()
    total = rows_x if residual is None else torch.empty_like(rows_x)  # the norm alone stores no sum
    normed = torch.empty(rows_x.shape, dtype=torch.result_type(weight, x), device=x.device)
    if rows_x.shape[0]:
        _add_rmsnorm_kernel[(rows_x.shape[0],)](
            rows_x, rows_r, weight.contiguous(), normed, total, eps,
            rows_x.stride(0), rows_r.stride(0), normed.stride(0), total.stride(0),
            HIDDEN=hidden, BLOCK=triton.next_power_of_2(hidden), HAS_RESIDUAL=residual is not None)
    return normed.view(x.shape), (x if residual is None else total.view(x.shape))
