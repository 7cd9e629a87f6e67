"""Microbenchmark: QuantizedLinear (GGUF Q4_0/Q4_1/Q8_0 kept quantized) vs F.linear on the dequantized fp32
weight, for SmolLM2-135M's projection shapes at batch 1 and 8, on 2 CPU threads.

    .venv/bin/python bench/quantized_linear.py [--types Q4_0,Q4_1,Q8_0] [--reps 30]

Columns, microseconds per call (the fastest of --reps calls: the machines are shared, and the minimum is
the least disturbed), each QuantizedLinear column with its ratio to `fp32 linear`:
    fp32 linear   F.linear(x, W) with W = gguf dequantized, float32
    q fp32        QuantizedLinear(x) for float32 x, the route it picks (int4 kernel at 1 row for Q4,
                  else dequantize + F.linear)
    q fp32 kern   the int4 kernel forced for float32 x (exact weights; torch's scalar loop on x86)
    q fp32 deq    dequantize + F.linear forced for float32 x
    bf16 linear   F.linear(x, W) in bfloat16
    q bf16        QuantizedLinear(x) for bfloat16 x (the kernel's vectorized path)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from engine.model import quantized  # noqa: E402
from engine.model.quantized import QuantizedLinear  # noqa: E402

D, FFN = 576, 1536
SHAPES = {  # name: (out, in)
    "q/o 576": (D, D), "k/v 192": (192, D), "qkv 960": (960, D),
    "gate/up 1536": (FFN, D), "gate_up 3072": (2 * FFN, D), "down 576x1536": (D, FFN),
}


def best_us(call, reps: int) -> float:
    call()
    call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def forced(linear: QuantizedLinear, x: torch.Tensor, max_rows: int):
    def call():
        saved = quantized.FP32_KERNEL_MAX_ROWS
        quantized.FP32_KERNEL_MAX_ROWS = dict.fromkeys(saved, max_rows)
        try:
            return linear(x)
        finally:
            quantized.FP32_KERNEL_MAX_ROWS = saved
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_0,Q4_1,Q8_0")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    columns = ["fp32 linear", "q fp32", "q fp32 kern", "q fp32 deq", "bf16 linear", "q bf16"]
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads, best of {args.reps}, us per call (ratio to fp32 linear)")
    print(f"{'type':5s} {'shape':14s} {'batch':>5s} " + " ".join(f"{c:>17s}" for c in columns))
    with torch.no_grad():
        for name in args.types.split(","):
            qtype = gguf.GGMLQuantizationType[name]
            for shape_name, (out, inp) in SHAPES.items():
                raw = gguf.quants.quantize(rng.standard_normal((out, inp)).astype(np.float32), qtype)
                linear = QuantizedLinear.from_ggml(raw, qtype, inp)
                weight = linear.dequantize()
                weight_bf16 = weight.bfloat16()
                for batch in (1, 8):
                    x = torch.randn(batch, inp)
                    xb = x.bfloat16()
                    times = [
                        best_us(lambda: F.linear(x, weight), args.reps),
                        best_us(lambda: linear(x), args.reps),
                        best_us(forced(linear, x, 1 << 30), args.reps),
                        best_us(forced(linear, x, 0), args.reps),
                        best_us(lambda: F.linear(xb, weight_bf16), args.reps),
                        best_us(lambda: linear(xb), args.reps),
                    ]
                    cells = [f"{times[0]:8.0f}{'':9s}"] + [f"{t:8.0f} ({t / times[0]:5.2f}x)" for t in times[1:]]
                    print(f"{name:5s} {shape_name:14s} {batch:5d} " + " ".join(f"{c:>17s}" for c in cells),
                          flush=True)


if __name__ == "__main__":
    main()
