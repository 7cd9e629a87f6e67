"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3) as plain torch modules, with HF
parameter names.

Parameter names match HF checkpoints one for one (model.layers.N.self_attn.q_proj.weight, ...), so a
safetensors file loads with no renaming and our checkpoints load unchanged in HF transformers.
`forward` returns final hidden states; `logits` projects only the rows the caller will sample, because
the vocabulary projection is the most expensive matmul of a decode step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from engine.kernels.cpu import LayerWeights
from engine.model import fused_serving
from engine.model.attention import DECODE_BACKENDS, Attention, decode_attention_backend
from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.layers import Embedding, FusedFloatLinear, GatedMLP, Linear, RMSNorm, invariant_gemm_choice
from engine.model.rope import rope_cos_sin, rope_inverse_frequencies

if TYPE_CHECKING:  # handed in at run time: importing the scheduler would close a circle through loading
    from engine.scheduler.kv_cache import PagedKVCache


class DecoderLayer(nn.Module):
    """Norm, attention, residual; norm, MLP, residual. With sandwich norms (Gemma) the attention's and
    the MLP's outputs are normed again before their residual add, under Gemma's names
    (post_attention_layernorm is then the norm after attention, pre_feedforward_layernorm the one
    before the MLP; in Llama post_attention_layernorm is the one before the MLP)."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.sandwich = config.sandwich_norms
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, config.hidden_act)
        self.fused: LayerWeights | None = None  # set where the model serves on the fused route

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata | None,
                cache: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        if self.fused is not None and metadata is not None and cache is not None:
            return fused_serving.layer_forward(self, self.fused, x, cos, sin, metadata, cache)
        attended = self.self_attn(self.input_layernorm(x), cos, sin, metadata, cache)
        if self.sandwich:
            x = x + self.post_attention_layernorm(attended)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x))

    def triton_step(self, residual: torch.Tensor, pending: torch.Tensor | None, cos: torch.Tensor,
                    sin: torch.Tensor, metadata: AttentionMetadata,
                    cache: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer in a serving step on the Triton backend: (output, residual) where `forward` gives
        residual + output, the add left to the next add + RMSNorm kernel (the next layer's input norm, or
        the final norm). `pending`: the previous layer's output not yet added to `residual` (None for the
        first layer). Every norm is a Triton row kernel, whose rows do not depend on the row count, and the
        MLP's activation and multiply one kernel."""
        if pending is None:
            normed = self.input_layernorm.triton_forward(residual)
        else:
            normed, residual = self.input_layernorm.triton_add(pending, residual)
        attended = self.self_attn(normed, cos, sin, metadata, cache)
        if self.sandwich:
            normed, residual = self.pre_feedforward_layernorm.triton_add(
                self.post_attention_layernorm.triton_forward(attended), residual)
            return self.post_feedforward_layernorm.triton_forward(self.mlp.triton_forward(normed)), residual
        normed, residual = self.post_attention_layernorm.triton_add(attended, residual)
        return self.mlp.triton_forward(normed), residual


