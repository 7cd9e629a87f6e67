"""The exponential noise of a batch's sampled rows, drawn on the CPU's threads side by side.

A sampled row's token is the argmax of its probabilities over exponential noise from its own generator
(engine/sampler.py). On the CPU torch draws that noise one element after another on the calling thread:
about 0.9 ms for a 49,152-token vocabulary, so 32 sampled rows spent a sixth of a busy server's engine
thread in it while the kernels' other threads waited. Each row has a generator of its own, so the rows may
be drawn on different threads in any order and each still gets the very numbers it would get alone: the
draws are the same bits, only side by side. On a GPU the draws are launches that do not wait, and stay on
the calling thread.
"""

from __future__ import annotations

import threading

from concurrent.futures import ThreadPoolExecutor

import torch

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def exponential_noise(shapes_like: list[torch.Tensor], generators: list[torch.Generator]) -> list[torch.Tensor]:
    """Per row, a tensor like shapes_like[i] of Exp(1) draws from generators[i], in row order wherever a
    generator serves two rows (drawn from two threads at once, its stream would interleave)."""
    threads = torch.get_num_threads()
    on_cpu = all(t.device.type == "cpu" for t in shapes_like)
    shared = len({id(g) for g in generators}) != len(generators)
    if not on_cpu or shared or threads < 2 or len(shapes_like) < 2:
        return [_one(like, g) for like, g in zip(shapes_like, generators)]
    return list(_threads(threads).map(_one, shapes_like, generators))


def _one(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.empty_like(like).exponential_(1, generator=generator)


def _threads(count: int) -> ThreadPoolExecutor:
    """One pool per process, made on first use (after any fork) and sized to torch's threads then."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="sampling-noise")
        return _pool
