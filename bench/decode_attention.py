"""Which decode attention an engine on this machine takes, which SDPA kernels the torch path would run (for
decodes, and for a prompt chunk after cached keys), and
what each costs per layer at the 1B shape (Llama 3.2 1B: 32 query heads over 8 KV heads, head dim 64,
bfloat16), side by side in one run.

The torch path gathers each decode's blocks, pads them to the batch's longest and runs SDPA with an
additive mask (engine/model/attention.py); the Triton kernel reads the cache in place
(engine/kernels/gpu/triton_paged_decode.py). Timings are CUDA-event medians of --repeats calls of one layer's
decode attention, with the largest difference between the two outputs. On a machine without CUDA it says
which path runs and stops; without Triton, also which SDPA kernel the torch path runs.
Usage: python bench/decode_attention.py [--contexts 1024,8192] [--batches 1,64] [--repeats 50]
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
from engine.model.attention import Attention, decode_attention_backend  # noqa: E402
from engine.model.attention_metadata import decode_metadata  # noqa: E402
from engine.model.config import ModelConfig  # noqa: E402

HEADS, KV_HEADS, DIM, BLOCK = 32, 8, 64, 16


def sdpa_kernel(device: torch.device, dtype: torch.dtype, keys: int) -> str:
    """The SDPA kernel torch picks for the torch path's decode call at this shape (mask, GQA)."""
    from torch.nn.attention import SDPBackend

    q = torch.zeros(1, HEADS, 1, DIM, device=device, dtype=dtype)
    k = torch.zeros(1, KV_HEADS, keys, DIM, device=device, dtype=dtype)
    mask = torch.zeros(1, 1, 1, keys, device=device, dtype=dtype)
    choice = torch._fused_sdp_choice(q, k, k, mask, 0.0, False, scale=None, enable_gqa=True)
    return SDPBackend(choice).name


def prefill_kernel(device: torch.device, dtype: torch.dtype, cached: int) -> str:
    """The first fused SDPA kernel that takes a 24-token prompt chunk after `cached` keys the way the
    engine's prefill hands it over (lower-right causal, GQA, no mask tensor); MATH where none does."""
    from torch.nn.attention import SDPBackend, sdpa_kernel as only
    from torch.nn.attention.bias import causal_lower_right

    q = torch.zeros(1, HEADS, 24, DIM, device=device, dtype=dtype)
    k = torch.zeros(1, KV_HEADS, cached + 24, DIM, device=device, dtype=dtype)
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with only([backend]):
                F.scaled_dot_product_attention(q, k, k, attn_mask=causal_lower_right(24, cached + 24), enable_gqa=True)
            return backend.name
        except RuntimeError:
            continue
    return SDPBackend.MATH.name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    backend, why = decode_attention_backend(device, EngineConfig.from_env().triton_attention)
    print(f"decode attention on {device}: {backend} ({why})")
    if not cuda:
        return
    dtype = torch.bfloat16
    print(f"torch path's SDPA kernel (bf16, {HEADS}/{KV_HEADS} heads, dim {DIM}, additive mask): "
          f"{sdpa_kernel(device, dtype, 1024)}")
    print(f"prefill after 1,000 cached keys (bf16, the same heads, lower-right causal): "
          f"{prefill_kernel(device, dtype, 1000)}")
    config = ModelConfig(model_type="llama", vocab_size=16, hidden_size=HEADS * DIM, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=DIM,
                         max_position_embeddings=131072)
    attention = Attention(config).to(device, dtype)
    if backend != "triton":
        return  # nothing to compare the torch path with
    print(f"{'batch':>5} {'context':>7} {'torch ms':>9} {'triton ms':>9} {'speedup':>7} {'max |diff|':>10}")
    for batch in (int(b) for b in args.batches.split(",")):
        for context in (int(c) for c in args.contexts.split(",")):
            blocks = -(-context // BLOCK)
            slots = batch * blocks * BLOCK
            cache = (torch.randn(slots, KV_HEADS, DIM, device=device, dtype=dtype),
                     torch.randn(slots, KV_HEADS, DIM, device=device, dtype=dtype))
            tables = torch.randperm(batch * blocks, device=device).view(batch, blocks)
            positions = torch.full((batch,), context - 1, device=device)
            decodes = decode_metadata(tables, positions, BLOCK, None, dtype).decodes
            assert decodes is not None
            q = torch.randn(batch, HEADS, DIM, device=device, dtype=dtype)
            results, times = {}, {}
            for name in ("torch", "triton"):
                attention.decode_backend = name
                results[name] = attention._decode(q, cache, decodes, BLOCK)
                times[name] = median_ms(lambda: attention._decode(q, cache, decodes, BLOCK), args.repeats)
            diff = (results["torch"].float() - results["triton"].float()).abs().max().item()
            print(f"{batch:>5} {context:>7} {times['torch']:>9.3f} {times['triton']:>9.3f} "
                  f"{times['torch'] / times['triton']:>6.2f}x {diff:>10.2e}")


if __name__ == "__main__":
    main()
