"""ggml Q4_0/Q4_1/Q8_0 rows as torch's weight-only int4 kernels take them, on the CPU and on CUDA alike.

Both kernels compute w = (q - 8) * scale + zero per group of GROUP inputs, from nibbles q in 0..15:
    Q4_0: scale d, zero 0;   Q4_1: scale d, zero m + 8d;
    Q8_0: each int8 q split as 16 * (q >> 4) + (q & 15), a block becoming two groups over the input
          repeated twice: (high + 8, scale 16d, zero 0) and (low, scale d, zero 8d).
engine/model/quantized.py states why each is exact; engine/kernels/gpu/cuda_int4.py rounds the scales to
bfloat16 for CUDA.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
GROUP = 32  # ggml block size of Q4_0/Q4_1/Q8_0, used as the kernels' group size
N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu: "expect N to be dividable by 16"


def kernel_operands(raw: np.ndarray, qtype: gguf.GGMLQuantizationType) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml blocks [out, row_bytes] -> the int4 kernel's inputs: nibbles int32 [out_padded, k] in 0..15
    and scales_zeros float32 [k/32, out_padded, 2] (scale, zero) with w = (nibble - 8) * scale + zero;
    k is in_features, or twice it for Q8_0."""
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, gguf.GGML_QUANT_SIZES[qtype][1])                     # [out, G, bytes]
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)       # [out, G, 1]
    if qtype == Q.Q8_0:
        q = blocks[..., 2:].copy().view(np.int8)                          # [out, G, 32]
        high, low = (q >> 4) + 8, q & 0x0F                                # q = 16 * (high - 8) + low
        nibbles = np.stack([high, low], axis=2).reshape(out, -1)          # [out, G * 2 * 32]
        scale = np.concatenate([16 * d, d], axis=-1)                      # [out, G, 2]: high, low group
        zero = np.concatenate([np.zeros_like(d), 8 * d], axis=-1)
    else:
        qs = blocks[..., -16:]
        nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(out, -1)
        scale = d
        if qtype == Q.Q4_0:
            zero = np.zeros_like(d)
        else:  # d * q + m = d * (q - 8) + (m + 8d)
            zero = blocks[..., 2:4].copy().view(np.float16).astype(np.float32) + 8 * d
    scale, zero = scale.reshape(out, -1), zero.reshape(out, -1)         # [out, groups]
    padded = -out % N_MULTIPLE  # extra rows with scale and zero 0: weight 0, sliced off the output
    nibbles = np.pad(nibbles, ((0, padded), (0, 0)))
    scales_zeros = np.stack([np.pad(scale, ((0, padded), (0, 0))), np.pad(zero, ((0, padded), (0, 0)))], -1)
    scales_zeros = np.ascontiguousarray(scales_zeros.transpose(1, 0, 2))  # [groups, out_padded, 2]
    return torch.from_numpy(nibbles.astype(np.int32)), torch.from_numpy(scales_zeros)
