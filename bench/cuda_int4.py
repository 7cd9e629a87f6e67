"""CudaInt4Linear's two routes timed side by side on a GPU, to tune MAX_ROWS (engine/kernels/gpu/cuda_int4.py):
torch's int4 kernel against the per-call bf16 dequantization + F.linear, and a bf16 F.linear on a held
dequantized weight (what weights="dequantized" runs) for scale, at each row count.

    python bench/cuda_int4.py [--shapes 4096x4096,14336x4096] [--rows 1,16,32,64,128,256] [--repeats 50]

Timings are CUDA-event medians of --repeats calls (after a warm-up); a shape is [out, in] and its weights
are random nibbles and scales (timing does not depend on their values). The last column names the faster
route; MAX_ROWS should be the largest decode-graph bucket (a power of two) at which the kernel still
wins. Without CUDA it says so and stops.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cuda_timing import median_ms  # noqa: E402
from engine.kernels.gpu import cuda_int4  # noqa: E402
from engine.kernels.gpu.cuda_int4 import CudaInt4Linear  # noqa: E402


def random_module(out: int, inp: int) -> CudaInt4Linear:
    generator = torch.Generator(device="cuda").manual_seed(0)
    nibbles = torch.randint(0, 256, (out, inp // 2), dtype=torch.uint8, device="cuda", generator=generator)
    scales_zeros = (torch.rand(inp // 32, out, 2, device="cuda", generator=generator) * 0.02).bfloat16()
    module = CudaInt4Linear(nibbles, scales_zeros, cuda_int4.Q.Q4_1, inp, None)
    module.prepare_for_serving()
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="4096x4096,14336x4096")
    parser.add_argument("--rows", default="1,16,32,64,128,256")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; MAX_ROWS now {cuda_int4.MAX_ROWS}")
    print(f"{'shape':>12} {'rows':>5} {'int4 kernel ms':>15} {'dequant+linear ms':>18} {'bf16 linear ms':>15}  faster")
    for shape in args.shapes.split(","):
        out, inp = (int(n) for n in shape.split("x"))
        module = random_module(out, inp)
        packed, scales = module.kernel_operands()
        weight = module.dequantize()
        for rows in (int(n) for n in args.rows.split(",")):
            x = torch.randn(rows, inp, device="cuda").bfloat16()
            kernel = median_ms(lambda: torch.ops.aten._weight_int4pack_mm(x, packed, cuda_int4.GROUP, scales),
                               args.repeats)
            dequantized = median_ms(lambda: F.linear(x, module.dequantize()), args.repeats)
            held = median_ms(lambda: F.linear(x, weight), args.repeats)
            faster = "int4 kernel" if kernel <= dequantized else "dequant+linear"
            print(f"{shape:>12} {rows:>5} {kernel:>15.4f} {dequantized:>18.4f} {held:>15.4f}  {faster}")


if __name__ == "__main__":
    main()
