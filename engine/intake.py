"""Request intake: what `Engine.add_request` and `Engine.generate` check before anything changes, and
the request they then hold (a Sequence with its detokenizer, generator and grammar state).

Every refusal is raised here, before the scheduler sees the request: the API layers check the same,
and this is what holds when one did not.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Container
from dataclasses import dataclass, field

import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.engine_config import EngineConfig
from engine.grammar import Constraint, GrammarTokenizer
from engine.response_format import ResponseFormatError
from engine.host.replay_audit import AUDIT_SCOPE
from engine.loading.loader import LoadedModel
from engine.reproduce import drawn_seed
from engine.sampler import PenaltyHistory, SampleRequest
from engine.sampling_params import InvalidSamplingParams, SamplingParams
from engine.sequence import Done, FinishedAborted, Sequence


class PromptError(ValueError):
    """A prompt that cannot be run (empty, too long, or token ids outside the vocabulary)."""


class RequestError(ValueError):
    """A request the engine refuses as a whole (for example a request_id already in use)."""


@dataclass
class LiveRequest:
    """A request the engine holds, from intake until its last delta."""
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator
    sent_tokens: int = 0
    abort_with: Done | FinishedAborted | None = None  # what an abort asked for, put in force at the next step
    constraint: Constraint | None = None  # its response_format's grammar state (engine/grammar.py)
    penalty_history: PenaltyHistory = field(default_factory=PenaltyHistory)  # what its penalties have read

    def sample_request(self, eos_token_ids: frozenset[int]) -> SampleRequest:
        seq = self.seq
        return SampleRequest(seq.params, seq.prompt_ids, seq.output_ids, self.generator, self.constraint,
                             self._suppressed(eos_token_ids), self.penalty_history)

    def _suppressed(self, eos_token_ids: frozenset[int]) -> tuple[int, ...]:
        """What the sampler must not draw now: the request's ending tokens, until min_tokens are out."""
        params = self.seq.params
        if len(self.seq.output_ids) >= params.min_tokens:
            return ()
        eos = () if params.ignore_eos else tuple(eos_token_ids)
        return tuple(sorted({*eos, *params.stop_token_ids}))


class Intake:
    def __init__(self, config: EngineConfig, loaded: LoadedModel, max_model_len: int) -> None:
        self.config = config
        self.loaded = loaded
        self.max_model_len = max_model_len
        self.seq_ids = itertools.count()  # sequence ids, and generate()'s request ids
        self._grammar_tokenizer: GrammarTokenizer | None = None  # built on the first constrained request

    def admit(self, request_id: str, prompt: str | list[int], params: SamplingParams, held: Container[str],
              arrival: float | None, cache_scope: str, stand_down: Callable[[Sequence], None]) -> LiveRequest:
        """The request checked and built, or an error raised; `held`: the request ids in use."""
        if not isinstance(cache_scope, str):
            raise RequestError("cache_scope must be a string")
        if not isinstance(request_id, str) or not request_id:
            raise RequestError("request_id must be a non-empty string")
        if request_id in held:
            raise RequestError(f"request_id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise RequestError("params must be a SamplingParams")
        prompt_ids = self.prompt_ids(prompt)
        params.check_vocabulary(self.loaded.config.vocab_size)
        constraint = self._constraint(params)
        if params.max_tokens is None:  # resolved once, so schedulers and the device loop see a number
            params = dataclasses.replace(params, max_tokens=self.max_model_len - len(prompt_ids))
        seed = drawn_seed() if params.seed is None else params.seed  # kept in the params: the record re-derives the draws
        params = dataclasses.replace(params, seed=seed)
        # The replay audit's re-runs keep a scope of their own even where users share one.
        scope = cache_scope if self.config.prefix_cache_scope == "user" or cache_scope == AUDIT_SCOPE else ""
        seq = Sequence(next(self.seq_ids), request_id, prompt_ids, params, stand_down, scope)
        if arrival is not None:
            seq.timings.arrival = min(arrival, seq.timings.arrival)
        generator = torch.Generator(device=self.loaded.device)
        generator.manual_seed(seed)
        detokenizer = IncrementalDetokenizer(self.loaded.tokenizer, params.stop)
        return LiveRequest(seq, detokenizer, generator, constraint=constraint)

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.loaded.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise PromptError("a prompt must be a string or a list of integer token ids")
        # Also for text: a tokenizer may know added tokens that the model's embedding does not have.
        vocab = self.loaded.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise PromptError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        if not ids:
            raise PromptError("prompt is empty")
        if len(ids) >= self.max_model_len:
            raise PromptError(f"prompt has {len(ids)} tokens; this model's length is {self.max_model_len}, "
                              "leaving no room to generate")
        return ids

    def generate_params(self, prompts: object, params: SamplingParams | list[SamplingParams]) -> list[SamplingParams]:
        """generate()'s arguments checked whole, every prompt included; its SamplingParams per prompt."""
        if not isinstance(prompts, list):
            raise RequestError("prompts must be a list (of strings or token-id lists)")
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise RequestError(f"{len(prompts)} prompts but {len(per_prompt)} SamplingParams")
        if not all(isinstance(p, SamplingParams) for p in per_prompt):
            raise RequestError("params must be a SamplingParams or a list of them, one per prompt")
        for prompt in prompts:
            self.prompt_ids(prompt)
        return per_prompt

    def _constraint(self, params: SamplingParams) -> Constraint | None:
        """The request's grammar compiled for this model's tokenizer, once per request."""
        grammar = params.grammar
        if grammar is None:
            return None
        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = GrammarTokenizer(self.loaded.tokenizer, self.loaded.config.vocab_size,
                                                       self.loaded.eos_token_ids)
        try:
            return self._grammar_tokenizer.constraint(grammar)
        except ResponseFormatError as exc:
            raise InvalidSamplingParams("response_format", str(exc)) from None
