"""The output head's quantized route (engine/model/quantized_head.py): taken for a few bfloat16 rows only,
and the same head as the float one up to bfloat16 rounding.

A bfloat16 model served quantized keeps the file's head blocks beside the float head; `logits` takes them
for at most HEAD_KERNEL_MAX_ROWS rows. Broken routing shows as the wrong route's call count; a wrong
weight (rows swapped, the wrong tensor, a lost scale) as logits far outside bfloat16's error.
"""

from __future__ import annotations

import pytest
import torch

from engine.loader import load_model
from engine.model.quantized_head import HEAD_KERNEL_MAX_ROWS, QuantizedHead

# Of the largest logit's magnitude: both routes round to bfloat16 (weights or scales, and the output),
# about 2^-8 relative each; a wrong weight is off by the logits' own scale.
BF16_TOLERANCE = 3e-2


def routes_taken(model, hidden: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """model.logits(hidden), and which heads ran."""
    taken: list[str] = []
    hooks = [model.quantized_head.register_forward_hook(lambda *_: taken.append("quantized")),
             model.lm_head.register_forward_hook(lambda *_: taken.append("float"))]
    try:
        with torch.no_grad():
            return model.logits(hidden), taken
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("tied", [True, False])
def test_few_bfloat16_rows_take_the_quantized_head_and_agree_with_the_float_one(tiny_gguf, tied):
    path, _ = tiny_gguf("llama", "Q4_1", seed=3, embedding_qtype="Q8_0", tie_word_embeddings=tied)
    model = load_model(path, dtype="bfloat16", weights="quantized").model
    assert isinstance(model.quantized_head, QuantizedHead), "liveness: the loader built the route"
    torch.manual_seed(0)
    for rows in (1, HEAD_KERNEL_MAX_ROWS, HEAD_KERNEL_MAX_ROWS + 1):
        hidden = torch.randn(rows, model.config.hidden_size).to(torch.bfloat16)
        logits, taken = routes_taken(model, hidden)
        assert taken == (["quantized"] if rows <= HEAD_KERNEL_MAX_ROWS else ["float"]), rows
        with torch.no_grad():
            reference = model.lm_head(hidden).float()
        assert logits.shape == reference.shape
        assert (logits.float() - reference).abs().max() <= BF16_TOLERANCE * reference.abs().max(), rows
    hidden = torch.zeros(1, model.config.hidden_size)
    assert not model.quantized_head.serves(hidden) and not model.quantized_head.serves(hidden.half())


@pytest.mark.parametrize("dtype, weights", [("float32", "quantized"), ("bfloat16", "dequantized")])
def test_no_quantized_head_where_it_would_not_pay(tiny_gguf, dtype, weights):
    path, _ = tiny_gguf("llama", "Q4_1", seed=3, embedding_qtype="Q8_0", tie_word_embeddings=True)
    assert load_model(path, dtype=dtype, weights=weights).model.quantized_head is None
