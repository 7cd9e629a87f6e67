"""y = x @ W.T + b for float weights (float32, bfloat16, float16) on the CPU, through the native op
(engine/kernels/cpu/dense_ops.cpp): the float models' counterpart of qlinear.

Each output element is computed in fp32 in one fixed order (16 lane sums over k, then a fixed tree; written
out in engine/kernels/cpu/dense_gemm.h), so a row's output is the same bits whatever the batch, the thread
count or the SIMD path, on every CPU. torch's F.linear promises none of this: oneDNN and MKL choose their
blocking by the row count, and on Intel's AMX their tiles too, so a float model served on them gives a
request other bits beside other requests.

`native_available()` (engine/kernels/cpu/qgemm.py) first; paths as there.
"""

from __future__ import annotations

import torch

from engine.kernels.cpu.qgemm import FAKE_REGISTRARS, _ops, _path_id

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 path: str | None = None) -> torch.Tensor:
    """x [..., K] float -> [..., N] in x's dtype, for weight [N, K] and bias [N] (any of DTYPES)."""
    rows = x.reshape(-1, x.shape[-1])
    out: torch.Tensor = _ops().dense_linear.default(rows, weight, bias, _path_id(path))
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _register_fakes() -> None:
    @torch.library.register_fake("workbench::dense_linear")
    def _dense_fake(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, path: int = -1) -> torch.Tensor:
        torch._check(x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1], lambda: "x [M, K], w [N, K]")
        return x.new_empty((x.shape[0], w.shape[0]))


FAKE_REGISTRARS.append(_register_fakes)