class DecoderStack(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        # Kept in fp32 and outside the module's buffers so that model.to(bfloat16) cannot round them;
        # keyed by (sliding, device): sliding-window layers may have a RoPE base of their own (Gemma 3).
        # Per layer, whether it takes the sliding layers' RoPE (rope_frequencies' `sliding`); the kinds present.
        self.layer_rope = tuple(config.rope_local_theta is not None and config.layer_window(i) is not None
                                for i in range(config.num_hidden_layers))
        self._inv_freq = {(sliding, torch.device("cpu")): rope_inverse_frequencies(config, sliding)
                          for sliding in set(self.layer_rope)}
        self.rope_kinds = tuple(sorted(set(self.layer_rope)))
        self.fused: fused_serving.FusedServing | None = None
        self.invariant_gemm = False  # set_invariant_gemm's

    def fuse_for_inference(self) -> None:
        """Fuse q/k/v and gate/up projections (fewer, larger matmuls per step), and take the fused serving
        route where the model can (engine/model/fused_serving.py). Parameters keep their HF names; call
        after the weights are loaded, and not before training: the parameters stop asking for gradients,
        so a forward outside inference_mode still serves (the dense kernel has no backward)."""
        self.requires_grad_(False)
        layers = []
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)  # a ModuleList yields plain Modules to a type checker
            layer.self_attn.fuse_for_inference()
            layer.mlp.fuse_for_inference()
            layers.append(layer)
        for module in self.modules():  # quantized weights packed for the native kernels now, not at a first request
            prepare = getattr(module, "prepare_for_serving", None)
            if prepare is not None:
                prepare()
        self.fused = fused_serving.prepare(self, layers)

    def set_decode_attention(self, backend: str) -> None:
        """How every layer's decodes attend: "torch" or "triton" (engine/model/attention.py)."""
        if backend not in DECODE_BACKENDS:
            raise ValueError(f"decode attention backend must be one of {', '.join(DECODE_BACKENDS)}, got {backend!r}")
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.decode_backend = backend

    def set_invariant_gemm(self, on: bool) -> None:
        """Whether every float projection on CUDA takes the batch-invariant Triton GEMM (float_linear)."""
        for module in self.modules():
            for part in (module, *vars(module).values()):  # the fused projections are plain attributes
                if isinstance(part, (Linear, FusedFloatLinear)):
                    part.invariant_gemm = on
        self.invariant_gemm = on

    def choose_kernels(self, device: torch.device, triton_attention: bool, invariant_gemm: bool) -> str:
        """The decodes' attention and the float projections' GEMM for `device`, each Triton on CUDA where
        it imports unless turned off; returns what was chosen and why, for the log."""
        attention, why_attention = decode_attention_backend(device, triton_attention)
        self.set_decode_attention(attention)
        gemm, why_gemm = invariant_gemm_choice(device, invariant_gemm)
        self.set_invariant_gemm(gemm)
        return (f"decode attention: {attention} ({why_attention}); float projections: "
                f"{'the invariant Triton GEMM' if gemm else 'F.linear'} ({why_gemm})")

    @property
    def decode_attention(self) -> str:
        layer = self.model.layers[0]
        assert isinstance(layer, DecoderLayer)
        return layer.self_attn.decode_backend

    def tie_weights(self) -> None:
        """Share the embedding with the output projection when the config says so. Call again after
        anything that may replace parameters (to_empty from the meta device does)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def rope_frequencies(self, sliding: bool, device: torch.device) -> torch.Tensor:
        """The fp32 inverse frequencies of one kind of layer, [head_dim / 2], on `device` (copied once)."""
        if (sliding, device) not in self._inv_freq:
            self._inv_freq[sliding, device] = self._inv_freq[sliding, torch.device("cpu")].to(device)
        return self._inv_freq[sliding, device]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                metadata: AttentionMetadata | None = None,
                kv_cache: PagedKVCache | None = None) -> torch.Tensor:
        """Final hidden states for input_ids.

        Serving: input_ids and positions are flat [N] with `metadata` and `kv_cache`; keys and values
        are written to the cache. Training: [B, T] with neither; plain causal attention.
        """
        if self.fused is not None and metadata is not None and kv_cache is not None:
            return self.fused.forward(self, input_ids, positions, metadata, kv_cache)
        x = self.model.embed_tokens(input_ids)
        if self.config.embedding_multiplier is not None:
            # In the activation dtype, as HF rounds it (Gemma: sqrt(hidden_size)).
            x = x * torch.tensor(self.config.embedding_multiplier, dtype=x.dtype)
        tables = {sliding: rope_cos_sin(self.rope_frequencies(sliding, x.device), positions, x.dtype)
                  for sliding in self.rope_kinds}
        if metadata is not None and kv_cache is not None and self.decode_attention == "triton":
            return self._triton_step(x, tables, metadata, kv_cache)
        for index, layer in enumerate(self.model.layers):
            cache = kv_cache.layer(index) if kv_cache is not None else None
            x = layer(x, *tables[self.layer_rope[index]], metadata, cache)
        return self.model.norm(x)

    def _triton_step(self, x: torch.Tensor, tables: dict[bool, tuple[torch.Tensor, torch.Tensor]],
                     metadata: AttentionMetadata, kv_cache: PagedKVCache) -> torch.Tensor:
        """A serving step on the Triton backend (CUDA), prefills beside the decodes or not: each layer's last
        residual add is done in the next norm's add + RMSNorm kernel (vLLM's residual passing), so a layer
        launches one kernel where an add and the eight ops of a torch RMSNorm were (what a decode step
        launches is its cost at few rows on a GPU); and a decode's rows take the same kernels whatever
        shares its step, so their bits do not depend on it."""
        pending: torch.Tensor | None = None
        for index, layer in enumerate(self.model.layers):
            assert isinstance(layer, DecoderLayer)
            pending, x = layer.triton_step(x, pending, *tables[self.layer_rope[index]], metadata,
                                           kv_cache.layer(index))
        assert pending is not None  # a model has at least one layer
        return self.model.norm.triton_add(pending, x)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # One kernel whatever the row count: a row's logits must not depend on the rows beside it (batch
        # invariance), so no faster route for few rows (docs/BENCHMARKS_ARCHIVE.md has the cost).
        if self.fused is not None and hidden.dtype == torch.float32:  # the fused route's fp32 hidden states
            return self.fused.logits(hidden)
        return self.lm_head(hidden)
