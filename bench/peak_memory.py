"""The memory a runner of `python -m engine bench --memory` needs to serve a GGUF file: its process's peak
resident set (`ru_maxrss`) after loading the model and generating 16 greedy tokens, one process per runner
so that nothing else the bench loads is counted.

    python -m bench.peak_memory ours FILE THREADS        # the served configuration: quantized, bfloat16
    python -m bench.peak_memory llama.cpp FILE THREADS   # llama-cpp-python on the same file (no torch loaded)
prints one line: "<runner> <MB>". Ours includes its KV pool (256 MB on a CPU by default); llama.cpp holds
a 1,024-token context (bench/llama_cpp_peer.py) and maps the file's weights rather than copying them.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

PROMPT = "The capital of France is"
NEW_TOKENS = 16


def _ours(model: str, threads: int) -> None:
    import torch

    from engine import Engine, EngineConfig, SamplingParams

    torch.set_num_threads(threads)
    engine = Engine(EngineConfig(model=model, weights="quantized", dtype="bfloat16"))
    ids = engine.tokenizer.encode(PROMPT)
    engine.generate([ids], SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))


def _llama_cpp(model: str, threads: int) -> None:
    from bench import llama_cpp_peer  # numpy and llama_cpp only: no torch in this process

    llama = llama_cpp_peer.load(Path(model), threads)
    if llama is None:
        sys.exit(3)
    # llama.cpp's own tokenizer: ours would count its vocabulary against llama.cpp's memory.
    llama.generate([llama.llm.tokenize(PROMPT.encode())], NEW_TOKENS)


def main(argv: list[str]) -> int:
    runner, model, threads = argv[0], argv[1], int(argv[2])
    if runner == "ours":
        _ours(model, threads)
    elif runner == "llama.cpp":
        _llama_cpp(model, threads)
    else:
        print(f"unknown runner {runner!r}: ours or llama.cpp", file=sys.stderr)
        return 2
    print(f"{runner} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
