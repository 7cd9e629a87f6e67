"""commit_token: a burst step's sampled ids become the next step's inputs, on the device.

input_ids[r] = sampled[r]; positions[r] += 1 (the next token is fed one position further).
"""

from __future__ import annotations

import numpy
import torch

from engine.kernels.gpu.cupy_support import CudaKernel, use_cupy

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
KERNEL = CudaKernel("commit_token", _SOURCE)


def commit_token_ref(sampled: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
    input_ids.copy_(sampled)
    positions.add_(1)


def commit_token_cupy(sampled: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
    """input_ids and positions are written in place, so they must be contiguous int64 (checked)."""
    rows = sampled.shape[0]
    if input_ids.shape[0] < rows or positions.shape[0] < rows:
        raise ValueError(f"commit_token: {rows} sampled rows for {input_ids.shape[0]} ids, {positions.shape[0]} positions")
    KERNEL.launch((rows + 127) // 128, 128, (sampled.contiguous(), input_ids, positions, numpy.int32(rows)),
                  sampled.device)


def commit_token(sampled: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
    (commit_token_cupy if use_cupy(sampled, input_ids, positions) else commit_token_ref)(sampled, input_ids, positions)
