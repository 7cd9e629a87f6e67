"""Weight rows -> the packed layout the native kernels stream (engine/kernels/cpu/qgemm.h).

The rows are ggml's Q4_0/Q4_1/Q8_0 blocks, or the K-quants as engine/loading/transcode.py re-encodes them
per 32-block (Q4_K, Q5_K: fp32 d, fp32 m, then 16 nibble bytes or 32 int8; Q6_K: fp16 d, two int8 half
sub-scales, 32 int8). Done once at load. Output columns go in groups of 8, each group's blocks contiguous
along K, each block's 8 scales (and offsets, and Q6_K's sub-scales, half 0's eight then half 1's) first, as
the rows hold them, then the 8 columns' quants interleaved 4 bytes at a time (qgemm.h), so that one load
holds 4 consecutive k of every column. A decode streams every weight once a token.
"""

from __future__ import annotations

import numpy as np
import torch

QK = 32
GROUP = 8
QTYPES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}  # ggml type ids
# A 32-block's bytes in the rows: (scale bytes, offset bytes, sub-scale bytes, quant bytes).
FIELDS = {2: (2, 0, 0, 16), 3: (2, 2, 0, 16), 8: (2, 0, 0, 32), 12: (4, 4, 0, 16), 13: (4, 4, 0, 32),
          14: (2, 0, 2, 32)}
BLOCK_BYTES = {qtype: sum(fields) for qtype, fields in FIELDS.items()}
GROUP_BYTES = {qtype: GROUP * size for qtype, size in BLOCK_BYTES.items()}


def pack(raw: np.ndarray | torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    """Rows uint8 [out, row_bytes] (as GGUFFile or the transcoder gives them) -> packed uint8
    [groups, K/32, bytes]. Raises ValueError for another type or a shape that is not whole blocks."""
    qtype = int(qtype)
    if qtype not in QTYPES:
        raise ValueError(f"the native kernels take ggml types {sorted(QTYPES)} ({', '.join(QTYPES.values())}), "
                         f"not {qtype}")
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
                  ((0, groups * GROUP - out), (0, 0), (0, 0)))             # zero blocks: d = m = c = 0, q = 0
    blocks = rows.reshape(groups, GROUP, nb, -1).transpose(0, 2, 1, 3)   # [G, nb, 8, block bytes]

    def field(lo: int, width: int) -> np.ndarray:  # bytes [lo, lo + width) of each block, column by column
        return np.ascontiguousarray(blocks[..., lo:lo + width]).reshape(groups, nb, GROUP * width)

    scale, offset, sub, quants = FIELDS[qtype]
    parts = [field(0, scale)]
    if offset:
        parts.append(field(scale, offset))
    if sub:  # Q6_K's int8 sub-scales: half 0's eight columns, then half 1's
        halves = blocks[..., scale:scale + sub].transpose(0, 1, 3, 2)              # [G, nb, 2, 8]
        parts.append(np.ascontiguousarray(halves).reshape(groups, nb, GROUP * sub))
    # Quants column-interleaved: quad j (elements 4j .. 4j + 3) of the 8 columns, 4 bytes each, then quad j + 1;
    # ggml's nibble byte 4j + p holds element 4j + p (low) and 16 + 4j + p (high): quads j and j + 4.
    quants_of = blocks[..., -quants:].reshape(groups, nb, GROUP, quants // 4, 4)   # [G, nb, 8, quads, 4]
    parts.append(quants_of.transpose(0, 1, 3, 2, 4).reshape(groups, nb, GROUP * quants))
    packed = np.ascontiguousarray(np.concatenate(parts, axis=-1))           # [G, nb, GROUP_BYTES]
    assert packed.shape[-1] == GROUP_BYTES[qtype]
    return torch.from_numpy(packed)
