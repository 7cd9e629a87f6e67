"""The step's last part: each row's sampled token through the finish checks into its request's delta,
and a finished request's last delta, its blocks back to the pool in the same step.

`Postprocess` shares the engine's table of live requests (request id -> LiveRequest) and forgets a
request when it sends its last delta.
"""

from __future__ import annotations

import math
import time
from typing import Any

from engine.intake import LiveRequest
from engine.outputs import RequestOutput, Usage, timings_of
from engine.reproduce import ModelIdentity, record_of
from engine.sampler import TokenLogprob
from engine.scheduler import SchedulerBase
from engine.sequence import (Done, Error, FinishedAborted, FinishedIgnored, RunningCompletion, RunningPrompt,
                             Sequence, StopReason)
from engine.step_data import RowOutput


class Postprocess:
    def __init__(self, scheduler: SchedulerBase, requests: dict[str, LiveRequest], eos_token_ids: frozenset[int],
                 length_limit: int, identity: ModelIdentity) -> None:
        self.scheduler = scheduler
        self.identity = identity  # what each finished request's record names
        self.requests = requests
        self.eos_token_ids = eos_token_ids
        self.length_limit = length_limit

    def row_done(self, request: LiveRequest, row: RowOutput, fed: int) -> list[RequestOutput]:
        """A row's forward ran: its token postprocessed, or (a prefill chunk short of the prompt's end,
        no token) its chunk counted as cached, with nothing to report yet."""
        request.seq.prompt_logprobs += row.prompt_logprobs
        if row.token is None:
            self.chunk_fed(request.seq, fed)
            return []
        return [self.token(request, row.token, row.logprob)]

    def chunk_fed(self, seq: Sequence, tokens: int) -> None:
        """A chunk of the prefill is in the cache: its full blocks are cached (findable) at once, so a
        preemption or a same-prefix request meanwhile reuses them."""
        seq.num_cached += tokens
        self.scheduler.cache_computed(seq)

    def token(self, request: LiveRequest, token: int, logprob: TokenLogprob | None) -> RequestOutput:
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
        reason = self.stop_reason(seq, token, logprob)
        if request.constraint is not None:
            request.constraint.advance(token)
            if request.constraint.error is not None:  # a token the mask allowed is always accepted: a bug
                seq.set_state(Error(f"response_format: {request.constraint.error}"))
                return self.finish(request)
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
            return self.finish(request, text)
        return self.delta(request, text)

    def stop_reason(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> StopReason | None:
        params = seq.params
        if token in params.stop_token_ids:
            return StopReason.STOP_TOKEN
        if not params.ignore_eos and token in self.eos_token_ids:
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

    def aborted(self) -> list[RequestOutput]:
        """The requests an abort asked to stop, stopped and finished."""
        outputs = []
        for request in list(self.requests.values()):  # a copy: finish forgets the request
            if request.abort_with is not None:
                request.seq.set_state(request.abort_with)
                outputs.append(self.finish(request))
        return outputs

    def delta(self, request: LiveRequest, text: str, **finish: Any) -> RequestOutput:  # finish: RequestOutput's fields
        seq = request.seq
        start = request.sent_tokens
        request.sent_tokens = len(seq.output_ids)
        # Only once the whole prompt has its records: a request ended mid-prefill (an abort, an error) has
        # a part of them, which a reader pairing them with the prompt's ids would cut short unseen.
        whole = len(seq.prompt_logprobs) == len(seq.prompt_ids) - 1
        prompt: dict[str, Any] = {} if start or seq.params.prompt_logprobs is None or not whole else \
            {"prompt_token_ids": seq.prompt_ids, "prompt_logprobs": [None, *seq.prompt_logprobs]}
        return RequestOutput(request_id=seq.request_id, index=start, text=text, token_ids=seq.output_ids[start:],
                             logprobs=seq.logprobs[start:] if seq.params.logprobs is not None else None,
                             **prompt, **finish)

    def finish(self, request: LiveRequest, text: str | None = None) -> RequestOutput:
        """The last delta of a finished sequence; its blocks go back to the pool now. Without `text`
        (abort, error, ignore) whatever the detokenizer still held back is sent with it."""
        seq = request.seq
        if text is None:
            text = request.detokenizer.update(seq.output_ids, final=True)[0]
        self.scheduler.release(seq)
        del self.requests[seq.request_id]
        state = seq.state
        error = state.message if isinstance(state, (Error, FinishedIgnored)) else None
        finish_reason = state.reason.finish_reason if isinstance(state, Done) else \
            "canceled" if isinstance(state, FinishedAborted) else "error"
        ran_out = isinstance(state, Done) and state.reason is not StopReason.CANCELED
        record = record_of(self.identity, seq.prompt_ids, seq.params, seq.output_ids,
                           seq.logprobs if seq.params.logprobs is not None else None, finish_reason) if ran_out else None
        return self.delta(request, text, finished=True, finish_reason=finish_reason, error=error,
                          usage=Usage(len(seq.prompt_ids), len(seq.output_ids), seq.cached_tokens or 0),
                          timings=timings_of(seq.timings, len(seq.output_ids)), record=record)
