"""ring_argmax: the greedy token of each row, written into the device loop's ring (ring[step, row]).

Ties go to the lowest token id, as torch.argmax does.
"""

from __future__ import annotations

import numpy
import torch

from engine.kernels.gpu.cupy_support import CudaKernel, use_cupy

THREADS = 256

_SOURCE = r"""
extern "C" __global__ void ring_argmax(const float* logits, const long long vocab, long long* out) {
    const int row = blockIdx.x;
    const float* x = logits + (long long)row * vocab;
    __shared__ float best_value[256];
    __shared__ long long best_index[256];
    float value = -__int_as_float(0x7f800000);  // -inf: CuPy's NVRTC compiles with no headers, so no INFINITY
    long long index = 0;
    for (long long i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = x[i];
        if (v > value) { value = v; index = i; }  // strided scan: the first maximum of this thread's share
    }
    best_value[threadIdx.x] = value;
    best_index[threadIdx.x] = index;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            const float v = best_value[threadIdx.x + stride];
            const long long i = best_index[threadIdx.x + stride];
            if (v > best_value[threadIdx.x] || (v == best_value[threadIdx.x] && i < best_index[threadIdx.x])) {
                best_value[threadIdx.x] = v;
                best_index[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[row] = best_index[0];
}
"""
KERNEL = CudaKernel("ring_argmax", _SOURCE, threads=THREADS)  # the shared arrays hold one slot per thread


def ring_argmax_ref(logits: torch.Tensor, ring: torch.Tensor, step: int) -> None:
    """logits [B, V] (any float dtype) -> ring[step, :B] (int64)."""
    ring[step, : logits.shape[0]] = logits.argmax(dim=-1)


def ring_argmax_cupy(logits: torch.Tensor, ring: torch.Tensor, step: int) -> None:
    """The ring row is written in place, so the ring must be int64 with contiguous rows (checked)."""
    scores = logits.float().contiguous()  # the kernel reads fp32; bf16 and fp16 widen exactly
    row = ring[step, : logits.shape[0]]
    if row.shape[0] != logits.shape[0]:
        raise ValueError(f"ring_argmax: {logits.shape[0]} rows of logits for a ring {ring.shape[1]} wide")
    KERNEL.launch(logits.shape[0], THREADS, (scores, numpy.int64(scores.shape[1]), row), logits.device)


def ring_argmax(logits: torch.Tensor, ring: torch.Tensor, step: int) -> None:
    (ring_argmax_cupy if use_cupy(logits, ring) else ring_argmax_ref)(logits, ring, step)
