"""Engine: continuous batching over the paged KV cache, the Python entry point (GUIDE section 4).

    engine = Engine(EngineConfig(model="demo"))
    [result] = engine.generate(["The list type"], SamplingParams(max_tokens=32, temperature=0))

Streaming use: `add_request`, then `step()` until `has_unfinished_requests()` is false; each step
returns a `RequestOutput` delta for every request that moved. `abort` takes effect at the next step.

`step()` reads as schedule -> run -> postprocess. Every state change goes through `Sequence.set_state`
(the funnel); every finished sequence's blocks go back to the pool in the same step. A prompt longer
than the step's token budget (`max_num_batched_tokens`, and while anyone decodes
`max_prefill_beside_decodes`) is prefilled in chunks over several steps, beside the running decodes;
it stays RunningPrompt until its last chunk, whose logits are sampled.

A host that runs the engine on a thread of its own (workbench/serving/engine_host.py) reads it through
the last section only: `stats()`, `apply_flags()`, `leak_events_since()`: the host's whole contract,
kept beside the methods it reports on.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from engine.decode.device_loop import KILL_SWITCH, DeviceLoop, KillSwitch
from engine.decode.graphs import BUCKETS, DecodeGraphs, GraphMode
from engine.decode.leak_events import ALIASED_LOGITS, LeakEvent, LeakEventLog
from engine.decode.runner import AliasedLogitsError, ModelRunner
from engine.detokenizer import IncrementalDetokenizer
from engine.engine_config import EngineConfig
from engine.grammar import Constraint, GrammarTokenizer, ResponseFormatError
from engine.host.runtime_flags import RuntimeFlags
from engine.host.stats import EngineStats
from engine.kernels.cupy_support import compile_for
from engine.loading.loader import load_model
from engine.loading.tokenizer import Tokenizer
from engine.model.attention import decode_attention_backend
from engine.outputs import GenerationResult, RequestOutput, Usage, timings_of
from engine.sampler import SampleRequest, TokenLogprob
from engine.sampling_params import InvalidSamplingParams, SamplingParams
from engine.scheduler import SchedulerLimits, make_scheduler
from engine.scheduler.kv_cache import KVShape, PagedKVCache, blocks_needed
from engine.sequence import (Done, Error, FinishedAborted, FinishedIgnored, RunningCompletion, RunningPrompt,
                             Sequence, StopReason)
from engine.step_data import NOTHING_RAN, RowOutput, RunnerOutput, ScheduledBatch

log = logging.getLogger(__name__)


class PromptError(ValueError):
    """A prompt that cannot be run (empty, too long, or token ids outside the vocabulary)."""


class RequestError(ValueError):
    """A request the engine refuses as a whole (for example a request_id already in use)."""


@dataclass
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator
    sent_tokens: int = 0
    abort_with: Done | FinishedAborted | None = None
    constraint: Constraint | None = None  # its response_format's grammar state (engine/grammar.py)


class Engine:
    def __init__(self, config: EngineConfig, kill_switch: KillSwitch = KILL_SWITCH) -> None:
        """`kill_switch`: what stops the device loop on a fault; the process's by default, so a fault in any
        engine of the process stands down every engine's loop (an engine given its own switch stands alone)."""
        self.config = config
        self.loaded = load_model(config.model, device=config.device, dtype=config.dtype,
                                 weights=config.weight_format)
        model_len = self.loaded.config.max_position_embeddings
        self.max_model_len = min(config.max_model_len or model_len, model_len)
        device = self.loaded.device
        # Now, not at the first burst: a machine whose CuPy cannot compile must not start (cupy_support.py).
        if compiled := compile_for(device):
            log.info("CuPy: %d kernels compiled for %s", compiled, device)
        backend, why = decode_attention_backend(device, config.triton_attention)
        self.loaded.model.set_decode_attention(backend)
        if device.type == "cuda":
            log.info("decode attention: %s (%s)", backend, why)
        self.kv_cache = self._kv_pool(config, device)
        self.leak_events = LeakEventLog()  # what the owner tag and the logits identity check caught
        self.device_loop = DeviceLoop(config.burst_length, self.loaded.device, length_limit=self.length_limit,
                                      enabled=config.device_loop, events=self.leak_events, kill_switch=kill_switch)
        limits = SchedulerLimits(max_num_seqs=config.max_num_seqs,
                                 max_num_batched_tokens=config.token_budget,
                                 max_prefill_beside_decodes=config.prefill_budget_beside_decodes,
                                 max_model_len=self.max_model_len)
        self.scheduler = make_scheduler(config.scheduler, self.kv_cache, limits, config.swap_blocks,
                                        lookahead=self.device_loop.lookahead,  # grants each burst's KV room
                                        prefix_caching=config.prefix_caching)
        graphs = DecodeGraphs(self.loaded.model, self.kv_cache, blocks_needed(self.length_limit, config.block_size),
                              self.loaded.dtype, self.loaded.device, config.capture_stream_on,
                              verify_every=config.verify_replays, verify_always=config.verify_always,
                              layer_bisect=config.layer_bisect)
        self.runner = ModelRunner(self.loaded, self.kv_cache, self.device_loop, graphs, config.graphs_on)
        if config.graphs_on and graphs.mode is GraphMode.CUDA_GRAPHS:  # now, not mid-serving: a capture stalls
            graphs.capture_ahead(rows=min(config.max_num_seqs, BUCKETS[-1]), tokens=self.length_limit)
        self.last_step: RunnerOutput = NOTHING_RAN  # the last step's rows, for inspection (engine/host/inspection.py)
        # Called after the device loop with each sequence the funnel stands down (metrics, tests).
        self.stand_down_listeners: list[Callable[[Sequence], None]] = []
        self._requests: dict[str, _Request] = {}
        self._seq_ids = itertools.count()
        self.runtime_flags = RuntimeFlags(self.device_loop, self.runner, self.scheduler)
        self._grammar_tokenizer: GrammarTokenizer | None = None  # built on the first constrained request

    def _kv_pool(self, config: EngineConfig, device: torch.device) -> PagedKVCache:
        """The KV pool as the config sizes it, logged with why that size; sets the length limit it allows."""
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
        num_blocks = config.kv_blocks_for(self.loaded.config, self.max_model_len, free)
        # A prompt bigger than the pool is refused (FinishedIgnored); a sequence that grows to fill the
        # whole pool ends with "length", as at the model's length, instead of preempting itself forever.
        # The last token of a sequence is never fed, so the pool's slots hold sequences one token longer.
        self.length_limit = min(self.max_model_len, num_blocks * config.block_size + 1)
        kv_cache = PagedKVCache(KVShape.of(self.loaded.config), num_blocks, config.block_size, self.loaded.dtype, device)
        if config.kv_cache_mb is not None or config.num_kv_blocks is not None:
            sized_by = "as configured"
        elif free is not None:
            sized_by = f"{config.kv_memory_fraction:.0%} of the {free / 2**30:.1f} GB free on {device}"
        else:
            sized_by = "the CPU default"
        log.info("KV pool: %d blocks of %d tokens, %.0f MB (%s)", num_blocks, config.block_size,
                 2 * kv_cache.keys.nbytes / 2**20, sized_by)
        return kv_cache

    @property
    def tokenizer(self) -> Tokenizer:
        return self.loaded.tokenizer

    # -- requests -------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival: float | None = None, cache_scope: str = "") -> None:
        """Queue a request. Raises (PromptError, RequestError, InvalidSamplingParams) before anything
        changes if it is bad: the API layers check the same, and this is what holds when one did not.
        `arrival` (time.monotonic) is when the request reached whoever hands it to the engine, if
        earlier than now: its queue time and time to first token count from then. `cache_scope`: whom
        the request serves (the serving layer passes its user); it finds only prefixes cached for the
        same scope, unless the config's prefix_cache_scope is "deployment"."""
        if not isinstance(cache_scope, str):
            raise RequestError("cache_scope must be a string")
        if not isinstance(request_id, str) or not request_id:
            raise RequestError("request_id must be a non-empty string")
        if request_id in self._requests:
            raise RequestError(f"request_id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise RequestError("params must be a SamplingParams")
        prompt_ids = self._prompt_ids(prompt)
        params.check_vocabulary(self.loaded.config.vocab_size)
        constraint = self._constraint(params)
        if params.max_tokens is None:  # resolved once, so schedulers and the device loop see a number
            params = dataclasses.replace(params, max_tokens=self.max_model_len - len(prompt_ids))
        scope = cache_scope if self.config.prefix_cache_scope == "user" else ""
        seq = Sequence(next(self._seq_ids), request_id, prompt_ids, params, self._stand_down, scope)
        if arrival is not None:
            seq.timings.arrival = min(arrival, seq.timings.arrival)
        generator = torch.Generator(device=self.loaded.device)
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()  # fresh entropy for this request only; torch.seed() would reseed the process
        self._requests[request_id] = _Request(seq, IncrementalDetokenizer(self.tokenizer, params.stop), generator,
                                              constraint=constraint)
        self.scheduler.add(seq)

    def _constraint(self, params: SamplingParams) -> Constraint | None:
        """The request's grammar compiled for this model's tokenizer, once per request."""
        grammar = params.grammar
        if grammar is None:
            return None
        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = GrammarTokenizer(self.tokenizer, self.loaded.config.vocab_size,
                                                       self.loaded.eos_token_ids)
        try:
            return self._grammar_tokenizer.constraint(grammar)
        except ResponseFormatError as exc:
            raise InvalidSamplingParams("response_format", str(exc)) from None

    def abort(self, request_id: str, by_operator: bool = False) -> bool:
        """Stop a request at the next step: a client's cancel or disconnect ends it Done(Canceled), an
        operator's FinishedAborted. Returns False for a request_id the engine does not hold."""
        request = self._requests.get(request_id)
        if request is None:
            return False
        request.abort_with = FinishedAborted() if by_operator else Done(StopReason.CANCELED)
        return True

    def terminate_all(self) -> None:
        for request_id in self._requests:
            self.abort(request_id)

    def set_flag(self, name: str, value: bool | int) -> None:
        """Change a runtime flag (engine/host/capabilities.py); applied at the next step boundary."""
        self.runtime_flags.request(name, value)

    def flags(self) -> dict[str, bool | int]:
        return self.runtime_flags.in_force()

    def live_sequences(self) -> list[Sequence]:
        """Every sequence not yet finished, in arrival order (for inspection: engine/host/inspection.py)."""
        return [request.seq for request in self._requests.values()]

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
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

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        self.runtime_flags.apply()
        outputs = self._apply_aborts()
        batch = self.scheduler.schedule()
        outputs += [self._finish(self._requests[seq.request_id]) for seq in batch.ignored]
        self.last_step = NOTHING_RAN  # until the runner returns: no sequence sits at a row
        if not batch:
            return outputs
        seqs = batch.sequences
        now = time.monotonic()
        for seq in seqs:
            if seq.timings.first_scheduled is None:
                seq.timings.first_scheduled = now
        requests = [self._requests[seq.request_id] for seq in seqs]
        try:
            self.last_step = self.runner.run(batch, [self._sample_request(r) for r in requests])
        except Exception as exc:  # one bad step must not take the engine down with it
            log.exception("forward failed for %d sequence(s)", len(seqs))
            if isinstance(exc, AliasedLogitsError):  # the step's bookkeeping is wrong: no row's token is trusted
                self.leak_events.record(ALIASED_LOGITS, str(exc))
            elif len(requests) > 1:
                return outputs + self._rows_alone(requests, batch)
            for request in requests:
                request.seq.set_state(Error(f"forward failed: {type(exc).__name__}: {exc}"))
            return outputs + [self._finish(request) for request in requests]
        for index, (request, row) in enumerate(zip(requests, self.last_step.rows)):
            outputs += self._row_done(request, row, batch.feeds(index))
        return outputs

    def _row_done(self, request: _Request, row: RowOutput, fed: int) -> list[RequestOutput]:
        """A row's forward ran: its token postprocessed, or (a prefill chunk short of the prompt's end,
        no token) its chunk counted as cached, with nothing to report yet."""
        request.seq.prompt_logprobs += row.prompt_logprobs
        if row.token is None:
            self._chunk_fed(request.seq, fed)
            return []
        return [self._postprocess(request, row.token, row.logprob)]

    def _sample_request(self, request: _Request) -> SampleRequest:
        seq = request.seq
        return SampleRequest(seq.params, seq.prompt_ids, seq.output_ids, request.generator, request.constraint,
                             self._suppressed(seq))

    def _rows_alone(self, requests: list[_Request], batch: ScheduledBatch) -> list[RequestOutput]:
        """A batched forward raised: run each row alone, so that only a row whose own forward raises
        errors, and the rest of the batch gets its token as if nothing happened (a request with a
        poisoned input must not cost everyone batched with it their answers). Safe to
        repeat: a forward only writes the KV slots of the tokens it feeds, and a retry feeds the same
        tokens at the same positions; nothing was sampled (the failed step committed nothing). The
        device loop stands down for these rows first: the failed step may have taken parked tokens or
        half-run a burst, and a one-row batch reads the parked queue at row 0 (the owner tag would
        drop every other row's queue as foreign); host decode recomputes what was parked. A row fed a
        prefill chunk is retried with the same chunk, so the budget and the prompt's progress hold."""
        for request in requests:
            self.device_loop.stand_down(request.seq)
        outputs: list[RequestOutput] = []
        rows: list[RowOutput] = []
        for index, request in enumerate(requests):
            fed = batch.feeds(index)
            try:
                step = self.runner.run(ScheduledBatch((request.seq,), chunks=(fed,)), [self._sample_request(request)])
            except Exception as exc:
                log.warning("forward failed for %s alone: %s: %s", request.seq.request_id, type(exc).__name__, exc)
                request.seq.set_state(Error(f"forward failed: {type(exc).__name__}: {exc}"))
                outputs.append(self._finish(request))
                continue
            [row] = step.rows
            rows.append(row)
            outputs += self._row_done(request, row, fed)
        self.last_step = RunnerOutput(tuple(rows))
        return outputs

    def _chunk_fed(self, seq: Sequence, tokens: int) -> None:
        """A chunk of the prefill is in the cache: its full blocks are cached (findable) at once, so a
        preemption or a same-prefix request meanwhile reuses them."""
        seq.num_cached += tokens
        self.scheduler.cache_computed(seq)

    def _postprocess(self, request: _Request, token: int, logprob: TokenLogprob | None) -> RequestOutput:
        seq = request.seq
        seq.num_cached = seq.num_tokens
        self.scheduler.cache_computed(seq)  # before a finish releases its blocks: they stay cached
        if isinstance(seq.state, RunningPrompt):
            seq.set_state(RunningCompletion())
        seq.output_ids.append(token)
        if seq.timings.first_token is None:
            seq.timings.first_token = time.monotonic()
        if seq.params.logprobs is not None:
            seq.logprobs.append(logprob)
        reason = self._stop_reason(seq, token, logprob)
        if request.constraint is not None:
            request.constraint.advance(token)
            if request.constraint.error is not None:  # a token the mask allowed is always accepted: a bug
                seq.set_state(Error(f"response_format: {request.constraint.error}"))
                return self._finish(request)
        text, stop_string_hit = request.detokenizer.update(seq.output_ids, final=reason is not None)
        if stop_string_hit:
            reason = StopReason.STOP_STRING
        elif reason is None and seq.params.tool_call_end and seq.params.tool_call_end in request.detokenizer.text:
            reason = StopReason.TOOL_CALLS
            text += request.detokenizer.update(seq.output_ids, final=True)[0]
        elif reason is None and request.constraint is not None and request.constraint.finished:
            reason = StopReason.EOS  # the grammar allows nothing more, even with ignore_eos
            text += request.detokenizer.update(seq.output_ids, final=True)[0]
        if reason is not None:
            seq.set_state(Done(reason))
            return self._finish(request, text)
        return self._delta(request, text)

    def _suppressed(self, seq: Sequence) -> tuple[int, ...]:
        """What the sampler must not draw for `seq` now: its ending tokens, until min_tokens are out."""
        params = seq.params
        if len(seq.output_ids) >= params.min_tokens:
            return ()
        eos = () if params.ignore_eos else tuple(self.loaded.eos_token_ids)
        return tuple(sorted({*eos, *params.stop_token_ids}))

    def _stop_reason(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> StopReason | None:
        params = seq.params
        if token in params.stop_token_ids:
            return StopReason.STOP_TOKEN
        if not params.ignore_eos and token in self.loaded.eos_token_ids:
            return StopReason.EOS
        if params.stop_below_prob is not None:
            assert logprob is not None  # a confidence floor keeps every token on the host, with its logprob
            if logprob.model_logprob < math.log(params.stop_below_prob):
                return StopReason.LOW_CONFIDENCE
        if len(seq.output_ids) >= params.resolved_max_tokens:
            return StopReason.LENGTH
        if seq.num_tokens >= self.length_limit:
            return StopReason.MODEL_LENGTH
        return None

    def _apply_aborts(self) -> list[RequestOutput]:
        outputs = []
        for request in list(self._requests.values()):  # a copy: _finish forgets the request
            if request.abort_with is not None:
                request.seq.set_state(request.abort_with)
                outputs.append(self._finish(request))
        return outputs

    # -- outputs --------------------------------------------------------------------------------

    def _delta(self, request: _Request, text: str, **finish: Any) -> RequestOutput:  # finish: RequestOutput's fields
        seq = request.seq
        start = request.sent_tokens
        request.sent_tokens = len(seq.output_ids)
        prompt: dict[str, Any] = {} if start or seq.params.prompt_logprobs is None else \
            {"prompt_token_ids": seq.prompt_ids, "prompt_logprobs": [None, *seq.prompt_logprobs]}
        return RequestOutput(request_id=seq.request_id, index=start, text=text, token_ids=seq.output_ids[start:],
                             logprobs=seq.logprobs[start:] if seq.params.logprobs is not None else None,
                             **prompt, **finish)

    def _finish(self, request: _Request, text: str | None = None) -> RequestOutput:
        """The last delta of a finished sequence; its blocks go back to the pool now. Without `text`
        (abort, error, ignore) whatever the detokenizer still held back is sent with it."""
        seq = request.seq
        if text is None:
            text = request.detokenizer.update(seq.output_ids, final=True)[0]
        self.scheduler.release(seq)
        del self._requests[seq.request_id]
        state = seq.state
        error = state.message if isinstance(state, (Error, FinishedIgnored)) else None
        finish_reason = state.reason.finish_reason if isinstance(state, Done) else \
            "canceled" if isinstance(state, FinishedAborted) else "error"
        return self._delta(request, text, finished=True, finish_reason=finish_reason, error=error,
                           usage=Usage(len(seq.prompt_ids), len(seq.output_ids), seq.cached_tokens or 0),
                           timings=timings_of(seq.timings, len(seq.output_ids)))

    def _stand_down(self, seq: Sequence) -> None:
        self.device_loop.stand_down(seq)
        for listener in self.stand_down_listeners:
            listener(seq)

    # -- whole generations ----------------------------------------------------------------------

    def generate(self, prompts: list[str] | list[list[int]] | list[str | list[int]],
                 params: SamplingParams | list[SamplingParams]) -> list[GenerationResult]:
        """Run prompts to completion together; one result per prompt, in order. All prompts are checked
        before any is queued. Not for use while streaming requests are in flight (it would consume
        their outputs)."""
        if self._requests:
            raise RequestError("generate() needs an idle engine; use add_request/step for streaming")
        if not isinstance(prompts, list):
            raise RequestError("prompts must be a list (of strings or token-id lists)")
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise RequestError(f"{len(prompts)} prompts but {len(per_prompt)} SamplingParams")
        if not all(isinstance(p, SamplingParams) for p in per_prompt):
            raise RequestError("params must be a SamplingParams or a list of them, one per prompt")
        for prompt in prompts:
            self._prompt_ids(prompt)
        ids = [f"generate-{next(self._seq_ids)}" for _ in prompts]
        for request_id, prompt, p in zip(ids, prompts, per_prompt):
            self.add_request(request_id, prompt, p)
        collected: dict[str, list[RequestOutput]] = {request_id: [] for request_id in ids}
        while self.has_unfinished_requests():
            for output in self.step():
                collected[output.request_id].append(output)
        return [GenerationResult.from_deltas(collected[request_id]) for request_id in ids]

    # -- for a host that runs the engine (workbench/serving): counts, flags, leak events ------------

    def stats(self) -> EngineStats:
        """The counts a host reports (load, heartbeat, metrics), as of now; call on the engine's thread."""
        allocator, records, scheduler = self.kv_cache.pool, self.runner.graphs.verify.records, self.scheduler
        return EngineStats(running=len(scheduler.running), waiting=len(scheduler.waiting),
                           kv_cache_usage=1 - allocator.num_free / allocator.num_blocks,
                           prefix_cache_usage=allocator.num_cached / allocator.num_blocks,
                           prefix_cache_queries=scheduler.prefix_queries, prefix_cache_hits=scheduler.prefix_hits,
                           preemptions=self.scheduler.num_preemptions, device_loop_bursts=self.device_loop.bursts,
                           parked_tokens_dropped=self.device_loop.parked.foreign_dropped,
                           replay_max_delta=records[-1].max_abs_delta if records else 0.0)

    def apply_flags(self) -> None:
        """Put the flag changes asked for (set_flag) in force now. step() does this itself; a host calls
        it while the engine is idle, where no step comes: between steps is the boundary."""
        self.runtime_flags.apply()

    def leak_events_since(self, cursor: int) -> tuple[list[LeakEvent], int]:
        """The leak events after `cursor` (0 at first) still kept, and the cursor for the next call."""
        return self.leak_events.since(cursor)
