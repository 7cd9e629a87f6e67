"""commit_token: a burst step's sampled ids become the next step's inputs, on the device.

input_ids[r] = sampled[r]; positions[r] += 1 (the next token is fed one position further).
"""

from __future__ import annotations

import functools

import numpy
import torch

from kernels.cupy_support import as_cupy, cupy_module, launch, use_cupy

_SOURCE = r"""
extern "C" __global__ void commit_token(const long long* sampled, long long* input_ids, long long* positions,
                                        const int rows) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        input_ids[r] = sampled[r];
        positions[r] += 1;
    }
}
"""


def commit_token_ref(sampled: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
    input_ids.copy_(sampled)
    positions.add_(1)


@functools.cache
def _kernel():
    return cupy_module().RawKernel(_SOURCE, "commit_token")


def commit_token_cupy(sampled: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
    rows = sampled.shape[0]
    launch(_kernel(), (rows + 127) // 128, 128,
           (as_cupy(sampled.contiguous()), as_cupy(input_ids), as_cupy(positions), numpy.int32(rows)), sampled)


def commit_token(sampled: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
    (commit_token_cupy if use_cupy(sampled, input_ids, positions) else commit_token_ref)(sampled, input_ids, positions)
