"""A GGUF file's tensors into our model: dequantized into float parameters, or kept quantized.

Dequantized, every tensor goes through the `gguf` package's own dequantizer into the model's dtype.
Quantized (`weights="quantized"`), the linear weights stored as Q4_0, Q4_1 or Q8_0 (or Q5_0, re-encoded
exactly as Q8_0: engine/loading/transcode.py) keep those exact values in `QuantizedLinear` modules
(engine/model/quantized.py) that replace the float `Linear`s;
norms, biases, the embedding and every other type are dequantized as before. The output head (the
embedding's data where the two are tied) is served quantized too where the model runs in bfloat16 on
our native kernels: one kernel at every row count, and the largest matmul of a decode step at a
quarter of bf16's bytes. Elsewhere it stays float (a tied head shares the float embedding, which the
lookup needs anyway): the fp32 torch route would dequantize the whole vocabulary at every call.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.loading.gguf_model import GGUFCheckpoint, GGUFTensor
from engine.loading.tensor_checks import check_complete, check_tensor, expected_tensors
from engine.loading.transcode import TRANSCODED, transcoded
from engine.model import LlamaForCausalLM


# Where the output head's weight comes from: the embedding's data when the two are tied.
HEAD_SOURCES = {True: "model.embed_tokens.weight", False: "lm_head.weight"}


def load_gguf_weights(model: LlamaForCausalLM, checkpoint: GGUFCheckpoint, dtype: torch.dtype,
                      quantized: bool) -> None:
    expected = expected_tensors(model)
    seen: set[str] = set()
    kept = {}  # module path -> its GGUF tensor, for the weights served quantized
    by_name: dict[str, GGUFTensor] = {}  # the head's candidates, kept from the one pass over the file
    with torch.no_grad():
        for tensor in checkpoint.tensors():
            check_tensor(expected, checkpoint.path.name, tensor.name, tensor.shape)
            seen.add(tensor.name)
            if tensor.name in HEAD_SOURCES.values():
                by_name[tensor.name] = tensor
            if quantized and _servable_quantized(tensor):
                kept[tensor.name.removesuffix(".weight")] = tensor
                continue
            values = np.require(tensor.dequantized(), requirements="W")  # the mapped file is read-only
            expected[tensor.name].copy_(torch.from_numpy(values).to(dtype))
    check_complete(expected, seen)
    if quantized and dtype == torch.bfloat16:
        head = _quantized_head(by_name.get(HEAD_SOURCES[model.config.tie_word_embeddings]))
        if head is not None:
            kept["lm_head"] = head
    if kept:
        from engine.model.quantized import QuantizedLinear

        for path, tensor in kept.items():
            parent, _, attr = path.rpartition(".")
            owner = model.get_submodule(parent)
            linear = getattr(owner, attr)
            rows, qtype = transcoded(tensor.rows, tensor.qtype)
            setattr(owner, attr, QuantizedLinear.from_ggml(rows, qtype, linear.in_features, bias=linear.bias))


def _quantized_head(tensor: GGUFTensor | None) -> GGUFTensor | None:
    """The output head's GGUF tensor where the native kernels can serve it, else None."""
    from engine.kernels import cpu

    if not cpu.native_available():
        return None
    return tensor if tensor is not None and _servable_type(tensor) else None


def _servable_quantized(tensor: GGUFTensor) -> bool:
    return tensor.name.endswith("_proj.weight") and _servable_type(tensor)


def _servable_type(tensor: GGUFTensor) -> bool:
    from engine.model.quantized import BLOCK_BYTES  # the types QuantizedLinear serves

    return tensor.qtype in BLOCK_BYTES or tensor.qtype in TRANSCODED
