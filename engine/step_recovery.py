"""What a step does when its forward raises: one bad step must not take the engine down with it, and a
request with a poisoned input must not cost everyone batched with it their answers.

A batch of several rows is run again row by row, so that only a row whose own forward raises errors.
An aliased-logits failure is not retried: the step's bookkeeping is wrong, so no row's token is
trusted, and the leak-event log records it.
"""

from __future__ import annotations

import logging

from engine.decode.device_loop import DeviceLoop
from engine.decode.leak_events import ALIASED_LOGITS, LeakEventLog
from engine.decode.runner import AliasedLogitsError, ModelRunner
from engine.intake import LiveRequest
from engine.outputs import RequestOutput
from engine.postprocess import Postprocess
from engine.sequence import Error
from engine.step_data import NOTHING_RAN, RowOutput, RunnerOutput, ScheduledBatch

log = logging.getLogger(__name__)


class StepRecovery:
    def __init__(self, runner: ModelRunner, device_loop: DeviceLoop, leak_events: LeakEventLog,
                 postprocess: Postprocess) -> None:
        self.runner = runner
        self.device_loop = device_loop
        self.leak_events = leak_events
        self.postprocess = postprocess

    def after_failure(self, exc: Exception, requests: list[LiveRequest],
                      batch: ScheduledBatch) -> tuple[list[RequestOutput], RunnerOutput]:
        """The outputs of a step whose batched forward raised `exc`, and the rows that ran after all."""
        log.error("forward failed for %d sequence(s)", len(requests), exc_info=exc)
        if isinstance(exc, AliasedLogitsError):
            self.leak_events.record(ALIASED_LOGITS, str(exc))
        elif len(requests) > 1:
            return self._rows_alone(requests, batch)
        for request in requests:
            request.seq.set_state(Error(f"forward failed: {type(exc).__name__}: {exc}"))
        return [self.postprocess.finish(request) for request in requests], NOTHING_RAN

    def _rows_alone(self, requests: list[LiveRequest], batch: ScheduledBatch) -> tuple[list[RequestOutput], RunnerOutput]:
        """Run each row alone, and the rest of the batch gets its token as if nothing happened. Safe to
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
        eos = self.postprocess.eos_token_ids
        for index, request in enumerate(requests):
            fed = batch.feeds(index)
            try:
                step = self.runner.run(ScheduledBatch((request.seq,), chunks=(fed,)), [request.sample_request(eos)])
            except Exception as exc:
                log.warning("forward failed for %s alone: %s: %s", request.seq.request_id, type(exc).__name__, exc)
                request.seq.set_state(Error(f"forward failed: {type(exc).__name__}: {exc}"))
                outputs.append(self.postprocess.finish(request))
                continue
            [row] = step.rows
            rows.append(row)
            outputs += self.postprocess.row_done(request, row, fed)
        return outputs, RunnerOutput(tuple(rows))
