"""The CPU's sampled rows: for each, the token torch.multinomial draws from its probabilities with its
generator, the generator left where multinomial leaves it, in about a third of multinomial's time, and the
rows side by side on the CPU's threads.

torch.multinomial draws one sample as the argmax of probs / q, q exponential noise that `exponential_`
makes one element at a time: a 64-bit draw from the generator's mt19937 (random64), u its low 53 bits
times 2^-53, q = float(-log1p(-u)) in double with libm's log1p. That took 0.95 ms for a 49,152-token
row, a sixth of a busy server's engine thread at 32 clients. Here:
- the same 64-bit draws come from `random_` on an int64 tensor (the same random64 per element, so the
  generator ends where exponential_ leaves it), 4x faster than exponential_;
- the noise is computed vectorized, with numpy's log1p, which may differ from libm's in the last bits of
  the double, so a score probs / q may be one float32 ulp off;
- so every score within a margin far above that error of the best is computed again exactly, as
  exponential_ computes it (math.log1p is libm's), and the exact best wins, the first of equal ones, as
  the argmax does. Usually one score is that close. A NaN score wins first, as in the argmax.
Each row has a generator of its own, so rows drawn on different threads draw what each draws alone.

Where the native CPU kernels are built (engine/kernels/cpu), one op does all of it for every row, about 5x
faster again (engine/kernels/cpu/sampling_draws.cpp: the mt19937 words in bulk, and the scores bracketed
without a logarithm, so only the best few get libm's); the numpy path below is what runs without them.
"""

from __future__ import annotations

import math
import threading

from concurrent.futures import ThreadPoolExecutor, wait

import numpy
import torch

from engine.kernels.cpu import native_available
from engine.kernels.cpu.sampling import multinomial_draws as native_draws

MANTISSA_BITS = (1 << 53) - 1
# A score's approximate value is within one float32 ulp (2^-23 relative) of its exact one: candidates are
# the scores within 2^-16 of the best approximate one, far more than both errors together.
MARGIN = 2.0 ** -16

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def multinomial_draws(probs_rows: list[torch.Tensor], generators: list[torch.Generator]) -> list[int]:
    """Per row (a float32 CPU tensor [V] of probabilities), the token torch.multinomial(probs, 1,
    generator=g) draws. Rows sharing a generator are drawn one after the other in row order."""
    if native_available():
        return native_draws(probs_rows, generators)
    return numpy_draws(probs_rows, generators)


def numpy_draws(probs_rows: list[torch.Tensor], generators: list[torch.Generator]) -> list[int]:
    """multinomial_draws without the native kernels: `draw` per row, rows side by side on a thread pool."""
    threads = torch.get_num_threads()
    shared = len({id(g) for g in generators}) != len(generators)
    if shared or threads < 2 or len(probs_rows) < 2:
        return [draw(p, g) for p, g in zip(probs_rows, generators)]
    # Every row finished before this returns, also when one fails: the caller then puts every generator
    # back, and none may still be drawing.
    futures = [_threads(threads).submit(draw, p, g) for p, g in zip(probs_rows, generators)]
    wait(futures)
    return [f.result() for f in futures]


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """torch.multinomial(probs, 1, generator=generator)'s token for one float32 CPU row."""
    bits = torch.empty(probs.shape, dtype=torch.int64).random_(generator=generator).numpy()
    # numpy from here: one thread per row (torch's ops would start their own thread teams from every draw
    # thread, fighting the forward's threads for the cores).
    uniform = (bits & MANTISSA_BITS).astype(numpy.float64) * 2.0 ** -53  # exact: 53 bits
    probabilities = probs.numpy()
    with numpy.errstate(divide="ignore", invalid="ignore"):  # u = 0: q = +0, an infinite or NaN score
        scores = probabilities / (-numpy.log1p(-uniform)).astype(numpy.float32)
    best = float(scores.max())
    if not best > 0.0:  # a NaN score, which the argmax picks first (max propagates it), or no probability
        return int(scores.argmax())
    candidates = numpy.flatnonzero(scores >= best * (1.0 - MARGIN)).tolist()
    if len(candidates) == 1:
        return candidates[0]
    exact = [_exact_score(float(probabilities[j]), float(uniform[j])) for j in candidates]
    return candidates[exact.index(max(exact))]


def _exact_score(probability: float, uniform: float) -> numpy.float32:
    """probs[j] / q_j in float32, q_j as exponential_ makes it: -log1p(-u) in double, rounded to float32."""
    noise = numpy.float32(-math.log1p(-uniform))
    with numpy.errstate(divide="ignore"):  # u = 0 gives q = +0 and an infinite score, as in the argmax
        return numpy.float32(probability) / noise


def _threads(count: int) -> ThreadPoolExecutor:
    """One pool per process, made on first use (after any fork) and sized to torch's threads then."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="sampling-draws")
        return _pool
