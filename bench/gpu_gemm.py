"""The float projections' two GEMMs on CUDA side by side: F.linear (cuBLAS) and the batch-invariant Triton GEMM
(engine/kernels/gpu/triton_linear.py) that an engine takes by default (ARC_INVARIANT_GEMM), at the 1B Llama's
projection shapes in bfloat16, by row count.

Per shape and row count: each one's CUDA-event median of --repeats calls, the ratio (above 1: Triton is
faster), the weight bytes read per second at one row (a decode's GEMMs are bound by that), and for each
whether every row count gave its first row the same bits as one row alone. On a machine without CUDA it
says which GEMM an engine would take and stops.
Usage: python bench/gpu_gemm.py [--rows 1,8,64,512,2048] [--repeats 30]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cuda_timing import median_ms  # noqa: E402
from engine.engine_config import EngineConfig  # noqa: E402
from engine.model.layers import invariant_gemm_choice  # noqa: E402

# (name, out_features, in_features): Llama 3.2 1B's fused q/k/v, o, fused gate/up, down, and its head.
SHAPES = [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate+up", 16384, 2048), ("down", 2048, 8192),
          ("head", 128256, 2048)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,8,64,512,2048")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    invariant, why = invariant_gemm_choice(device, EngineConfig.from_env().invariant_gemm)
    print(f"float projections on {device}: {'the invariant Triton GEMM' if invariant else 'F.linear'} ({why})")
    if not cuda or not invariant:
        return
    from engine.kernels.gpu.triton_linear import invariant_linear

    counts = [int(r) for r in args.rows.split(",")]
    print(f"{'shape':>8} {'rows':>5} {'cuBLAS ms':>9} {'Triton ms':>9} {'ratio':>6} {'cuBLAS GB/s':>11} {'Triton GB/s':>11}")
    for name, out_features, in_features in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(out_features)
        weight = torch.randn(out_features, in_features, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02
        x = torch.randn(max(counts), in_features, device="cuda", generator=gen, dtype=torch.bfloat16)
        first = {"cuBLAS": F.linear(x[:1], weight), "Triton": invariant_linear(x[:1], weight)}
        same = {"cuBLAS": True, "Triton": True}
        for rows in counts:
            rows_x = x[:rows]
            cublas = median_ms(lambda: F.linear(rows_x, weight), args.repeats)
            triton = median_ms(lambda: invariant_linear(rows_x, weight), args.repeats)
            same["cuBLAS"] &= torch.equal(F.linear(rows_x, weight)[:1], first["cuBLAS"])
            same["Triton"] &= torch.equal(invariant_linear(rows_x, weight)[:1], first["Triton"])
            gigabytes = weight.numel() * weight.element_size() / 1e9
            print(f"{name:>8} {rows:>5} {cublas:>9.4f} {triton:>9.4f} {cublas / triton:>5.2f}x "
                  f"{gigabytes / cublas * 1e3:>11.0f} {gigabytes / triton * 1e3:>11.0f}")
        print(f"{name:>8} a first row's bits at every row count: cuBLAS {'same' if same['cuBLAS'] else 'CHANGED'}, "
              f"Triton {'same' if same['Triton'] else 'CHANGED'}")


if __name__ == "__main__":
    main()
