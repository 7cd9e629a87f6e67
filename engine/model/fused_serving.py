"""The serving forward on the native fused decoder layer (engine/kernels/cpu/decoder_layer.py): each layer of
a step is one native call, with the residual stream in fp32 from the embedding to the logits.

A model takes this route when it is served as `make run` serves on a CPU: every projection a
QuantizedLinear on our native kernels (GGUF weights kept quantized, bfloat16 activations) and the head
too, with Llama's block (pre-norms, SiLU-gated MLP; q/k/v biases and q/k norms as Qwen2 and Qwen3 have
them) or Gemma 3's (norms after attention and MLP too, GeGLU, the embedding scaled, here in fp32). Every
float model keeps the module path. The training forward (no metadata) always takes the module path; so does everything when
WORKBENCH_FUSED_LAYERS=off, which exists to compare the two.

Against the module path in bfloat16 this keeps more precision (fp32 between the projections, where the
module path rounds every intermediate to bfloat16) and has no per-op overhead; like it, a token's
logits are the same bits whatever else is in the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from engine import environment
from engine.kernels import cpu as cpu_kernels
from engine.model.attention_metadata import AttentionMetadata

if TYPE_CHECKING:  # the model imports this module; at run time it is handed in
    from engine.model.llama import DecoderLayer, LlamaForCausalLM
    from engine.model.quantized import QuantizedLinear
    from engine.scheduler.kv_cache import PagedKVCache


@dataclass(frozen=True)
class FusedHead:
    packed: torch.Tensor  # the head's weight in the native layout
    qtype: int
    vocab: int


class FusedServing:
    """What the fused route holds beyond the layers' own weights: the final norm, the head, the RoPE
    frequencies of each kind of layer. Built by `prepare`, which decides whether a model can take it."""

    def __init__(self, model: "LlamaForCausalLM", head: "QuantizedLinear") -> None:
        config = model.config
        self.final_norm = model.model.norm.weight.detach().float().contiguous()
        self.embedding_multiplier = config.embedding_multiplier
        self.eps = config.rms_norm_eps
        packed = head.packed()
        assert packed is not None  # prepare() checked
        self.head = FusedHead(packed, int(head.qtype), head.out_features)
        self.inv_freq = {sliding: model.rope_frequencies(sliding, torch.device("cpu")).float().contiguous()
                         for sliding in model.rope_kinds}

    def forward(self, model: "LlamaForCausalLM", input_ids: torch.Tensor, positions: torch.Tensor,
                metadata: AttentionMetadata, kv_cache: "PagedKVCache") -> torch.Tensor:
        """Final hidden states [N, D] in fp32 (normed), the step's keys and values written to the cache."""
        x = model.model.embed_tokens(input_ids).float()  # [N, D]; a fresh tensor the layers update in place
        if self.embedding_multiplier is not None:
            x = x * self.embedding_multiplier
        tables = {sliding: cpu_kernels.rope_tables(positions, freqs) for sliding, freqs in self.inv_freq.items()}
        for index, layer in enumerate(model.model.layers):
            x = layer(x, *tables[model.layer_rope[index]], metadata, kv_cache.layer(index))
        return cpu_kernels.rms_norm(x, self.final_norm, self.eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[M, D] fp32 final hidden states -> [M, V] fp32 logits, the same kernel at every row count."""
        return cpu_kernels.qlinear(hidden, self.head.packed, self.head.qtype, self.head.vocab,
                                   out_dtype=torch.float32)


def layer_forward(layer: "DecoderLayer", weights: cpu_kernels.LayerWeights, x: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, metadata: AttentionMetadata, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One layer of the fused route: x [N, D] fp32 updated in place and returned."""
    assert metadata.block_tables is not None and metadata.token_sequence is not None  # built on every CPU step
    attn = layer.self_attn
    cpu_kernels.decoder_layer(x, weights, cos, sin, cache[0], cache[1], metadata.slot_mapping, metadata.block_tables,
                              metadata.token_sequence, metadata.positions, metadata.block_size, attn.sliding_window,
                              attn.scale, layer.input_layernorm.eps)
    return x


def prepare(model: "LlamaForCausalLM", layers: list["DecoderLayer"]) -> FusedServing | None:
    """Gives each layer its fused weights and returns the route's other parts, where the model can take
    it (see the module's docstring); else None and the model is left as it was."""
    config = model.config
    if (environment.read("WORKBENCH_FUSED_LAYERS") == "off" or isinstance(model.lm_head, nn.Linear)
            or config.hidden_act not in cpu_kernels.ACTIVATIONS or config.attention_output_bias or config.mlp_bias
            or not cpu_kernels.native_available()
            or model.model.norm.weight.dtype != torch.bfloat16):
        return None
    from engine.model.quantized import QuantizedLinear  # needs the gguf package, which float models lack

    head = model.lm_head
    if not isinstance(head, QuantizedLinear) or head.packed() is None:
        return None
    weights = [_layer_weights(layer, QuantizedLinear) for layer in layers]
    if any(w is None for w in weights):
        return None
    for layer, w in zip(layers, weights):
        layer.fused = w
    return FusedServing(model, head)


def _layer_weights(layer: "DecoderLayer", quantized: type["QuantizedLinear"]) -> cpu_kernels.LayerWeights | None:
    attn, mlp = layer.self_attn, layer.mlp
    qkv, o, gate_up, down = attn._qkv, attn.o_proj, mlp._gate_up, mlp.down_proj
    if not (isinstance(qkv, quantized) and isinstance(o, quantized) and isinstance(gate_up, quantized)
            and isinstance(down, quantized)):
        return None
    packed = [p.packed() for p in (qkv, o, gate_up, down)]
    if any(p is None for p in packed):
        return None
    qkv_w, o_w, gate_up_w, down_w = (p for p in packed if p is not None)
    empty = torch.empty(0)

    def f32(t: torch.Tensor | None) -> torch.Tensor:
        return empty if t is None else t.detach().float().contiguous()

    norms = (f32(attn.q_norm.weight), f32(attn.k_norm.weight)) if attn.qk_norm else (empty, empty)
    if layer.sandwich:  # Gemma's names: post_attention_layernorm is the norm after attention
        ffn_norm, post = layer.pre_feedforward_layernorm, (layer.post_attention_layernorm, layer.post_feedforward_layernorm)
        post_norms = tuple(f32(norm.weight) for norm in post)
    else:
        ffn_norm, post_norms = layer.post_attention_layernorm, (empty, empty)
    return cpu_kernels.LayerWeights(
        tensors=(f32(layer.input_layernorm.weight), qkv_w, f32(qkv.bias), *norms, o_w, f32(ffn_norm.weight),
                 gate_up_w, down_w, *post_norms),
        qtypes=(int(qkv.qtype), int(o.qtype), int(gate_up.qtype), int(down.qtype)),
        shape=(attn.num_heads, attn.num_kv_heads, attn.head_dim, down.in_features),
        activation=cpu_kernels.ACTIVATIONS[layer.mlp.activation])
