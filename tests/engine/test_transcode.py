"""The transcoder keeps every weight: Q5_0 as Q8_0, the K-quants (and Q5_1) as the kernels' K rows, each
read back equal to the gguf package's dequantization of the file's rows."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.loading.transcode import q5_0_as_q8_0, transcoded

Q = gguf.GGMLQuantizationType


@pytest.mark.parametrize("seed", [0, 1])
def test_q5_0_as_q8_0_keeps_every_weight(seed):
    weights = np.random.default_rng(seed).normal(0, 1, (24, 96)).astype(np.float32)
    weights[0, :32] = 0  # an all-zero block (d = 0)
    rows = gguf.quants.quantize(weights, Q.Q5_0)
    expected = gguf.quants.dequantize(rows, Q.Q5_0)
    assert len(np.unique(expected)) > 100, "liveness: the quantized weights take many values"
    same, qtype = transcoded(rows, Q.Q5_0)
    assert qtype == Q.Q8_0 and same.shape == (24, 96 // 32 * 34)
    np.testing.assert_array_equal(gguf.quants.dequantize(same, Q.Q8_0), expected)
    np.testing.assert_array_equal(gguf.quants.dequantize(q5_0_as_q8_0(rows), Q.Q8_0), expected)


def test_types_the_kernels_take_pass_unchanged():
    rows = gguf.quants.quantize(np.ones((2, 32), dtype=np.float32), Q.Q8_0)
    same, qtype = transcoded(rows, Q.Q8_0)
    assert same is rows and qtype == Q.Q8_0


def random_k_blocks(qtype: Q, rows: int, k: int, seed: int) -> np.ndarray:
    """ggml rows of `qtype` built byte by byte (gguf cannot quantize to the K-quants): every quant, scale
    and min bit pattern, with the fp16 super-block scales (d, dmin; Q6_K's d; Q5_1's d and m) of both signs."""
    rs = np.random.RandomState(seed)
    size, type_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rs.randint(0, 256, size=(rows, k // size, type_bytes), dtype=np.uint8)
    halves = (rs.uniform(0.5, 2.0, (rows, k // size, 2)) * rs.choice([-1, 1], (rows, k // size, 2))
              * 2.0 ** rs.randint(-12, -4, (rows, k // size, 2))).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:
        blocks[..., 208:210] = halves[..., 0:2]
    else:
        blocks[..., 0:4] = halves
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtype,served_as", [(Q.Q4_K, Q.Q4_K), (Q.Q5_K, Q.Q5_K), (Q.Q6_K, Q.Q6_K), (Q.Q5_1, Q.Q5_K)],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_k_quants_keep_every_weight(qtype, served_as, seed):
    """The transcoded rows, read back by QuantizedLinear's dequantizer, are bit for bit the gguf package's
    dequantization of the file's rows."""
    import torch

    from engine.model.quantized import BLOCK_BYTES, dequantize_rows

    k = 512
    rows = random_k_blocks(qtype, 24, k, seed)
    expected = gguf.quants.dequantize(rows, qtype)
    assert len(np.unique(expected)) > 1000, "liveness: the weights take many values"
    same, kernel_type = transcoded(rows, qtype)
    assert kernel_type == served_as and same.shape == (24, k // 32 * BLOCK_BYTES[served_as])
    got = dequantize_rows(torch.from_numpy(same), kernel_type, k).numpy()
    np.testing.assert_array_equal(got, expected)


def test_a_q4_k_m_files_k_quant_tensors_keep_every_weight(gemma3_gguf):
    """The real Gemma 3 file's Q4_K and Q6_K tensors (one of each kind, each block's scales as llama.cpp's
    quantizer chose them)."""
    import torch

    from engine.loading.gguf_file import GGUFFile
    from engine.model.quantized import dequantize_rows

    seen = set()
    # The file's rows as our reader maps them (gguf's reader would first parse the 262,144-piece vocabulary,
    # about 10 s); the reference is still the gguf package's dequantization of those rows.
    for tensor in GGUFFile(gemma3_gguf).tensors:
        if tensor.qtype in (Q.Q4_K, Q.Q6_K) and tensor.qtype not in seen:
            seen.add(tensor.qtype)
            rows = np.asarray(tensor.data)
            expected = gguf.quants.dequantize(rows, tensor.qtype)
            same, kernel_type = transcoded(rows, tensor.qtype)
            got = dequantize_rows(torch.from_numpy(same), kernel_type, expected.shape[1]).numpy()
            np.testing.assert_array_equal(got, expected, err_msg=tensor.name)
    assert seen == {Q.Q4_K, Q.Q6_K}
