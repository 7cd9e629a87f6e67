"""EngineConfig: how an engine is built (model, device, memory, scheduler), checked on construction.

A config is what its constructor was given: `EngineConfig(...)` reads no environment, so the Python API
behaves the same whoever calls it. `EngineConfig.from_env(...)` is for the programs that take the
engine's `ARC_*` flags from the environment (the serving layer, the command lines). Every variable the
engine reads, these flags and the few build-time switches (the CPU kernel path, the fused layer, the
model cache), is read through engine/environment.py, which lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.host.capabilities import REGISTRY, env_value
from engine.model.config import ModelConfig
from engine.scheduler import SCHEDULERS
from engine.scheduler.kv_cache import blocks_needed

PREFIX_CACHE_SCOPES = ("user", "deployment")
# The defaults of the step's token budgets; docs/OPERATIONS.md, "Chunked prefill", says why these numbers.
DEFAULT_TOKEN_BUDGET = 2048        # max_num_batched_tokens unset, either device
CPU_PREFILL_BESIDE_DECODES = 192   # max_prefill_beside_decodes unset, on a CPU; a GPU has no such limit
# kv_cache_mb unset, on a CPU (a GPU sizes its pool by its free memory): room for a busy server's streams
# (SmolLM2: 91K tokens, 32 streams of 2,800), taken from memory only as blocks are first written.
CPU_KV_CACHE_MB = 2048


@dataclass(frozen=True)
class EngineConfig:
    model: str = "demo"             # "demo", a packaged model ("smollm2"), an HF directory or a .gguf file
    device: str = "cpu"
    dtype: str = "float32"
    # GGUF files: "quantized" keeps Q4_0/Q4_1/Q8_0 linear weights as they are (torch's CPU int4
    # kernel); "dequantized" expands them, exactly, into `dtype`. None: dequantized, the exact fp32
    # model that matches HF transformers. On an AVX2 CPU torch's int4 kernel is vectorized only for
    # bfloat16 activations: quantized pays with dtype="bfloat16" and is slow in float32
    # (docs/BENCHMARKS_ARCHIVE.md, the SmolLM2 sections). On CUDA quantized keeps Q4_0/Q4_1 only, 4-bit on the
    # device with bfloat16 scales (engine/kernels/gpu/cuda_int4.py), and needs dtype="bfloat16".
    weights: str | None = None
    scheduler: str = "paged"
    block_size: int = 16
    # KV pool size when num_kv_blocks is not given. None: CPU_KV_CACHE_MB on a CPU; on a GPU the
    # fraction `kv_memory_fraction` of the device memory still free once the weights are loaded (as vLLM's
    # gpu_memory_utilization sizes its pool), the rest left for activations and captured graphs.
    kv_cache_mb: int | None = None
    kv_memory_fraction: float = 0.8
    num_kv_blocks: int | None = None
    swap_blocks: int = 0            # host-memory blocks for swap preemption; 0: recompute only
    max_num_seqs: int = 64
    # The tokens one step may feed (chunked prefill, engine/scheduler/paged.py): a prompt longer than
    # what the step's decodes leave is prefilled in chunks over several steps. None: DEFAULT_TOKEN_BUDGET.
    max_num_batched_tokens: int | None = None
    # While any stream decodes, the prompt tokens a step may feed beside them: what bounds the
    # streams' inter-token latency when a long prompt arrives. None: the device's default
    # (`prefill_budget_beside_decodes`: 192 on a CPU, where every prompt token lengthens the step;
    # no limit beyond the step's budget on a GPU).
    max_prefill_beside_decodes: int | None = None
    max_model_len: int | None = None  # at most the model's max_position_embeddings
    # Whose cached prefixes a request may find (engine/scheduler/block_pool.py): "user", its own user's only
    # (the requester's `cache_scope`); "deployment", every request's of this engine. Wider sharing is a
    # timing side channel between users (docs/OPERATIONS.md, "Prefix caching").
    prefix_cache_scope: str = "user"
    # The start-time runtime flags (engine/host/capabilities.py names the ARC_* variable of each; their
    # defaults there are these), here or through from_env.
    prefix_caching: bool = True
    device_loop: bool = False
    burst_length: int = 8           # decode steps per device-loop burst
    # None: by device. On CUDA, graphs on and captured on the capture stream, every graph the config can
    # replay captured at start (a capture in the middle of serving stalls every stream); elsewhere off
    # (the CPU replay backend checks replays; it does not speed a step).
    graphs: bool | None = None
    capture_stream: bool | None = None
    verify_replays: int = 0
    verify_always: bool = False
    layer_bisect: bool = False
    # On CUDA, decode attention through the Triton paged kernel where triton imports; False: the torch
    # path (blocks gathered, SDPA with a mask), which every other device takes anyway.
    triton_attention: bool = True
    # On CUDA, float projections through the Triton GEMM whose rows do not depend on the batch
    # (engine/kernels/gpu/triton_linear.py) where triton imports; False: F.linear (cuBLAS, faster where
    # its choice of kernel is better, and a row's last bits then follow the batch).
    invariant_gemm: bool = True
    # Per thousand finished requests, how many a host's replay audit re-runs (engine/host/replay_audit.py).
    replay_audit_permille: int = 10

    @classmethod
    def from_env(cls, **overrides: Any) -> EngineConfig:
        """A config whose runtime flags come from their ARC_* variables (engine/host/capabilities.py, each flag
        with a config field), unless `overrides` gives them; `overrides` sets any other field as the
        constructor does. A malformed variable is a ValueError naming it."""
        # Any: these are the constructor's own keyword arguments, which it types and checks one by one;
        # a TypedDict spelling them out again would repeat the class above.
        flags = {entry.config_field: env_value(entry.name) for entry in REGISTRY if entry.config_field}
        return cls(**{**flags, **overrides})

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")
        for name in ("block_size", "max_num_seqs", "burst_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_num_batched_tokens", "max_prefill_beside_decodes"):
            budget = getattr(self, name)
            if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)):
                raise ValueError(f"{name} must be a whole number of tokens or None, got {budget!r}")
        if not 0 < self.kv_memory_fraction < 1:
            raise ValueError(f"kv_memory_fraction must be between 0 and 1, got {self.kv_memory_fraction}")
        for name in ("kv_cache_mb", "num_kv_blocks", "max_model_len", "max_num_batched_tokens",
                     "max_prefill_beside_decodes"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")
        if not isinstance(self.replay_audit_permille, int) or not 0 <= self.replay_audit_permille <= 1000:
            raise ValueError(f"replay_audit_permille must be 0 to 1000, got {self.replay_audit_permille!r}")
        if self.weights not in (None, "quantized", "dequantized"):
            raise ValueError(f"weights must be 'quantized', 'dequantized' or None, got {self.weights!r}")
        if self.prefix_cache_scope not in PREFIX_CACHE_SCOPES:
            raise ValueError(f"prefix_cache_scope must be one of {', '.join(PREFIX_CACHE_SCOPES)}, "
                             f"got {self.prefix_cache_scope!r}")
        if self.swap_blocks < 0:
            raise ValueError(f"swap_blocks must be >= 0, got {self.swap_blocks}")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device {self.device!r} is not a torch device ({exc})") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}: this machine's torch sees no CUDA device")
        if self.weights == "quantized" and device.type not in ("cpu", "cuda"):
            raise ValueError("weights='quantized' runs on the CPU or on CUDA only (torch's int4 kernels); "
                             f"use weights='dequantized' on {self.device!r}")
        if self.weights == "quantized" and device.type == "cuda" and self.dtype != "bfloat16":
            raise ValueError(f"weights='quantized' on CUDA needs dtype='bfloat16' (torch's CUDA int4 kernel takes "
                             f"bfloat16 activations only), got dtype={self.dtype!r}; or use weights='dequantized'")

    @property
    def token_budget(self) -> int:
        """max_num_batched_tokens, or its default."""
        return self.max_num_batched_tokens or DEFAULT_TOKEN_BUDGET

    @property
    def prefill_budget_beside_decodes(self) -> int | None:
        """max_prefill_beside_decodes, or the default for the device (None: no limit but the step's
        budget): a CPU step's time grows with every token it feeds from the first, a GPU's hardly
        until a few thousand."""
        if self.max_prefill_beside_decodes is not None:
            return self.max_prefill_beside_decodes
        return None if torch.device(self.device).type == "cuda" else CPU_PREFILL_BESIDE_DECODES

    @property
    def graphs_on(self) -> bool:
        """graphs, or its device default: on on CUDA."""
        return self.graphs if self.graphs is not None else torch.device(self.device).type == "cuda"

    @property
    def capture_stream_on(self) -> bool:
        """capture_stream, or its device default: on on CUDA."""
        return self.capture_stream if self.capture_stream is not None else torch.device(self.device).type == "cuda"

    @property
    def weight_format(self) -> str:
        return self.weights or "dequantized"

    def kv_pool_bytes(self, free_device_bytes: int | None) -> int:
        """The KV pool's memory: kv_cache_mb if given, else on a GPU (where `free_device_bytes` is what the
        device has free now, the weights loaded) kv_memory_fraction of it, else CPU_KV_CACHE_MB."""
        if self.kv_cache_mb is not None:
            return self.kv_cache_mb * 2**20
        if free_device_bytes is not None:
            return int(free_device_bytes * self.kv_memory_fraction)
        return CPU_KV_CACHE_MB * 2**20

    def kv_blocks_for(self, model: ModelConfig, max_model_len: int, free_device_bytes: int | None = None) -> int:
        """num_kv_blocks if given; else as many as kv_pool_bytes holds, but at least one full-length sequence."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        element = torch.finfo(getattr(torch, self.dtype)).bits // 8
        per_block = 2 * model.num_hidden_layers * self.block_size * model.num_key_value_heads * model.head_dim * element
        return max(self.kv_pool_bytes(free_device_bytes) // per_block, blocks_needed(max_model_len, self.block_size))
