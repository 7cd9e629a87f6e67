"""Decode throughput of a random-weight ~1.2B Llama (Llama-3.2-1B's shape) on a GPU, in bf16.

    python bench/gpu_decode.py [--batches 1,16] [--new-tokens 128]

Modes, side by side in one run: eager decode, captured CUDA graphs, graphs + the device loop. For
each: tokens/s and the fraction of the HBM-bandwidth roofline (every decode step must read all weights
and every sequence's KV history once; `--hbm-tbps` is the memory bandwidth, 4.8 TB/s for an H200), and
after the timed runs the launches per decode step the profiler counts (bench/decode_launches.py).
The model directory is written to a temporary folder (random weights; nothing comes from a network).

A speed is printed only for a mode that worked: every sequence produced the requested tokens and ended
with finish_reason "length", and its greedy tokens equal eager's. `Engine.step` turns a failed forward
into errored sequences, so a broken mode would otherwise report a huge speed; it prints FAILED with its
error instead, and the script exits non-zero. The engine's length limit is what the run uses (prompt
plus new tokens), so captured graphs attend over that, not the model's 4,096 positions.

Each mode runs on a fresh engine with prefix caching on: its first run (the warm-up) prefills every
prompt whole, and its later runs find the prompts' full blocks cached and prefill only the rest, by
another path (the masked one). A run is compared with eager's run of the same index, so both met the
same cache state: tokens from a cached run against a fresh one's could differ by one rounding in the
prefill, which flips an argmax of random bf16 weights within a hundred tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.decode_launches import launches_per_step
from engine import Engine, EngineConfig, SamplingParams
from engine.loading.model_files import DEMO_MODEL_DIR
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM

LLAMA_3_2_1B = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                    max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def write_random_model(folder: Path, device: str = "cuda", **overrides) -> int:
    """Llama-3.2-1B's shape (changed by `overrides`, e.g. fewer layers) with random bf16 weights, written
    to `folder` as an HF directory; returns the parameter count."""
    hf_config = {**LLAMA_3_2_1B, **overrides}
    config = ModelConfig.from_hf_dict(hf_config)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02) if param.dim() == 2 else param.fill_(1.0)
    state = {k: v.cpu().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({**hf_config, "architectures": ["LlamaForCausalLM"]}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_MODEL_DIR / name, folder / name)
    return sum(p.numel() for p in model.parameters())


def roofline_tokens_per_s(parameters: int, batch: int, context: int, hbm_bytes_per_s: float) -> float:
    c = LLAMA_3_2_1B
    kv_bytes = batch * context * c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * 2
    return batch / ((parameters * 2 + kv_bytes) / hbm_bytes_per_s)


def verdict(results, new_tokens: int, eager_tokens: list[list[int]] | None) -> str | None:
    """Why a mode's results are no measurement, or None when they are."""
    for index, result in enumerate(results):
        if result.finish_reason != "length" or len(result.token_ids) != new_tokens:
            return (f"sequence {index}: {len(result.token_ids)} of {new_tokens} tokens, finish_reason "
                    f"{result.finish_reason!r}")
    tokens = [list(r.token_ids) for r in results]
    if eager_tokens is not None and tokens != eager_tokens:
        first = next(i for i, (a, b) in enumerate(zip(tokens, eager_tokens)) if a != b)
        step = next((j for j, (a, b) in enumerate(zip(tokens[first], eager_tokens[first])) if a != b), None)
        return f"greedy tokens differ from eager's (sequence {first}, first at token {step})"
    return None


