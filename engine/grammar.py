"""Structured output's token mask: the grammar of a request's response_format (engine/response_format.py)
over the model's vocabulary, per row.

- `GrammarTokenizer`: llguidance's view of our tokenizer (engine/loading/tokenizer.py, also a GGUF's rebuilt
  one): the same `tokenizers` backend, serialized, over the model's logits width, with the model's EOS
  ids as the tokens that end a grammar. Building it costs ~0.5 s, so an engine builds it once, on the
  first constrained request.
- `Constraint`: one request's matcher. `apply(logits_row)` sets every token the grammar forbids to
  -inf (EOS only where the grammar accepts); `advance(token)` commits the sampled token. llguidance
  computes a mask over the whole vocabulary in tens of microseconds per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.kernels.host_copy import device_tensor
from engine.loading.tokenizer import Tokenizer
from engine.response_format import ResponseFormatError, llguidance_module

if TYPE_CHECKING:
    import llguidance


class GrammarTokenizer:
    """llguidance's tokenizer over ours: the same vocabulary, the model's logits width and EOS ids."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.vocab_size = vocab_size
        self.ll = llguidance_module().LLTokenizer(tokenizer.backend_json(), n_vocab=vocab_size,
                                         eos_token=sorted(eos_token_ids))

    def constraint(self, grammar: str) -> "Constraint":
        return Constraint(llguidance_module().LLMatcher(self.ll, grammar, log_level=0), self.vocab_size)


class Constraint:
    """One request's grammar state: which tokens may come next, advanced by each committed token."""

    def __init__(self, matcher: "llguidance.LLMatcher", vocab_size: int) -> None:
        if matcher.is_error():
            raise ResponseFormatError(f"does not compile for this tokenizer: {matcher.get_error()}")
        self.matcher = matcher
        self.vocab_size = vocab_size
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)  # bit i of word w: token 32w+i

    def allowed(self) -> np.ndarray:
        """bool [V]: the tokens the grammar allows next."""
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        # Little-endian words (x86, arm64): byte b of the buffer holds tokens 8b..8b+7, lowest bit first.
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[: self.vocab_size]
        return bits.view(np.bool_)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] with every token the grammar forbids at -inf (a new tensor). On the CPU in numpy:
        a handful of torch ops over the row cost 40 times more on a busy machine (bench/structured.py)."""
        forbidden = ~self.allowed()
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            row = logits.numpy().copy()
            row[forbidden] = -np.inf
            return torch.from_numpy(row)
        return logits.masked_fill(device_tensor(torch.from_numpy(forbidden), logits.device, torch.bool), float("-inf"))

    def advance(self, token: int) -> None:
        """Commit the sampled token. A token the mask allowed is always accepted; `error` says otherwise."""
        self.matcher.consume_token(token)

    @property
    def finished(self) -> bool:
        """The grammar is complete and allows nothing more (its EOS included, once consumed)."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None
