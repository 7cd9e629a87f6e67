"""Per-call time of one layer's paged attention on the CPU: the native op (engine/kernels/cpu/paged_attention.py)
against the torch path it replaces (decodes padded and masked, float32 math; each prefill through SDPA).

SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head_dim 64), block size 16, in float32 and
bfloat16: decodes at batch 1 and 8 with every sequence at the context length, and a 512-token prompt
prefilled whole. Each figure is the median of `--repeats` calls (after warm-up), cache writes included
(the same in both paths). The native op runs on each SIMD path this CPU has (AVX2, and AVX-512 where
present: WORKBENCH_CPU_KERNEL per column), side by side.
Run: PYTHONPATH=. python bench/cpu_attention_bench.py [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from engine.model import attention
from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ModelConfig
from engine.kernels import cpu

CONFIG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=576, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=4096)
BLOCK = 16


def case(batch: int, context: int, prefill: bool, dtype: torch.dtype) -> tuple:
    """(q, k, v, metadata, cache) for `batch` decodes at `context`, or one prompt of `context` tokens."""
    blocks = -(-context // BLOCK)
    tables = [list(range(b * blocks, (b + 1) * blocks)) for b in range(batch)]
    if prefill:
        md = AttentionMetadata.build(block_size=BLOCK, block_tables=tables, cached_lens=[0], query_lens=[context],
                                     dtype=dtype)
    else:
        md = AttentionMetadata.build(block_size=BLOCK, block_tables=tables, cached_lens=[context - 1] * batch,
                                     query_lens=[1] * batch, dtype=dtype)
    tokens = md.positions.shape[0]
    shape = (batch * blocks * BLOCK, CONFIG.num_key_value_heads, CONFIG.head_dim)
    cache = (torch.randn(shape).to(dtype), torch.randn(shape).to(dtype))
    q = torch.randn(tokens, CONFIG.num_attention_heads, CONFIG.head_dim).to(dtype)
    k, v = (torch.randn(tokens, CONFIG.num_key_value_heads, CONFIG.head_dim).to(dtype) for _ in range(2))
    return q, k, v, md, cache


def per_call_us(layer: attention.Attention, args: tuple, repeats: int) -> float:
    times = []
    for i in range(repeats + 3):
        start = time.perf_counter()
        layer._paged(*args)
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=30)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    assert cpu.native_available(), cpu.unavailable_reason()
    layer = attention.Attention(CONFIG)
    native = attention.native_attention
    paths = [p for p in ("avx2", "avx512") if p in cpu.cpu_paths()]
    print(f"threads {opts.threads}, load average {os.getloadavg()[0]:.1f}, paths {', '.join(paths)}")
    print(f"{'case':<24}{'dtype':<10}{'torch us':>10}" + "".join(f"{p + ' us':>12}" for p in paths)
          + f"{'torch/' + paths[-1]:>14}" + (f"{paths[0] + '/' + paths[-1]:>14}" if len(paths) > 1 else ""))
    for name, batch, context, prefill in [("decode b1 ctx128", 1, 128, False), ("decode b8 ctx128", 8, 128, False),
                                          ("decode b32 ctx160", 32, 160, False),
                                          ("decode b1 ctx1024", 1, 1024, False),
                                          ("decode b8 ctx1024", 8, 1024, False), ("prefill 512", 1, 512, True)]:
        for dtype in (torch.float32, torch.bfloat16):
            args = case(batch, context, prefill, dtype)
            attention.native_attention = lambda device: False  # type: ignore[assignment]
            torch_us = per_call_us(layer, args, opts.repeats)
            attention.native_attention = native
            native_us = []
            for path in paths:
                os.environ["WORKBENCH_CPU_KERNEL"] = path
                native_us.append(per_call_us(layer, args, opts.repeats))
            os.environ.pop("WORKBENCH_CPU_KERNEL", None)
            print(f"{name:<24}{str(dtype).removeprefix('torch.'):<10}{torch_us:>10.0f}"
                  + "".join(f"{us:>12.0f}" for us in native_us) + f"{torch_us / native_us[-1]:>14.2f}"
                  + (f"{native_us[0] / native_us[-1]:>14.2f}" if len(paths) > 1 else ""))

if __name__ == "__main__":
    main()
