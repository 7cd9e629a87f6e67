"""Q5_0 re-encoded as Q8_0 keeps every weight: the gguf package's dequantization of both is equal."""

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
