"""llama.cpp (through `llama-cpp-python`) as a reference runner for `python -m engine bench` on GGUF files.

Optional: `pip install '.[bench]'` (docs/BENCHMARKS.md gives the build command); `load` returns None and
the bench prints one line when `llama_cpp` cannot be imported. It decodes greedily and runs exactly
`max_tokens` new tokens, EOS included like our `ignore_eos` (EOS is neither masked nor a stop), through the
low-level API as llama.cpp's own tools drive it, for one stream and for n alike: one context with
`n_seq_max = n`, one `llama_batch` holding every prompt (one sequence id each) for the prefill, then one
token per sequence per `llama_decode`, the argmax of each sequence's logits taken in numpy. (The high-level
`Llama.generate` is not used: its Python loop cost llama.cpp about 30% at one stream on a 2-core Xeon.)
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

INSTALL_HINT = "pip install '.[bench]' (build command in docs/BENCHMARKS.md)"
CONTEXT_PER_STREAM = 1024  # tokens of KV cache per sequence: prompt + new tokens of the bench fit
# llama_cpp's ctypes objects (a llama_context pointer, a llama_batch struct): the package ships no types.
LlamaContext = Any
LlamaBatch = Any


def load(path: Path, threads: int) -> LlamaCpp | None:
    """A LlamaCpp on `path`, or None (after printing why) when llama_cpp is not installed."""
    try:
        import llama_cpp
    except ImportError as exc:
        print(f"llama.cpp: skipped (import llama_cpp failed: {exc}); to compare, {INSTALL_HINT}")
        return None
    return LlamaCpp(llama_cpp, path, threads)


class LlamaCpp:
    def __init__(self, llama_cpp: ModuleType, path: Path, threads: int) -> None:
        self.lib = llama_cpp
        self.threads = threads
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=CONTEXT_PER_STREAM, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self._batched: dict[int, tuple[LlamaContext, LlamaBatch]] = {}  # streams -> (context, batch), built once each
        self.version = llama_cpp.__version__

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        return self._generate_batched(prompts, max_tokens)

    def _context(self, streams: int, prompt_tokens: int) -> tuple[LlamaContext, LlamaBatch]:
        if streams not in self._batched:
            lib = self.lib
            params = lib.llama_context_default_params()
            params.n_ctx = streams * CONTEXT_PER_STREAM
            params.n_batch = params.n_ubatch = max(512, prompt_tokens)
            params.n_seq_max = streams
            params.n_threads = params.n_threads_batch = self.threads
            ctx = lib.llama_init_from_model(self.llm.model, params)
            if not ctx:
                raise RuntimeError(f"llama.cpp: could not create a context for {streams} sequences")
            batch = lib.llama_batch_init(params.n_batch, 0, streams)
            self._batched[streams] = (ctx, batch)
        return self._batched[streams]

    def _decode(self, ctx: LlamaContext, batch: LlamaBatch, entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence id, wants logits)."""
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens = len(entries)
        if self.lib.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama.cpp: llama_decode failed")

    def _argmax(self, ctx: LlamaContext, row: int) -> int:
        pointer = self.lib.llama_get_logits_ith(ctx, row)
        return int(np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)),
                                         shape=(self.n_vocab,)).argmax())

    def _generate_batched(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        lib = self.lib
        ctx, batch = self._context(len(prompts), sum(map(len, prompts)))
        lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
        entries, rows = [], []
        for seq, prompt in enumerate(prompts):
            entries += [(token, pos, seq, pos == len(prompt) - 1) for pos, token in enumerate(prompt)]
            rows.append(len(entries) - 1)
        self._decode(ctx, batch, entries)
        out: list[list[int]] = [[] for _ in prompts]
        while True:
            for seq, row in enumerate(rows):
                out[seq].append(self._argmax(ctx, row))
            if len(out[0]) == max_tokens:
                return out
            self._decode(ctx, batch, [(out[seq][-1], len(prompt) + len(out[seq]) - 1, seq, True)
                                      for seq, prompt in enumerate(prompts)])
            rows = list(range(len(prompts)))

    def close(self) -> None:
        """Free the batched contexts before the model they use (the Llama object frees its own)."""
        for ctx, batch in self._batched.values():
            self.lib.llama_batch_free(batch)
            self.lib.llama_free(ctx)
        self._batched.clear()
        self.llm.close()
