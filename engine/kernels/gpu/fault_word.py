"""fault_word: raise the device loop's fault word when any logit is NaN or infinite.

The word (int32 [1]) is only ever set, never cleared here: the loop reads it once after a burst and
resets it when it re-primes for a newer generation.
"""

from __future__ import annotations

import numpy
import torch

from engine.kernels.gpu.cupy_support import CudaKernel, use_cupy

_SOURCE = r"""
extern "C" __global__ void fault_word(const float* logits, const long long n, int* fault) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        if (!isfinite(logits[i])) { atomicOr(fault, 1); return; }
    }
}
"""
KERNEL = CudaKernel("fault_word", _SOURCE)


def fault_word_ref(logits: torch.Tensor, fault: torch.Tensor) -> None:
    fault.bitwise_or_((~torch.isfinite(logits)).any().to(fault.dtype))


def fault_word_cupy(logits: torch.Tensor, fault: torch.Tensor) -> None:
    scores = logits.float().contiguous()  # the kernel reads fp32; any float dtype is widened exactly
    KERNEL.launch(128, 256, (scores, numpy.int64(scores.numel()), fault), logits.device)


def fault_word(logits: torch.Tensor, fault: torch.Tensor) -> None:
    (fault_word_cupy if use_cupy(logits, fault) else fault_word_ref)(logits, fault)
