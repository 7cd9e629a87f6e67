"""y = x @ W.T for ggml Q4_0/Q4_1/Q8_0 weights W on the CPU, through the native ops (engine/kernels/cpu/ops.cpp).

Activations are quantized per 32-block to int8 with an fp32 scale and the block's sum (`quantize_q8_1`),
each block's integer dot product is exact, and the fp32 epilogue runs over the blocks in order, the same
arithmetic in every code path (engine/kernels/cpu/qgemm.h): a row's output is the same bits whatever the batch,
the thread count or the path.

Paths: "scalar" (any CPU), "avx2", "avx512" (AVX-512 VNNI), "amx" (AMX-INT8 tiles for every 16 rows, the
VNNI code for the rest: the same bits), or "auto", the best this CPU has. A call's
`path` argument wins, else $WORKBENCH_CPU_KERNEL, else auto (WORKBENCH_CPU_KERNEL=off: no native kernels).
Call `native_available()` first: where it is
False the ops do not exist (engine/kernels/cpu/build.py says why) and callers use torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine import environment
from engine.kernels.cpu import build

PATHS = {"auto": -1, "scalar": 0, "avx2": 1, "avx512": 2, "amx": 3}
_ready = False  # library loaded and fake kernels registered
# The library's other ops' fake kernels (engine/kernels/cpu/paged_attention.py), registered with these at load.
FAKE_REGISTRARS: list[Callable[[], None]] = []


def native_available() -> bool:
    """True when the native library is loaded (building it on first call); its fake kernels are then
    registered too, so the ops trace under torch.compile."""
    global _ready
    if not _ready and build.ensure_loaded():
        _register_fakes()
        for register in FAKE_REGISTRARS:
            register()
        _ready = True
    return _ready


def _ops() -> torch._ops._OpNamespace:
    if not _ready and not native_available():
        raise RuntimeError(f"native CPU kernels unavailable: {build.unavailable_reason()}")
    return torch.ops.workbench


def _path_id(path: str | None) -> int:
    name = path or environment.read("WORKBENCH_CPU_KERNEL") or "auto"
    if name not in PATHS:
        raise ValueError(f"unknown CPU kernel path {name!r}: one of {', '.join(PATHS)}")
    return PATHS[name]


def cpu_paths() -> list[str]:
    """The paths this CPU can run, e.g. ["scalar", "avx2"]."""
    names = {v: k for k, v in PATHS.items()}
    return [names[int(p)] for p in _ops().cpu_paths()]


def quantize_q8_1(x: torch.Tensor, path: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] float32/bfloat16 -> (q int8 [M, K], d float32 [M, K/32], s int32 [M, K/32]):
    per block d = amax/127, q = clamp(round_half_even(x/d), -127, 127), s = sum of q. Finite inputs only."""
    q, d, s = _ops().quantize_q8_1.default(x, _path_id(path))
    return q, d, s


def qgemm(q: torch.Tensor, d: torch.Tensor, s: torch.Tensor, packed: torch.Tensor, qtype: int, n: int,
          out_dtype: torch.dtype | None = None, path: str | None = None) -> torch.Tensor:
    """Quantized activations (from quantize_q8_1) times the packed weight (engine.kernels.cpu.pack) -> [M, n]
    float32, or bfloat16 for out_dtype=torch.bfloat16 (the fp32 result rounded once)."""
    out: torch.Tensor = _ops().qgemm.default(q, d, s, packed, int(qtype), n, out_dtype, _path_id(path))
    return out


def qlinear(x: torch.Tensor, packed: torch.Tensor, qtype: int, n: int, out_dtype: torch.dtype | None = None,
            path: str | None = None) -> torch.Tensor:
    """quantize_q8_1 then qgemm in one op: x [M, K] float32/bfloat16 -> [M, n]."""
    out: torch.Tensor = _ops().qlinear.default(x, packed, int(qtype), n, out_dtype, _path_id(path))
    return out


def _register_fakes() -> None:
    """Shape-and-dtype kernels for FakeTensor tracing (torch.compile, opcheck)."""

    @torch.library.register_fake("workbench::quantize_q8_1")
    def _quantize_fake(x: torch.Tensor, path: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        torch._check(x.dim() == 2 and x.shape[1] % 32 == 0, lambda: "x must be [M, K], K a multiple of 32")
        m, k = x.shape
        return (x.new_empty((m, k), dtype=torch.int8), x.new_empty((m, k // 32), dtype=torch.float32),
                x.new_empty((m, k // 32), dtype=torch.int32))

    @torch.library.register_fake("workbench::qgemm")
    def _qgemm_fake(q: torch.Tensor, d: torch.Tensor, s: torch.Tensor, w: torch.Tensor, qtype: int, n: int,
                    out_dtype: torch.dtype | None = None, path: int = -1) -> torch.Tensor:
        return q.new_empty((q.shape[0], n), dtype=out_dtype or torch.float32)

    @torch.library.register_fake("workbench::qlinear")
    def _qlinear_fake(x: torch.Tensor, w: torch.Tensor, qtype: int, n: int, out_dtype: torch.dtype | None = None,
                      path: int = -1) -> torch.Tensor:
        return x.new_empty((x.shape[0], n), dtype=out_dtype or torch.float32)
