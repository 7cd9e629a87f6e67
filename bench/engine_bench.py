"""`python -m engine bench`: our generation throughput against HF transformers (and llama.cpp on GGUF files).

Every runner gets the same prompt token ids (the chat template applied to 8 distinct user questions
where the model has a chat template, else 8 raw text prompts), decodes greedily and generates exactly
`--max-tokens` new tokens (EOS ignored: generated like any token, never a stop), at each of
`--batch-sizes` (batch b: the first b prompts, run together), in one process, one after the other.
Each figure is the median of `--repeats` timed runs after a warm-up; tokens/s = new tokens / wall time,
prefill included.

An HF directory (`demo` included): ours in four modes (host decode, the device decode loop in bursts
of `--burst-length`, captured decode graphs, both) beside HF transformers on that directory.
A GGUF file (`smollm2` included): ours with quantized weights in float32 and bfloat16 and with
dequantized float32 and bfloat16 weights (bf16 matmuls run on AMX where the CPU has it); host decode
only: the loop and graphs modes are left out, as they do not pay on the CPU (docs/BENCHMARKS_ARCHIVE.md), beside
HF transformers loading the same file (fp32) and
llama.cpp through `llama-cpp-python` on the same file with the same thread count, when installed
(bench/llama_cpp_peer.py; 8 streams there are its batched API, 8 sequence ids in one context), and with
`--vllm-python` vLLM's CPU backend (bench/vllm_cpu_peer.py, in its own venv) on the file's weights
dequantized into an HF directory (bfloat16 there, as vLLM serves on a CPU).
With `--prefill N` it measures prompt processing instead: one prompt of exactly N tokens (the questions'
text repeated, chat-templated, cut at N), one new token, printed as prompt tokens/s (N / the wall time of
the whole request), with the prefix caches of ours and vLLM's off (llama.cpp's context is cleared anyway).
Printed per batch size: tokens/s and each row's ratio over the reference rows (HF, and host or
llama.cpp); then whether the greedy tokens of pairs of runners agree. transformers is needed for this
command only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from bench import llama_cpp_peer, vllm_cpu_peer
from engine.engine import Engine
from engine.engine_config import EngineConfig
from engine.loading.model_files import is_gguf, resolve_model_path
from engine.sampling_params import SamplingParams

PROMPTS = ["The list type", "A dictionary is", "This module provides", "Return the number of",
           "If the file does not exist,", "The default value is", "Raise an exception when", "Each thread has"]
QUESTIONS = ["What is a Python list?", "How do I read a file line by line in Python?",
             "Explain recursion to a beginner.", "What is the capital of France?",
             "Write a haiku about the sea.", "Why is the sky blue?",
             "Give three tips for writing clean code.", "What does HTTP stand for?"]
AGREEMENT_TOKENS = 32
# (runner, reference) whose greedy tokens should be identical: the same weights in the same float type.
EXPECTED_EQUAL = [("host", "HF"), ("deq fp32", "HF"), ("quant fp32", "deq fp32")]
# Printed for information: bf16 rounding, llama.cpp's own kernels (activations quantized to 8 bits), vLLM's.
COMPARED = EXPECTED_EQUAL + [("quant bf16", "quant fp32"), ("deq bf16", "deq fp32"), ("llama.cpp", "quant fp32"),
                             ("llama.cpp", "quant bf16"), ("vLLM-CPU", "deq bf16"), ("vLLM-CPU", "quant bf16")]

Generate = Callable[[list[list[int]]], list[list[int]]]  # prompt token ids -> new token ids, per prompt


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="demo")
    parser.add_argument("--max-tokens", type=int, default=None, help="new tokens per prompt "
                        "(default: 128 for a GGUF model, 64 for an HF directory)")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch (and llama.cpp) threads "
                        "(default: torch's choice)")
    parser.add_argument("--burst-length", type=int, default=8)
    parser.add_argument("--vllm-python", default=None, help="a python with vllm-cpu installed (its own venv: "
                        "docs/BENCHMARKS.md); adds vLLM-CPU on the GGUF file's weights dequantized")
    parser.add_argument("--prefill", type=int, default=None, metavar="N", help="instead of decode throughput: "
                        "prompt tokens/s for one prompt of N tokens and one new token")
    parser.add_argument("--memory", action="store_true", help="instead of speed: the peak RSS of ours (served "
                        "configuration) and llama.cpp serving the GGUF file, each in a process of its own")
    parser.add_argument("--skip", default="", help="runners to leave out, comma-separated (e.g. 'quant fp32', "
                        "whose scalar kernel makes it the slowest row by far)")


def _median_seconds(run: Callable[[], None], repeats: int) -> float:
    run()  # warm-up: first-call allocations and kernel selection are not what we measure
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ours(engine: Engine, max_tokens: int) -> Generate:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return lambda prompts: [r.token_ids for r in engine.generate(prompts, params)]


def _hf(model: Any, pad: int, max_tokens: int) -> Generate:
    """`model`: a transformers model (Any: transformers' own types would double mypy's time, and only
    this function uses them)."""
    model.generation_config.eos_token_id = None  # like our ignore_eos: every step decodes, none is forbidden

    @torch.no_grad()
    def generate(prompts: list[list[int]]) -> list[list[int]]:
        # HF batches by left padding with an attention mask, as its docs recommend for decoder-only models.
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                             pad_token_id=pad)
        return out[:, width:].tolist()
    return generate


Closable = llama_cpp_peer.LlamaCpp | vllm_cpu_peer.VllmCpu


def _runners(args: argparse.Namespace, transformers: ModuleType) -> tuple[dict[str, Generate], list[str], Engine,
                                                                         list[Closable]]:
    """(name -> generate, the reference names, one of our engines, what to close at the end)."""
    path = resolve_model_path(args.model)
    if not is_gguf(path):
        modes = {name: Engine(EngineConfig.from_env(model=args.model, device_loop=loop, graphs=graphs,
                                                    burst_length=args.burst_length))
                 for name, loop, graphs in (("host", False, False), ("loop", True, False),
                                            ("graphs", False, True), ("graphs+loop", True, True))}
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        engine = modes["host"]
        runners = {"HF": _hf(hf, _pad(engine), args.max_tokens)}
        runners.update({name: _ours(on, args.max_tokens) for name, on in modes.items()})
        return runners, ["HF", "host"], engine, []
    # A prefill measurement repeats one prompt: no runner may answer it from a prefix cache.
    caching = args.prefill is None
    modes = {name: Engine(EngineConfig.from_env(model=args.model, weights=weights, dtype=dtype, prefix_caching=caching))
             for name, weights, dtype in (("quant fp32", "quantized", "float32"),
                                          ("quant bf16", "quantized", "bfloat16"),
                                          ("deq fp32", "dequantized", "float32"),
                                          ("deq bf16", "dequantized", "bfloat16"))}
    engine = modes["deq fp32"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    runners = {"HF": _hf(hf, _pad(engine), args.max_tokens)}
    llama = llama_cpp_peer.load(path, torch.get_num_threads())
    if llama is not None:
        runners["llama.cpp"] = lambda prompts: llama.generate(prompts, args.max_tokens)
        print(f"llama.cpp: llama-cpp-python {llama.version}, {llama.threads} threads; its low-level API at every "
              "batch size (one llama_decode a token for all streams, one sequence id per stream, one context)")
    closing: list[Closable] = [llama] if llama is not None else []
    if args.vllm_python:
        vllm = vllm_cpu_peer.load(hf_directory(path, hf), args.vllm_python, torch.get_num_threads(), caching)
        runners["vLLM-CPU"] = lambda prompts: vllm.generate(prompts, args.max_tokens)
        closing.append(vllm)
        print(f"vLLM-CPU: {vllm.version}, {torch.get_num_threads()} threads, bfloat16, on the file's weights "
              "dequantized (fp32 safetensors written by transformers)")
    runners.update({name: _ours(on, args.max_tokens) for name, on in modes.items()})
    return runners, [r for r in ("HF", "llama.cpp", "vLLM-CPU") if r in runners], engine, closing


def hf_directory(gguf_path: Path, hf: Any = None) -> Path:
    """The HF model read from the GGUF file (fp32) and its tokenizer, saved once as an HF directory beside
    our model cache, for vLLM: config.json and model.safetensors (written here: transformers refuses to
    save a model it read from GGUF, and a tied head is the embedding, so it is left out as HF's own saving
    does), and the tokenizer files `vllm serve` and its client read. `hf`: the model, where already loaded."""
    import transformers
    from safetensors.torch import save_file

    from engine.loading.packaged_models import cache_dir

    target = cache_dir() / "bench-hf" / gguf_path.stem
    target.mkdir(parents=True, exist_ok=True)
    if not (target / "model.safetensors").is_file():
        if hf is None:
            hf = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                                   dtype=torch.float32)
        state = {name: tensor.detach().contiguous() for name, tensor in hf.state_dict().items()
                 if not (name == "lm_head.weight" and hf.config.tie_word_embeddings)}
        config = hf.config.to_dict()
        config.pop("quantization_config", None)
        (target / "config.json").write_text(json.dumps(config, indent=2))
        save_file(state, str(target / "model.safetensors"))
    if not (target / "tokenizer.json").is_file():
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        tokenizer.save_pretrained(str(target))
    return target


def _pad(engine: Engine) -> int:
    tokenizer = engine.tokenizer
    pad = tokenizer.token_id(tokenizer.eos_token) if tokenizer.eos_token else None
    return 0 if pad is None else pad  # also where the EOS text is not one token of the vocabulary


def _prompts(engine: Engine, prefill: int | None) -> list[list[int]]:
    tokenizer = engine.tokenizer
    if prefill is not None:
        text = " ".join(QUESTIONS * (prefill // 4 + 1))  # far more than N tokens
        ids = tokenizer.encode(text) if tokenizer.chat_template is None else tokenizer.encode_chat(
            [{"role": "user", "content": text}])
        return [ids[:prefill]]
    if tokenizer.chat_template is None:
        return [tokenizer.encode(p) for p in PROMPTS]
    return [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


def _agreement(outputs: dict[str, list[list[int]]]) -> None:
    """Print, per pair that ran, whether the first AGREEMENT_TOKENS greedy tokens match on every prompt."""
    for a, b in [(a, b) for a, b in COMPARED if a in outputs and b in outputs]:
        diverged = []
        for i, (x, y) in enumerate(zip(outputs[a], outputs[b])):
            x, y = x[:AGREEMENT_TOKENS], y[:AGREEMENT_TOKENS]
            if x != y:
                at = next(k for k, (s, t) in enumerate(zip(x, y)) if s != t)
                diverged.append(f"prompt {i} from token {at} ({x[at]} vs {y[at]})")
        verdict = "identical" if not diverged else "differ: " + "; ".join(diverged)
        note = "" if (a, b) in EXPECTED_EQUAL else " (not expected to be identical)"
        print(f"  {a} vs {b}: {verdict}{note}")


def _memory(args: argparse.Namespace) -> int:
    """bench/peak_memory.py once per runner, in a process of its own; prints each peak RSS."""
    path = resolve_model_path(args.model)
    if not is_gguf(path):
        print("error: --memory compares servers of a GGUF file", file=sys.stderr)
        return 2
    threads = str(args.threads or torch.get_num_threads())
    print(f"peak RSS after loading {args.model} and generating 16 tokens, each runner in a process of its own:")
    for runner in ("ours", "llama.cpp"):
        done = subprocess.run([sys.executable, "-m", "bench.peak_memory", runner, str(path), threads],
                              capture_output=True, text=True)
        line = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
        print(f"  {runner:>10}: {line[0].split()[-1] + ' MB' if line else 'failed: ' + done.stderr.strip()[-300:]}")
    return 0


def run_bench(args: argparse.Namespace) -> int:
    if args.memory:
        return _memory(args)
    try:
        import transformers
    except ImportError:
        print("error: the bench compares against HF transformers: pip install -e '.[test]'", file=sys.stderr)
        return 2
    transformers.utils.logging.disable_progress_bar()  # its GGUF loading bars would bury the table
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.prefill is not None:
        args.max_tokens, args.batch_sizes = 1, "1"
    if args.max_tokens is None:
        args.max_tokens = 128 if is_gguf(resolve_model_path(args.model)) else 64
    print(f"load average at start {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    runners, references, engine, closing = _runners(args, transformers)
    for name in filter(None, (n.strip() for n in args.skip.split(","))):
        if name not in runners:
            print(f"error: --skip {name!r}: no such runner (runners: {', '.join(runners)})", file=sys.stderr)
            return 2
        del runners[name]
    prompts = _prompts(engine, args.prefill)
    print(f"model {args.model}: {engine.loaded.config.num_hidden_layers} layers, {len(prompts)} prompts "
          f"({'chat-templated' if engine.tokenizer.chat_template else 'raw text'}"
          f"{f', {len(prompts[0])} tokens' if args.prefill else ''}), {args.max_tokens} new "
          f"tokens each, greedy, EOS ignored, torch threads {torch.get_num_threads()}, {args.repeats} repeats")
    unit = "prompt tok/s" if args.prefill else "tok/s"
    print(f"{'batch':>5} {'runner':>12} {unit:>12}" + "".join(f" {'vs ' + r:>12}" for r in references))
    outputs: dict[int, dict[str, list[list[int]]]] = {}  # batch -> runner -> new tokens per prompt
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        rates: dict[str, float] = {}
        outputs[batch] = {}
        for name, generate in runners.items():
            batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]

            def run() -> None:
                outputs[batch][name] = generate(batch_prompts)
                assert all(len(o) == args.max_tokens for o in outputs[batch][name]), name
            per_run = len(batch_prompts[0]) if args.prefill else batch * args.max_tokens
            rates[name] = per_run / _median_seconds(run, args.repeats)
            ratios = "".join(f" {rates[name] / rates[r]:>11.2f}x" if r in rates else " " * 13 for r in references)
            print(f"{batch:>5} {name:>12} {rates[name]:>12.1f}{ratios}", flush=True)
    for batch, by_runner in outputs.items():
        print(f"greedy agreement, first {AGREEMENT_TOKENS} tokens of the batch-{batch} runs:")
        _agreement(by_runner)
    for peer in closing:
        peer.close()
    print(f"load average at end {os.getloadavg()}")
    return 0
