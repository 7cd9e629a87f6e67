"""A GGUF checkpoint (llama.cpp's single-file format) read as our model: config, tokenizer, tensors.

    checkpoint = GGUFCheckpoint(path)
    checkpoint.config, checkpoint.tokenizer, checkpoint.eos_token_ids
    for name, tensor in checkpoint.tensors(): ...   # HF parameter names, llama.cpp's row order undone

The file is parsed by engine/loading/gguf_file.py (memory-mapped) and dequantized by the `gguf`
package. Metadata becomes an HF-style config dict, so `ModelConfig.from_hf_dict` applies the same
defaults and checks as for config.json; the family's registry entry (engine/model/architectures/) names
the file's architecture, its tensor names unlike Llama's, and what llama.cpp assumes where the metadata
is silent. For some families (the entry's gguf_permuted_qk) llama.cpp's converter permutes the rows of
the Q and K projections (it rotates pairs of adjacent features, HF rotates halves); `GGUFTensor.rows`
undoes that, for float and quantized data alike, since the permutation moves whole output rows. Every way a file can
be wrong (an architecture, tokenizer or tensor type we do not run, a missing key, a tensor whose shape
disagrees with the metadata) raises `ModelLoadError` naming it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from engine.loading.fused_tensors import split_rows
from engine.loading.gguf_file import GGUFFile, GGUFFormatError
from engine.loading.model_errors import ModelLoadError
from engine.loading.tokenizer import Tokenizer, TokenizerError
from engine.model.config import ConfigError, ModelConfig
from engine.model.architectures import registry

_REQUIRED = object()
# Tensors that are settings, not parameters: Llama 3.1's RoPE scaling as per-frequency factors.
ROPE_FREQS = "rope_freqs.weight"
# The per-piece metadata arrays, read once into the tokenizer (release_memory drops them).
VOCABULARY_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                     "tokenizer.ggml.merges")

_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
_LAYER_TENSORS = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                  "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                  "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                  "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                  "ffn_down": "mlp.down_proj"}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file under its HF name. `raw` is the file's data (float, or uint8 ggml blocks
    laid out [rows, bytes per row]); `row_order` puts its rows in HF's order (None: already are)."""

    name: str
    gguf_name: str
    qtype: Any                     # gguf.GGMLQuantizationType
    shape: tuple[int, ...]         # HF order: [out, in] for a weight
    raw: np.ndarray
    row_order: np.ndarray | None

    @property
    def rows(self) -> np.ndarray:
        """The raw data with HF's row order (a copy when reordered, the mapped file otherwise)."""
        return self.raw if self.row_order is None else self.raw[self.row_order]

    def dequantized(self) -> np.ndarray:
        """float32 values in HF's shape and row order."""
        import gguf

        try:
            values = gguf.quants.dequantize(self.rows, self.qtype)
        except NotImplementedError:
            raise ModelLoadError(f"tensor {self.gguf_name!r} has type {self.qtype.name}, which the gguf "
                                 "package cannot dequantize") from None
        return np.asarray(values, dtype=np.float32).reshape(self.shape)


class GGUFCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = GGUFFile(path)
        except (GGUFFormatError, OSError) as exc:
            raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
        architecture = self.metadata("general.architecture")
        families = registry.gguf_architectures()
        if architecture not in families:
            raise ModelLoadError(f"{path}: architecture {architecture!r} is not supported; "
                                 f"supported: {', '.join(families)}")
        self.architecture = architecture
        self.family = families[architecture]

    def metadata(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self._file.metadata:
            return self._file.metadata[key]
        if default is _REQUIRED:
            raise ModelLoadError(f"{self.path}: metadata key {key!r} is missing")
        return default

    def _arch(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.metadata(f"{self.architecture}.{key}", default)

    @cached_property
    def _tensor_names(self) -> set[str]:
        return {tensor.name for tensor in self._file.tensors}

    @cached_property
    def parameter_count(self) -> int:
        """Every tensor's elements, as llama.cpp and Ollama count a file's parameters."""
        return sum(math.prod(t.dims) for t in self._file.tensors)

    @cached_property
    def quantization(self) -> str:
        """The file's quantization as llama.cpp names it ("Q8_0", "Q4_K_M", "F16"): its general.file_type,
        or where that is missing or unknown, the type that holds most of its weights."""
        import gguf

        try:
            return gguf.LlamaFileType(self.metadata("general.file_type")).name.removeprefix("MOSTLY_") \
                .removeprefix("ALL_")
        except (ModelLoadError, ValueError):
            elements: dict[str, int] = {}
            for tensor in self._file.tensors:
                elements[tensor.qtype.name] = elements.get(tensor.qtype.name, 0) + math.prod(tensor.dims)
            return max(elements, key=elements.__getitem__)

    @cached_property
    def config(self) -> ModelConfig:
        heads = self._arch("attention.head_count")
        hidden = self._arch("embedding_length")
        head_dim = self._arch("attention.key_length", None) or hidden // heads
        if self._arch("attention.value_length", head_dim) != head_dim:
            raise ModelLoadError(f"{self.path}: key and value head sizes differ; not supported")
        if self._arch("rope.dimension_count", head_dim) != head_dim:
            raise ModelLoadError(f"{self.path}: RoPE over {self._arch('rope.dimension_count')} of {head_dim} "
                                 "head features (partial rotary) is not supported")
        longrope = sorted(self._tensor_names & {"rope_factors_long.weight", "rope_factors_short.weight"})
        if longrope:
            raise ModelLoadError(f"{self.path}: LongRoPE scaling ({', '.join(longrope)}) is not supported")
        raw = {
            "model_type": self.family.model_type,
            "vocab_size": self._arch("vocab_size", None) or len(self.metadata("tokenizer.ggml.tokens")),
            "hidden_size": hidden,
            "intermediate_size": self._arch("feed_forward_length"),
            "num_hidden_layers": self._arch("block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": self._arch("attention.head_count_kv", heads),
            "head_dim": head_dim,
            "max_position_embeddings": self._arch("context_length"),
            "rms_norm_eps": self._arch("attention.layer_norm_rms_epsilon"),
            "rope_theta": self._arch("rope.freq_base", 10000.0),
            "rope_scaling": self._rope_scaling(),
            "tie_word_embeddings": "output.weight" not in self._tensor_names,
            "attention_bias": "blk.0.attn_q.bias" in self._tensor_names,
            # llama.cpp writes 0 for "no window" (its Phi-3 converter always writes the key).
            "sliding_window": self._arch("attention.sliding_window", None) or None,
            "rope_freq_factors": self._rope_freq_factors(),
            "final_logit_softcapping": self._arch("final_logit_softcapping", None),
            "attn_logit_softcapping": self._arch("attn_logit_softcapping", None),
        }
        if self.family.gguf_settings is not None:
            raw.update(self.family.gguf_settings(self._arch, raw, head_dim))
        try:
            return ModelConfig.from_hf_dict(raw)
        except ConfigError as exc:
            raise ModelLoadError(f"{self.path}: {exc}") from exc

    def _rope_freq_factors(self) -> list[float] | None:
        tensor = next((t for t in self._file.tensors if t.name == ROPE_FREQS), None)
        return None if tensor is None else [float(v) for v in np.asarray(tensor.data, dtype=np.float32).reshape(-1)]

    def _rope_scaling(self) -> dict | None:
        kind = self._arch("rope.scaling.type", "none")
        if kind == "none":
            return None
        if kind == "linear":
            return {"rope_type": "linear", "factor": self._arch("rope.scaling.factor")}
        raise ModelLoadError(f"{self.path}: rope.scaling.type {kind!r} is not supported; supported: none, linear")

    @cached_property
    def eos_token_ids(self) -> frozenset[int]:
        """EOS and, where the file names them, end-of-turn and end-of-message: llama.cpp ends a
        generation on any of them."""
        keys = ("eos_token_id", "eot_token_id", "eom_token_id")
        return frozenset(v for v in (self.metadata(f"tokenizer.ggml.{k}", None) for k in keys) if v is not None)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        from engine.loading.gguf_tokenizer import tokenizer_from_gguf

        try:
            return tokenizer_from_gguf(self.metadata, str(self.path))
        except TokenizerError as exc:
            raise ModelLoadError(str(exc)) from exc

    def tensors(self) -> Iterator[GGUFTensor]:
        """Every tensor of the file under its HF name and in HF's shape (the loader checks the shapes)."""
        config = self.config
        for tensor in self._file.tensors:
            if tensor.name == ROPE_FREQS:  # read into the config
                continue
            name = self._hf_name(tensor.name)
            shape = tuple(reversed(tensor.dims))  # ggml lists the fastest dimension first
            row_order = None
            if self.family.gguf_permuted_qk and name.endswith(("q_proj.weight", "q_proj.bias",
                                                               "k_proj.weight", "k_proj.bias")):
                heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
                row_order = _unpermute_rows(shape[0], heads)
            raw = tensor.data
            if raw.ndim == 1 and len(shape) == 2:
                raw = raw.reshape(shape[0], -1)
            parts = split_rows(config, name, shape[0])
            if parts is None:
                yield GGUFTensor(name, tensor.name, tensor.qtype, shape, raw, row_order)
                continue
            for part, rows in parts:
                part_raw = raw[rows]
                yield GGUFTensor(part, tensor.name, tensor.qtype, (part_raw.shape[0], *shape[1:]), part_raw, None)

    def release_memory(self) -> None:
        """Gives back what a loaded model no longer needs of the file, while the checkpoint stays cached
        for later reads of its config, tokenizer and tensors: the vocabulary's metadata fields (already
        in the tokenizer; for Gemma 3's 262,144 pieces about 100 MB of Python lists) and this process's
        resident pages of the mapped file (the model holds its own copies; the pages fault in again from
        the page cache if the tensors are read again). The file is left open."""
        self.config, self.tokenizer  # noqa: B018  computed (and cached) before their source goes
        for key in VOCABULARY_FIELDS:
            self._file.metadata.pop(key, None)
        self._file.release_pages()

    def _hf_name(self, gguf_name: str) -> str:
        if gguf_name in _GLOBAL_TENSORS:
            return _GLOBAL_TENSORS[gguf_name]
        match = _LAYER_NAME.fullmatch(gguf_name)
        names = {**_LAYER_TENSORS, **self.family.gguf_tensors}
        if match is None or match.group(2) not in names:
            raise ModelLoadError(f"{self.path}: unexpected tensor {gguf_name!r} for this architecture")
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{names[part]}.{kind}"


def _unpermute_rows(rows: int, heads: int) -> np.ndarray:
    """Row indices that undo llama.cpp's permutation: within each head its converter put feature
    pairs (i, i + D/2) next to each other (rows 2i, 2i + 1); HF keeps the two halves apart."""
    if rows % (2 * heads):
        raise ModelLoadError(f"a Q/K projection of {rows} rows cannot hold {heads} heads of even size")
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(0, 2, 1).reshape(-1)
