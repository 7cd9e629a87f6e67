"""The sampled rows' draws on the CPU through the native op (engine/kernels/cpu/sampling_draws.cpp): for each
row of probabilities, the token torch.multinomial(probs, 1, generator=g) draws, every generator left where
multinomial leaves it. engine/sampling_draws.py calls it where `native_available()`, else draws in numpy.

The op has no `path` argument: its vector loop only brackets the scores (compiled for each ISA by the
compiler, chosen at load), and the token is always settled by the exact scalar arithmetic torch uses, so no
path could give other tokens. Not traced (the sampler runs eagerly): no fake kernel.
"""

from __future__ import annotations

import torch

from engine.kernels.cpu.qgemm import _ops


def multinomial_draws(probs_rows: list[torch.Tensor], generators: list[torch.Generator]) -> list[int]:
    """probs_rows: float32 CPU vectors (made contiguous here); generators: a CPU generator per row. Rows
    with distinct generators are drawn side by side on torch's threads; rows sharing one, in row order."""
    if not probs_rows:
        return []
    return list(_ops().multinomial_draws([p.contiguous() for p in probs_rows], generators))
