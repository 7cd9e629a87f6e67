"""A GGUF file's tensors into our model: dequantized into float parameters, or kept quantized.

Dequantized, every tensor goes through the `gguf` package's own dequantizer into the model's dtype.
Quantized (`weights="quantized"`), the linear weights stored as Q4_0, Q4_1 or Q8_0 (or Q5_0, re-encoded
exactly as Q8_0, and where the native kernels are built Q4_K, Q5_K, Q6_K and Q5_1, re-encoded exactly as
the kernels' K types: engine/loading/transcode.py) keep those exact values in `QuantizedLinear` modules
(engine/model/quantized.py) that replace the float `Linear`s, and an embedding table of those types is
looked up in its rows (engine/model/quantized_embedding.py) instead of a float copy of the whole table;
norms, biases and every other type are dequantized as before. The output head (the embedding's data
where the two are tied: then both read one copy of the rows) is served quantized too where the model
runs in bfloat16 on our native kernels: one kernel at every row count, and the largest matmul of a
decode step at a quarter of bf16's bytes. Elsewhere it stays float, and so does a table tied to it (the
float head needs it anyway): the fp32 torch route would dequantize the whole vocabulary at every call.

On CUDA (bfloat16 only: EngineConfig and load_model refuse another dtype), quantized keeps the Q4_0 and
Q4_1 projections, as `CudaInt4Linear`s on the device (engine/kernels/gpu/cuda_int4.py: torch's int4 kernel,
scales rounded to bfloat16), each built from its rows on the CPU, which are then dropped. Every other
type is dequantized into bfloat16, with one log line that names them: the kernel has no 8-bit group
route, and the CPU's Q8_0 split into two int4 groups would both double the kernel's reads and round
each half to bfloat16 apart before they are summed (the high half's values reach 128 d, so each of its
roundings may be off by half a quantization step), where a bfloat16 copy is within 2^-8 of each weight;
the K-quants run on the native CPU kernels only. The embedding table and the head stay bfloat16 there
too: the quantized table lookup and head above are CPU routes, and llama.cpp writes most Q4 files'
output.weight as Q6_K anyway.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

import gguf
import numpy as np
import torch

from engine.loading.gguf_model import GGUFCheckpoint, GGUFTensor
from engine.loading.tensor_checks import check_complete, check_tensor, expected_tensors
from engine.loading.transcode import TRANSCODED, transcoded
from engine.model.llama import LlamaForCausalLM

if TYPE_CHECKING:  # imported at run time where a module is built
    from torch import nn

    from engine.model.quantized import QuantizedLinear

log = logging.getLogger(__name__)

Q = gguf.GGMLQuantizationType
FLOAT_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.F64})
# Where the output head's weight comes from: the embedding's data when the two are tied.
EMBEDDING = "model.embed_tokens.weight"
HEAD_SOURCES = {True: EMBEDDING, False: "lm_head.weight"}


def load_gguf_weights(model: LlamaForCausalLM, checkpoint: GGUFCheckpoint, dtype: torch.dtype,
                      quantized: bool, device: torch.device = torch.device("cpu")) -> None:
    """`device`: where the model's parameters are; on CUDA quantized keeps Q4_0/Q4_1 projections only."""
    expected = expected_tensors(model)
    seen: set[str] = set()
    kept: dict[str, GGUFTensor] = {}  # module path -> its GGUF tensor, for the weights served quantized
    by_name: dict[str, GGUFTensor] = {}  # the head's candidates, kept from the one pass over the file
    on_cpu = device.type == "cpu"
    tied = model.config.tie_word_embeddings
    # A tied table stays quantized only where the head does (bf16 on the native kernels): a float head
    # needs the float table anyway.
    table_quantized = quantized and on_cpu and (not tied or (dtype == torch.bfloat16 and _native_kernels()))
    expanded: Counter[str] = Counter()  # projections of a quantized type dequantized on CUDA, by type
    with torch.no_grad():
        for tensor in checkpoint.tensors():
            check_tensor(expected, checkpoint.path.name, tensor.name, tensor.shape)
            seen.add(tensor.name)
            if tensor.name in HEAD_SOURCES.values():
                by_name[tensor.name] = tensor
            if quantized and on_cpu and _servable_quantized(tensor):
                kept[tensor.name.removesuffix(".weight")] = tensor
                continue
            if quantized and not on_cpu and _is_projection(tensor) and tensor.qtype not in FLOAT_TYPES:
                if _cuda_servable(tensor):
                    kept[tensor.name.removesuffix(".weight")] = tensor
                    continue
                expanded[tensor.qtype.name] += 1
            if tensor.name == EMBEDDING and table_quantized and _servable_type(tensor):
                continue  # looked up in its rows (QuantizedEmbedding): the float table is never filled
            values = np.require(tensor.dequantized(), requirements="W")  # the mapped file is read-only
            expected[tensor.name].copy_(torch.from_numpy(values).to(dtype))
    check_complete(expected, seen)
    if expanded:
        log.info("weights='quantized' on %s: %s dequantized to %s (torch's CUDA int4 kernel serves Q4_0 and "
                 "Q4_1 only)", device, ", ".join(f"{n} {name}" for name, n in sorted(expanded.items())),
                 str(dtype).removeprefix("torch."))
    table = by_name.get(EMBEDDING)
    shared = False  # the head is the quantized table itself
    if table is not None and table_quantized and _servable_type(table):
        shared = _quantize_embedding(model, table, dtype)
    if quantized and on_cpu and dtype == torch.bfloat16 and not shared:
        head = _quantized_head(by_name.get(HEAD_SOURCES[tied]))
        if head is not None:
            kept["lm_head"] = head
    _replace_linears(model, kept, device)