def measure(engine, prompts, params, repeats: int, eager_runs: list[list[list[int]]] | None,
            sync=torch.cuda.synchronize) -> tuple[float | None, str | None, list[list[list[int]]]]:
    """(seconds per generate, None, runs) or (None, why it failed, runs). runs[0] is the warm-up (which
    captures graphs and settles the allocator), then one per timed repeat: each run's greedy tokens per
    prompt, checked against eager_runs[i] (eager's run i) where given."""
    runs: list[list[list[int]]] = []
    times = []
    for run in range(1 + repeats):
        if run:
            sync()
        start = time.perf_counter()
        results = engine.generate(prompts, params)
        if run:
            sync()
            times.append(time.perf_counter() - start)
        runs.append([list(r.token_ids) for r in results])
        expected = eager_runs[run] if eager_runs is not None else None
        failure = verdict(results, params.max_tokens, expected)
        if failure:
            return None, failure if run == 0 else f"run {run}: {failure}", runs
    return statistics.median(times), None, runs


def compare_modes(make_engine, modes: dict[str, dict], prompts, params, repeats: int, sync=torch.cuda.synchronize,
                  probe=None):
    """Yields (mode, seconds per generate or None, why it failed or None, probed) for each mode in order,
    the first being eager: every other mode's runs are checked against eager's runs of the same index.
    probed is what `probe(engine)` returns after a mode's runs worked (a string where it raised), else None."""
    eager_runs = None
    for index, (name, flags) in enumerate(modes.items()):
        engine = None
        try:
            if index and eager_runs is None:
                raise RuntimeError("eager failed, so there are no greedy tokens to check this mode's against")
            engine = make_engine(flags)
            seconds, failure, runs = measure(engine, prompts, params, repeats, eager_runs, sync=sync)
            if failure is None and engine.runner.graphs.refusal:
                failure = f"capture refused: {engine.runner.graphs.refusal}"
        except Exception as exc:  # a mode that raises is a failed mode, not the end of the run
            seconds, failure, runs = None, f"{type(exc).__name__}: {exc}", []
        if index == 0 and failure is None:
            eager_runs = runs
        probed = None
        if failure is None and probe is not None:
            try:
                probed = probe(engine)
            except Exception as exc:  # a count that fails leaves the speed standing
                probed = f"{type(exc).__name__}: {exc}"
        del engine
        yield name, seconds, failure, probed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hbm-tbps", type=float, default=4.8)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-1b-"))
    parameters = write_random_model(folder)
    print(f"random Llama-3.2-1B-shaped model: {parameters / 1e9:.2f}B parameters, bf16, "
          f"{torch.cuda.get_device_name()}", flush=True)
    modes = {"eager": dict(graphs=False, device_loop=False),
             "graphs": dict(graphs=True, capture_stream=True, device_loop=False),
             "graphs+loop": dict(graphs=True, capture_stream=True, device_loop=True)}
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
    length = args.prompt_tokens + args.new_tokens
    failed = 0
    print(f"{'batch':>5} {'mode':>12} {'tok/s':>9} {'roofline':>9} {'vs eager':>9} {'launches/step':>14}")
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = [torch.randint(0, 4096, (args.prompt_tokens,)).tolist() for _ in range(batch)]
        context = args.prompt_tokens + args.new_tokens // 2
        roof = roofline_tokens_per_s(parameters, batch, context, args.hbm_tbps * 1e12)
        base = None

        def make_engine(flags):
            return Engine(EngineConfig.from_env(model=str(folder), device="cuda", dtype="bfloat16", kv_cache_mb=4096,
                                                max_model_len=length, **flags))

        def count(engine):
            return launches_per_step(engine, prompts, 16)[0]

        for name, seconds, failure, launches in compare_modes(make_engine, modes, prompts, params, args.repeats,
                                                              probe=count):
            if failure is not None:
                failed += 1
                print(f"{batch:>5} {name:>12}    FAILED: {failure}", flush=True)
            else:
                rate = batch * args.new_tokens / seconds
                base = base or rate
                shown = f"{launches:>14.1f}" if isinstance(launches, float) else f"  {launches}"
                print(f"{batch:>5} {name:>12} {rate:>9.1f} {rate / roof:>8.1%} {rate / base:>8.2f}x {shown}", flush=True)
            torch.cuda.empty_cache()
    shutil.rmtree(folder)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
