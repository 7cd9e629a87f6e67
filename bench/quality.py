"""What the served CPU path's numerics cost: perplexity on a held-out text and greedy agreement, for the
served route (quantized GGUF weights, bf16, the fused decoder layer), the module route it replaced
(WORKBENCH_FUSED_LAYERS=off), the exact fp32 model (the same file dequantized) and llama.cpp on the same
file.

    PYTHONPATH=.:/tmp/llamacpp .venv/bin/python bench/quality.py --model smollm2 --threads 2

The text is docs/ARCHITECTURE.md of this repository, written after the models were trained, cut into
`--window`-token windows scored independently (each token given the window's earlier tokens). Perplexity
= exp(mean negative log-likelihood of every token after a window's first). Greedy agreement: each
runner's `--max-tokens` greedy tokens after the 8 bench prompts, against the exact model's: how many
prompts agree whole, and the mean length of the agreeing prefix. Our routes score a window as one
prefill through the serving forward (paged KV cache, attention metadata), so what is measured is what
serves.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch

from bench import llama_cpp_peer
from bench.engine_bench import PROMPTS
from engine.engine import Engine
from engine.engine_config import EngineConfig
from engine.loading.loader import LoadedModel, load_model
from engine.loading.model_files import resolve_model_path
from engine.model.attention_metadata import AttentionMetadata
from engine.sampling_params import SamplingParams
from engine.scheduler.kv_cache import KVShape, PagedKVCache, blocks_needed

ROOT = Path(__file__).resolve().parents[1]
ROUTES = {  # name -> (weights, dtype, WORKBENCH_FUSED_LAYERS)
    "served (fused, quantized bf16)": ("quantized", "bfloat16", "on"),
    "module route (quantized bf16)": ("quantized", "bfloat16", "off"),
    "exact fp32 (dequantized)": ("dequantized", "float32", "on"),
}
BLOCK = 16


def windows(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i: i + size] for i in range(0, len(ids) - 1, size) if len(ids[i: i + size]) > 1]


@torch.inference_mode()
def window_nll(loaded: LoadedModel, ids: list[int]) -> tuple[float, int]:
    """Sum of -log p(token | earlier tokens of the window) over the window's tokens after its first."""
    model, config = loaded.model, loaded.config
    blocks = blocks_needed(len(ids), BLOCK)
    cache = PagedKVCache(KVShape.of(config), blocks, BLOCK, loaded.dtype, loaded.device)
    metadata = AttentionMetadata.build(block_size=BLOCK, block_tables=[list(range(blocks))], cached_lens=[0],
                                       query_lens=[len(ids)], sliding_window=config.sliding_window,
                                       some_layers_windowed=config.mixes_windows, device=loaded.device,
                                       dtype=loaded.dtype)
    hidden = model(torch.tensor(ids), metadata.positions, metadata, cache)
    logprobs = torch.log_softmax(model.logits(hidden[:-1]).float(), dim=-1)  # [T-1, V]
    targets = torch.tensor(ids[1:])
    return -float(logprobs[torch.arange(len(targets)), targets].double().sum()), len(targets)


def ours(path: Path, text_ids: list[list[int]], prompts: list[list[int]], max_tokens: int) -> dict[str, tuple]:
    results = {}
    for name, (weights, dtype, fused) in ROUTES.items():
        os.environ["WORKBENCH_FUSED_LAYERS"] = fused  # read when the model is loaded
        loaded = load_model(path, weights=weights, dtype=dtype)
        nll, count = map(sum, zip(*(window_nll(loaded, w) for w in text_ids)))
        engine = Engine(EngineConfig(model=str(path), weights=weights, dtype=dtype))
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        tokens = [r.token_ids for r in engine.generate(prompts, params)]
        results[name] = (math.exp(nll / count), tokens, fused == "on" and loaded.model.fused is not None)
    os.environ.pop("WORKBENCH_FUSED_LAYERS")
    return results


def llama_cpp_results(path: Path, threads: int, text_ids: list[list[int]], prompts: list[list[int]],
                      max_tokens: int, window: int) -> tuple | None:
    peer = llama_cpp_peer.load(path, threads)
    if peer is None:
        return None
    llm = peer.lib.Llama(model_path=str(path), n_ctx=window, n_threads=threads, n_threads_batch=threads,
                         logits_all=True, verbose=False)
    nll, count = 0.0, 0
    for ids in text_ids:
        llm.reset()
        llm.eval(ids)
        logits = torch.tensor(llm.scores[: len(ids) - 1], dtype=torch.float64)
        logprobs = torch.log_softmax(logits, dim=-1)
        nll -= float(logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())
        count += len(ids) - 1
    tokens = [peer.generate([p], max_tokens)[0] for p in prompts]
    return math.exp(nll / count), tokens, False


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> tuple[int, float]:
    prefixes = []
    for mine, theirs in zip(tokens, reference):
        same = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        prefixes.append(same)
    whole = sum(p == len(t) for p, t in zip(prefixes, reference))
    return whole, sum(prefixes) / len(prefixes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--max-text-tokens", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    tokenizer = load_model(path, weights="quantized", dtype="bfloat16").tokenizer
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    text_ids = windows(tokenizer.encode(text)[: args.max_text_tokens], args.window)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    print(f"{path.name}: {sum(len(w) for w in text_ids)} tokens of docs/ARCHITECTURE.md in windows of "
          f"{args.window}; greedy {args.max_tokens} tokens after {len(prompts)} prompts; {args.threads} threads")
    results = ours(path, text_ids, prompts, args.max_tokens)
    peer = llama_cpp_results(path, args.threads, text_ids, prompts, args.max_tokens, args.window)
    if peer is not None:
        results["llama.cpp (same file)"] = peer
    exact = results["exact fp32 (dequantized)"][1]
    print(f"{'':34} {'perplexity':>10}  {'prompts agreeing whole':>22}  {'mean agreeing prefix':>20}")
    for name, (ppl, tokens, _) in results.items():
        whole, prefix = agreement(tokens, exact)
        print(f"{name:34} {ppl:10.4f}  {whole:>15} of {len(exact)}  {prefix:>17.1f} of {args.max_tokens}")
    if not results["served (fused, quantized bf16)"][2]:
        print("note: the fused route was not taken (no native kernels?): the first row is the module route", file=sys.stderr)


if __name__ == "__main__":
    main()
