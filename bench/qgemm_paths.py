"""Microbenchmark: our quantized GEMM's code paths against each other and against torch's bf16 F.linear
(oneDNN, which takes AMX-BF16 where the CPU has it), for SmolLM2-135M's shapes, side by side in one run.

    .venv/bin/python bench/qgemm_paths.py [--rows 1,8,64,256] [--threads 2] [--budget 0.3]

Columns, microseconds per call (the fastest; the variants take turns, as in bench/cpu_kernels.py), bfloat16
activations in and out, the activations' quantization included (engine.kernels.cpu.qlinear):
    avx512, amx   our paths forced (those this CPU runs; the same bits, tests/kernels/test_cpu_qgemm.py)
    bf16          F.linear on the dequantized weight in bfloat16
    vnni/amx, bf16/amx   time ratios (above 1: AMX is faster); "-" where this CPU has no AMX
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from bench.cpu_kernels import SHAPES, best_us  # noqa: E402
from engine.kernels import cpu  # noqa: E402
from engine.model.quantized import QuantizedLinear  # noqa: E402

Q = gguf.GGMLQuantizationType
CASES = [("attn_q", Q.Q4_1), ("ffn_up", Q.Q4_1), ("ffn_down", Q.Q4_1), ("head", Q.Q8_0)]  # as the GGUF serves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,8,64,256")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of calls per measurement")
    args = parser.parse_args()
    if not cpu.native_available():
        sys.exit(f"native kernels unavailable: {cpu.unavailable_reason()}")
    paths: list[str] = [p for p in ("avx512", "amx") if p in cpu.cpu_paths()] or [cpu.cpu_paths()[-1]]
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, paths {cpu.cpu_paths()}, {args.threads} threads, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    columns = [*paths, "bf16"]
    print(f"{'weight':>24} {'rows':>4}" + "".join(f" {c:>9}" for c in columns) + f" {'vnni/amx':>9} {'bf16/amx':>9}")
    rs = np.random.RandomState(0)
    for name, qtype in CASES:
        out, inp = SHAPES[name]
        raw = gguf.quants.quantize(rs.randn(out, inp).astype(np.float32) * 0.05, qtype)
        packed = cpu.pack(raw, int(qtype), inp)
        w_bf16 = QuantizedLinear.from_ggml(raw, qtype, inp).dequantize().to(torch.bfloat16)
        for m in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(m, inp).to(torch.bfloat16)
            variants: dict[str, tuple[int, Callable[[], object]]] = {
                p: (args.threads, partial(cpu.qlinear, x, packed, int(qtype), out, torch.bfloat16, p)) for p in paths}
            variants["bf16"] = (args.threads, partial(F.linear, x, w_bf16))
            t = best_us(variants, args.budget)
            ratios = (f" {t['avx512'] / t['amx']:>9.2f} {t['bf16'] / t['amx']:>9.2f}" if "amx" in t and "avx512" in t
                      else f" {'-':>9} {'-':>9}")
            print(f"{f'{name} {out}x{inp} {qtype.name}':>24} {m:>4}" + "".join(f" {t[c]:>9.1f}" for c in columns) + ratios)


if __name__ == "__main__":
    main()
