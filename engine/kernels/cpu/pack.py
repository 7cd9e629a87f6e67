"""ggml Q4_0/Q4_1/Q8_0 weight rows -> the packed layout the native kernels stream (engine/kernels/cpu/qgemm.h).

Done once at load. Output columns go in groups of 8, each group's blocks contiguous along K, each block's
8 scales (and Q4_1 offsets) first as the file's fp16 (the kernels widen them to fp32, exactly), then the
8 columns' quants: for Q4 as 4 rows of two columns' 16 nibble bytes (j and j + 4), for Q8_0 as 8 rows
of 32 int8. As many bytes a weight as ggml's own blocks: a decode streams every weight once a token.
"""

from __future__ import annotations

import numpy as np
import torch

QK = 32
GROUP = 8
QTYPES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0"}  # ggml type ids
BLOCK_BYTES = {2: 2 + 16, 3: 2 + 2 + 16, 8: 2 + 32}
GROUP_BYTES = {2: 144, 3: 160, 8: 272}


def pack(raw: np.ndarray | torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    """ggml data uint8 [out, row_bytes] (as GGUFReader gives it) -> packed uint8 [groups, K/32, bytes].
    Raises ValueError for another type or a shape that is not whole blocks."""
    qtype = int(qtype)
    if qtype not in QTYPES:
        raise ValueError(f"the native kernels take ggml types {sorted(QTYPES)} (Q4_0, Q4_1, Q8_0), not {qtype}")
    data = raw.numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    name = QTYPES[qtype]
    if in_features <= 0 or in_features % QK:
        raise ValueError(f"{name}: in_features must be a positive multiple of {QK}, got {in_features}")
    nb = in_features // QK
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != nb * BLOCK_BYTES[qtype] or data.shape[0] == 0:
        raise ValueError(f"{name} with in_features {in_features} needs uint8 [out, {nb * BLOCK_BYTES[qtype]}], "
                         f"got {data.dtype} {data.shape}")
    out = data.shape[0]
    groups = -(-out // GROUP)
    rows = np.pad(data.reshape(out, nb, BLOCK_BYTES[qtype]),
                  ((0, groups * GROUP - out), (0, 0), (0, 0)))             # zero blocks: d = m = 0, q = 0
    blocks = rows.reshape(groups, GROUP, nb, -1).transpose(0, 2, 1, 3)   # [G, nb, 8, block bytes]

    def f16(lo: int) -> np.ndarray:  # the fp16 field at byte lo of each block, 8 columns' -> [G, nb, 16]
        return np.ascontiguousarray(blocks[..., lo:lo + 2]).reshape(groups, nb, 2 * GROUP)

    if qtype == 8:
        parts = [f16(0), blocks[..., 2:].reshape(groups, nb, GROUP * QK)]
    else:
        qs = blocks[..., -16:].reshape(groups, nb, 2, 4, 16).transpose(0, 1, 3, 2, 4)  # row j: cols j, j+4
        parts = [f16(0)] + ([f16(2)] if qtype == 3 else []) + [qs.reshape(groups, nb, 4 * 2 * 16)]
    packed = np.ascontiguousarray(np.concatenate(parts, axis=-1))           # [G, nb, GROUP_BYTES]
    assert packed.shape[-1] == GROUP_BYTES[qtype]
    return torch.from_numpy(packed)
