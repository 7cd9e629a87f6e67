"""Engine: the Python entry point to generation (GUIDE section 4).

    engine = Engine(EngineConfig(model="demo"))
    [result] = engine.generate(["The list type"], SamplingParams(max_tokens=32, temperature=0))

This first version decodes one sequence at a time over the paged KV cache; the continuous-batching
scheduler replaces `_decode` without changing this interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.kv_cache import PagedKVCache, blocks_needed
from engine.loader import load_model
from engine.model import AttentionMetadata
from engine.sampling_params import SamplingParams


class PromptError(ValueError):
    """A prompt that cannot be run (empty, too long, or token ids outside the vocabulary)."""


@dataclass(frozen=True)
class EngineConfig:
    model: str = "demo"
    device: str = "cpu"
    dtype: str = "float32"
    block_size: int = 16
    num_kv_blocks: int | None = None  # default: enough for one sequence of the model's full length

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int] = field(repr=False)
    finish_reason: str  # wire values: "stop" | "length"
    usage: Usage


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.loaded = load_model(config.model, device=config.device, dtype=config.dtype)
        self.max_model_len = self.loaded.config.max_position_embeddings
        num_blocks = config.num_kv_blocks or blocks_needed(self.max_model_len, config.block_size)
        self.kv_cache = PagedKVCache(self.loaded.config, num_blocks, config.block_size,
                                     self.loaded.dtype, self.loaded.device)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def generate(self, prompts: list[str | list[int]], params: SamplingParams) -> list[GenerationResult]:
        """One result per prompt. A prompt is text, or a list of token ids used as is."""
        encoded = [self._prompt_ids(prompt) for prompt in prompts]
        return [self._decode(ids, params) for ids in encoded]

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.loaded.config.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise PromptError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
            ids = list(prompt)
        else:
            raise PromptError("a prompt must be a string or a list of integer token ids")
        if not ids:
            raise PromptError("prompt is empty")
        if len(ids) >= self.max_model_len:
            raise PromptError(f"prompt has {len(ids)} tokens; this model's length is {self.max_model_len}, "
                              "leaving no room to generate")
        return ids

    @torch.no_grad()
    def _decode(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        model, device = self.loaded.model, self.loaded.device
        block_size = self.config.block_size
        budget = min(len(prompt_ids) + params.max_tokens, self.max_model_len)
        blocks = self.kv_cache.allocator.allocate(blocks_needed(budget, block_size))
        generator = torch.Generator(device=device)
        generator.manual_seed(params.seed if params.seed is not None else torch.seed())
        generated: list[int] = []
        finish_reason = "length"
        try:
            feed, cached = prompt_ids, 0
            while True:
                metadata = AttentionMetadata.build(
                    block_size=block_size, block_tables=[blocks], cached_lens=[cached],
                    query_lens=[len(feed)], sliding_window=self.loaded.config.sliding_window, device=device)
                ids = torch.tensor(feed, dtype=torch.long, device=device)
                hidden = model(ids, metadata.positions, metadata, self.kv_cache)
                logits = model.logits(hidden[metadata.last_token_index])[0]
                token = _sample(logits, params, generator)
                generated.append(token)
                cached += len(feed)
                if token in self.loaded.eos_token_ids and not params.ignore_eos:
                    finish_reason = "stop"
                    break
                if len(prompt_ids) + len(generated) >= budget:  # max_tokens or the model's length
                    break
                feed = [token]
        finally:
            self.kv_cache.allocator.free(blocks)
        return GenerationResult(text=self.tokenizer.decode(generated), token_ids=generated,
                                finish_reason=finish_reason,
                                usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(generated)))


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    if params.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
