"""Microbenchmark: our native ggml kernels (kernels/cpu) vs torch's int4 kernel and a bf16 F.linear, for
SmolLM2-135M's shapes at 1, 8 and 64 rows, side by side in one run.

    .venv/bin/python bench/cpu_kernels.py [--rows 1,8,64] [--types Q4_0,Q4_1] [--budget 0.3]

Columns, microseconds per call (the fastest of the calls made within --budget seconds, at least 5: the
machines are shared, and the minimum is the least disturbed); bfloat16 activations in and out everywhere:
    ours 1T / 2T  kernels.cpu.qlinear, auto path, torch.set_num_threads(1) / (2)
    int4          QuantizedLinear (engine/model/quantized.py): torch's _weight_int4pack_mm_for_cpu, 2 threads
    bf16          F.linear on the dequantized weight in bfloat16, 2 threads
    int4/ours, bf16/ours   the ratios to `ours 2T` (above 1: ours is faster)
The projections are random weights quantized with gguf in each --types; the head is Q8_0, as in the GGUF.
The last lines check that at 1 row two threads beat one (the output columns are split, so they should).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from engine.model.quantized import QuantizedLinear  # noqa: E402
from kernels import cpu  # noqa: E402

Q = gguf.GGMLQuantizationType
SHAPES = {"attn_q": (576, 576), "ffn_up": (1536, 576), "ffn_down": (576, 1536), "head": (49152, 576)}


def best_us(fn: Callable[[], object], budget: float) -> float:
    for _ in range(2):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < budget:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--types", default="Q4_0,Q4_1", help="ggml types for the three projections")
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of calls per measurement")
    args = parser.parse_args()
    if not cpu.native_available():
        sys.exit(f"native kernels unavailable: {cpu.unavailable_reason()}")
    rows = [int(r) for r in args.rows.split(",")]
    cases = [(name, Q.__members__[t]) for t in args.types.split(",") for name in ("attn_q", "ffn_up", "ffn_down")]
    cases.append(("head", Q.Q8_0))
    rs = np.random.RandomState(0)
    print(f"torch {torch.__version__}, paths {cpu.cpu_paths()}, auto -> {cpu.cpu_paths()[-1]}, "
          f"{torch.get_num_threads()} threads available")
    header = (f"{'weight':>22} {'rows':>4} {'ours 1T':>9} {'ours 2T':>9} {'int4':>9} {'bf16':>9} "
              f"{'int4/ours':>9} {'bf16/ours':>9}")
    print(header)
    one_row: list[tuple[str, float, float]] = []
    for name, qtype in cases:
        out, inp = SHAPES[name]
        raw = gguf.quants.quantize(rs.randn(out, inp).astype(np.float32) * 0.05, qtype)
        packed = cpu.pack(raw, int(qtype), inp)
        int4 = QuantizedLinear.from_ggml(raw, qtype, inp)
        w_bf16 = int4.dequantize().to(torch.bfloat16)
        label = f"{name} {out}x{inp} {qtype.name}"
        for m in rows:
            x = torch.randn(m, inp).to(torch.bfloat16)
            ours = {}
            for threads in (1, 2):
                torch.set_num_threads(threads)
                ours[threads] = best_us(lambda: cpu.qlinear(x, packed, int(qtype), out, torch.bfloat16),
                                        args.budget)
            torch.set_num_threads(2)
            t_int4 = best_us(lambda: int4(x), args.budget)
            t_bf16 = best_us(lambda: F.linear(x, w_bf16), args.budget)
            print(f"{label:>22} {m:>4} {ours[1]:>9.1f} {ours[2]:>9.1f} {t_int4:>9.1f} {t_bf16:>9.1f} "
                  f"{t_int4 / ours[2]:>9.2f} {t_bf16 / ours[2]:>9.2f}")
            if m == 1:
                one_row.append((label, ours[1], ours[2]))
    print("1 row, 2 threads below 1 thread (both cores used):")
    for label, t1, t2 in one_row:
        print(f"  {label:>22}: {t1:.1f} -> {t2:.1f} us, {'yes' if t2 < t1 else 'NO'} ({t1 / t2:.2f}x)")


if __name__ == "__main__":
    main()
