"""ggml types re-encoded, exactly, as a type our quantized kernels serve.

Every weight keeps the value the gguf package's dequantizer gives it (tests/engine/test_transcode.py):
    Q5_0 (per 32-block: fp16 d, 4 bytes of fifth bits, 16 bytes of nibbles; w = d * (q - 16), q in 0..31)
         -> Q8_0 (fp16 d, 32 int8; w = d * q) with q - 16 as the int8: 34 bytes a block instead of 22.
    The K-quants pack 256-element super-blocks with sub-block scales; their rows become 32-blocks:
    Q4_K (fp16 d and dmin, 6-bit scale sc and min m per 32, nibbles; w = (d * sc) * q - dmin * m)
         -> rows of [fp32 d * sc, fp32 -(dmin * m), 16 nibble bytes], w = d' * q + m': 24 bytes a block.
            Both products are exact in fp32 (an 11-bit significand times a 6-bit integer), so the sum is
            gguf's one rounding of d * q - dm.
    Q5_K (the same with a fifth bit) -> [fp32 d', fp32 m', 32 int8 q in 0..31]: 40 bytes a block.
    Q5_1 (fp16 d, m, fifth bits, nibbles; w = d * q + m) -> the same rows as Q5_K, the fp16 values widened.
    Q6_K (int8 scale per 16, fp16 d; w = (d * sc) * (q - 32), q in 0..63)
         -> [fp16 d, int8 sc of each 16-half, 32 int8 q - 32]: 36 bytes a block.
Q4_K_M files keep most projections in Q5_0, Q4_K and Q6_K, so these keep them quantized instead of expanded
to bfloat16 (3-4x the bytes). Q4_K, Q5_K, Q6_K and Q5_1 are served by the native kernels only (the torch
int4 route has no such types): the loader keeps them quantized only where those are built.
"""

from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES = 22, 24, 34
Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES = 144, 176, 210  # per 256-element super-block
TRANSCODED = {Q.Q5_0: Q.Q8_0, Q.Q4_K: Q.Q4_K, Q.Q5_K: Q.Q5_K, Q.Q6_K: Q.Q6_K, Q.Q5_1: Q.Q5_K}


def transcoded(rows: np.ndarray, qtype: gguf.GGMLQuantizationType) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """uint8 [out, row bytes] of `qtype` -> the same weights as (rows, type) our kernels take; other
    types unchanged."""
    rows = np.asarray(rows, dtype=np.uint8)
    if qtype == Q.Q5_0:
        return q5_0_as_q8_0(rows), Q.Q8_0
    if qtype == Q.Q4_K:
        return q4_k_rows(rows), Q.Q4_K
    if qtype == Q.Q5_K:
        return q5_k_rows(rows), Q.Q5_K
    if qtype == Q.Q6_K:
        return q6_k_rows(rows), Q.Q6_K
    if qtype == Q.Q5_1:
        return q5_1_as_q5_k(rows), Q.Q5_K
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


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes [..., 12] -> 6-bit (scales, mins) [..., 8]: sub-blocks 0-3 in the low 6 bits
    of bytes 0-3 (scales) and 4-7 (mins); 4-7 in bytes 8-11's nibbles (low: scale, high: min) with their
    top 2 bits in the top bits of bytes 0-3 (scales) and 4-7 (mins)."""
    low, high, mixed = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([low & 0x3F, (mixed & 0x0F) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([high & 0x3F, (mixed >> 4) | ((high >> 6) << 4)], axis=-1)
    return scales, mins


def _f16(field: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(field).view(np.float16).astype(np.float32)


def _affine_rows(d: np.ndarray, m: np.ndarray, quants: np.ndarray) -> np.ndarray:
    """[out, n32] fp32 d and m, quant bytes [out, n32, 16 or 32] -> rows [out, n32 * (8 + bytes)]."""
    out = d.shape[0]
    fields = [d[..., None].astype("<f4").view(np.uint8), m[..., None].astype("<f4").view(np.uint8), quants]
    return np.ascontiguousarray(np.concatenate(fields, axis=-1).reshape(out, -1))


def _k_affine(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K super-blocks [out, nsb, bytes] -> each sub-block's fp32 (d * sc, -(dmin * m)) [out, nsb * 8]."""
    out = blocks.shape[0]
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])               # [out, nsb, 1]
    scales, mins = _k_scales_mins(blocks[..., 4:16])                       # [out, nsb, 8]
    return (d * scales.astype(np.float32)).reshape(out, -1), -(dmin * mins.astype(np.float32)).reshape(out, -1)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 nibble bytes [out, nsb, 128] -> q [out, nsb * 8, 32]: sub-block 2c is the low
    nibbles of bytes 32c .. 32c + 31, sub-block 2c + 1 their high nibbles."""
    out = qs.shape[0]
    chunks = qs.reshape(out, -1, 4, 1, 32)
    return ((chunks >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F).reshape(out, -1, 32)


def _nibble_bytes(q: np.ndarray) -> np.ndarray:
    """q [..., 32] in 0..15 -> ggml's 16 bytes: elements 0-15 in the low nibbles, 16-31 in the high."""
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def q4_k_rows(rows: np.ndarray) -> np.ndarray:
    out = rows.shape[0]
    blocks = rows.reshape(out, -1, Q4_K_BYTES)
    d, m = _k_affine(blocks)
    return _affine_rows(d, m, _nibble_bytes(_k_low_nibbles(blocks[..., 16:])))


