"""ggml types re-encoded, exactly, as a type our quantized kernels serve.

Q5_0 (per 32-block: fp16 d, 4 bytes of fifth bits, 16 bytes of nibbles; w = d * (q - 16), q in 0..31)
is Q8_0 (fp16 d, 32 int8; w = d * q) with q - 16 as the int8: every weight keeps its value, at 34
bytes a block instead of 22 (still about half of bfloat16). Q4_K_M files store most of their
projections as Q5_0, so serving them this way keeps those quantized instead of expanding them.
"""

from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
Q5_0_BYTES, Q8_0_BYTES = 22, 34
TRANSCODED = {Q.Q5_0: Q.Q8_0}


def transcoded(rows: np.ndarray, qtype: gguf.GGMLQuantizationType) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """uint8 [out, row bytes] of `qtype` -> the same weights as (rows, type) our kernels take; other
    types unchanged."""
    if qtype == Q.Q5_0:
        return q5_0_as_q8_0(rows), Q.Q8_0
    return rows, qtype


def q5_0_as_q8_0(rows: np.ndarray) -> np.ndarray:
    out = rows.shape[0]
    blocks = np.asarray(rows, dtype=np.uint8).reshape(out, -1, Q5_0_BYTES)  # [out, nb, 22]
    high_bits = blocks[..., 2:6].copy().view("<u4")                          # [out, nb, 1]: bit i of element i
    fifth = (high_bits >> np.arange(32, dtype=np.uint32)) & 1                # [out, nb, 32]
    nibbles = blocks[..., 6:]
    low = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)            # elements 0-15, then 16-31
    q = (low | (fifth.astype(np.uint8) << 4)).astype(np.int16) - 16          # -16 .. 15
    q8 = np.concatenate([blocks[..., 0:2], q.astype(np.int8).view(np.uint8)], axis=-1)  # [out, nb, 34]
    return np.ascontiguousarray(q8.reshape(out, -1))
