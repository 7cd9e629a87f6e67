"""Microbenchmark: our dense float GEMM (engine/kernels/cpu/dense.py) against torch's F.linear on the same
weights, for SmolLM2-135M's projection shapes at 1, 8, 64 and 256 rows, on this machine's torch threads.

    .venv/bin/python bench/dense_gemm.py [--rows 1,8,64,256] [--reps 20]

Microseconds per call (the fastest of --reps: the machines are shared, and the minimum is the least
disturbed), each of ours with its ratio to torch's (above 1: ours is faster). Weights random, as the shapes
alone set the cost:
    torch bf16    F.linear(x, W) with x and W bfloat16 (oneDNN; AMX tiles where the CPU has them)
    ours bf16     dense_linear(x, W) with x and W bfloat16
    torch fp32    F.linear(x, W) in float32 (MKL / oneDNN)
    ours fp32     dense_linear(x, W) in float32
Torch's rows may change bits with the row count; ours do not (tests/kernels/test_cpu_dense_gemm.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from engine.kernels import cpu  # noqa: E402

D, FFN, VOCAB = 576, 1536, 49152
SHAPES = {"qkv 960x576": (960, D), "o 576x576": (D, D), "gate_up 3072x576": (2 * FFN, D),
          "down 576x1536": (D, FFN), "head 49152x576": (VOCAB, D)}


def best_us(call, reps: int) -> float:
    call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,64,256")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if not cpu.native_available():
        sys.exit(f"native CPU kernels unavailable: {cpu.unavailable_reason()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, paths {cpu.cpu_paths()}, "
          f"oneDNN ISA {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'shape':>18} {'rows':>5} {'torch bf16':>11} {'ours bf16':>16} {'torch fp32':>11} {'ours fp32':>16}")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, (n, k) in SHAPES.items():
            w32 = torch.randn(n, k, generator=g) / k ** 0.5
            w16 = w32.bfloat16()
            for rows in (int(r) for r in args.rows.split(",")):
                reps = max(3, args.reps // 4) if n * rows > 2 ** 22 else args.reps
                x32 = torch.randn(rows, k, generator=g)
                x16 = x32.bfloat16()
                t16 = best_us(lambda: F.linear(x16, w16), reps)
                o16 = best_us(lambda: cpu.dense_linear(x16, w16), reps)
                t32 = best_us(lambda: F.linear(x32, w32), reps)
                o32 = best_us(lambda: cpu.dense_linear(x32, w32), reps)
                print(f"{name:>18} {rows:>5} {t16:>11.0f} {o16:>9.0f} ({t16 / o16:4.2f}x) {t32:>11.0f} "
                      f"{o32:>9.0f} ({t32 / o32:4.2f}x)")


if __name__ == "__main__":
    main()