def q5_k_rows(rows: np.ndarray) -> np.ndarray:
    out = rows.shape[0]
    blocks = rows.reshape(out, -1, Q5_K_BYTES)
    d, m = _k_affine(blocks)
    qh = blocks[..., 16:48]                                                 # [out, nsb, 32]: bit j of byte i
    fifth = (qh[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1  # [out, nsb, 8, 32]
    q = _k_low_nibbles(blocks[..., 48:]) | (fifth.reshape(out, -1, 32) << 4)
    return _affine_rows(d, m, q.astype(np.uint8))


def q5_1_as_q5_k(rows: np.ndarray) -> np.ndarray:
    out = rows.shape[0]
    blocks = rows.reshape(out, -1, Q5_1_BYTES)                              # [out, nb, 24]
    fifth = (blocks[..., 4:8].copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & 1  # bit i: element i
    nibbles = blocks[..., 8:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1) | (fifth.astype(np.uint8) << 4)
    return _affine_rows(_f16(blocks[..., 0:2])[..., 0], _f16(blocks[..., 2:4])[..., 0], q)


def q6_k_rows(rows: np.ndarray) -> np.ndarray:
    out = rows.shape[0]
    blocks = rows.reshape(out, -1, Q6_K_BYTES)                              # [out, nsb, 210]
    nsb = blocks.shape[1]
    # Each 128-element half h: low 4 bits from ql[64h .. 64h + 63] (low nibbles elements 0-63, high 64-127),
    # top 2 bits from qh[32h .. 32h + 31] (bits 2g .. 2g + 1 for elements 32g .. 32g + 31).
    ql = blocks[..., 0:128].reshape(out, nsb, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
    qh = blocks[..., 128:192].reshape(out, nsb, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(
        1, 1, 1, 4, 1)
    q = ((ql & 0x0F).reshape(out, nsb, 2, 128) | ((qh & 0x03).reshape(out, nsb, 2, 128) << 4)).astype(np.int16) - 32
    q8 = q.astype(np.int8).view(np.uint8).reshape(out, nsb * 8, 32)
    scales = blocks[..., 192:208].reshape(out, nsb * 8, 2)                  # int8 bytes: two per 32-block
    d = np.broadcast_to(blocks[..., 208:210][:, :, None, :], (out, nsb, 8, 2)).reshape(out, nsb * 8, 2)
    return np.ascontiguousarray(np.concatenate([d, scales, q8], axis=-1).reshape(out, -1))