def _replace_linears(model: LlamaForCausalLM, kept: dict[str, GGUFTensor], device: torch.device) -> None:
    """Each float Linear named in `kept` (module path -> its GGUF tensor) replaced by its quantized rows."""
    for path, tensor in kept.items():
        parent, _, attr = path.rpartition(".")
        owner = model.get_submodule(parent)
        linear = getattr(owner, attr)
        rows = _quantized_linear(tensor, linear.in_features, linear.bias)
        # On CUDA the CPU rows are dropped with the QuantizedLinear that held them.
        setattr(owner, attr, rows if device.type == "cpu" else _on_cuda(rows, device))


def _quantized_linear(tensor: GGUFTensor, in_features: int, bias: torch.Tensor | None = None) -> "QuantizedLinear":
    from engine.model.quantized import QuantizedLinear

    rows, qtype = transcoded(tensor.rows, tensor.qtype)
    return QuantizedLinear.from_ggml(rows, qtype, in_features, bias=bias)


def _quantize_embedding(model: LlamaForCausalLM, tensor: GGUFTensor, dtype: torch.dtype) -> bool:
    """The embedding served from its quantized rows; a tied head serves from the same rows (one copy).
    True when the head is that table."""
    from engine.model.quantized_embedding import QuantizedEmbedding

    table = _quantized_linear(tensor, model.config.hidden_size)
    model.model.embed_tokens = QuantizedEmbedding(table, dtype)  # type: ignore[assignment]
    if model.config.tie_word_embeddings:
        model.lm_head = table  # type: ignore[assignment]
        return True
    return False


def _native_kernels() -> bool:
    from engine.kernels import cpu

    return cpu.native_available()


def _quantized_head(tensor: GGUFTensor | None) -> GGUFTensor | None:
    """The output head's GGUF tensor where the native kernels can serve it, else None."""
    if not _native_kernels():
        return None
    return tensor if tensor is not None and _servable_type(tensor) else None


def _on_cuda(linear: "QuantizedLinear", device: torch.device) -> "nn.Module":
    from engine.kernels.gpu.cuda_int4 import CudaInt4Linear

    return CudaInt4Linear.from_quantized(linear, device)


def _is_projection(tensor: GGUFTensor) -> bool:
    return tensor.name.endswith("_proj.weight")


def _cuda_servable(tensor: GGUFTensor) -> bool:
    from engine.kernels.gpu.cuda_int4 import CUDA_TYPES

    return tensor.qtype in CUDA_TYPES


def _servable_quantized(tensor: GGUFTensor) -> bool:
    return _is_projection(tensor) and _servable_type(tensor)


def _servable_type(tensor: GGUFTensor) -> bool:
    from engine.model.quantized import BLOCK_BYTES, K_QUANTS  # the types QuantizedLinear serves

    if tensor.qtype in TRANSCODED and TRANSCODED[tensor.qtype] in K_QUANTS:
        return _native_kernels()  # no torch route: dequantized where the kernels are not built
    return tensor.qtype in BLOCK_BYTES or tensor.qtype in TRANSCODED
