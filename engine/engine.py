"""Engine: continuous batching over the paged KV cache, the Python entry point.

    engine = Engine(EngineConfig(model="demo"))
    [result] = engine.generate(["The list type"], SamplingParams(max_tokens=32, temperature=0))

Streaming use: `add_request`, then `step()` until `has_unfinished_requests()` is false; each step
returns a `RequestOutput` delta for every request that moved. `abort` takes effect at the next step.

`step()` reads as schedule -> run -> postprocess. Every state change goes through `Sequence.set_state`
(the funnel); every finished sequence's blocks go back to the pool in the same step. A prompt longer
than the step's token budget (`max_num_batched_tokens`, and while anyone decodes
`max_prefill_beside_decodes`) is prefilled in chunks over several steps, beside the running decodes;
it stays RunningPrompt until its last chunk, whose logits are sampled.

What the step delegates sits beside it, one module each: request intake and its checks (intake.py),
the finish checks and a finished request's last delta (postprocess.py), the row-by-row re-run after a
failed forward (step_recovery.py), and the KV pool's sizing at start (kv_pool.py).

A host that runs the engine on a thread of its own (workbench/serving/engine_host.py) reads it through
the last section only: `stats()`, `snapshot()`, `apply_flags()`, `leak_events_since()`: the host's
whole contract, kept beside the methods it reports on.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from engine.decode.device_loop import KILL_SWITCH, DeviceLoop, KillSwitch
from engine.decode.graphs import BUCKETS, DecodeGraphs, GraphMode
from engine.decode.leak_events import LeakEvent, LeakEventLog
from engine.decode.runner import ModelRunner
from engine.engine_config import EngineConfig
from engine.host.runtime_flags import RuntimeFlags
from engine.host.snapshot import EngineSnapshot, take_snapshot
from engine.host.stats import EngineStats, stats_of
from engine.intake import Intake, LiveRequest, RequestError
from engine.kernels.cpu import native_available
from engine.kernels.gpu.cupy_support import compile_for
from engine.kv_pool import sized_kv_pool
from engine.loading.loader import load_model
from engine.loading.tokenizer import Tokenizer
from engine.outputs import GenerationResult, RequestOutput
from engine.postprocess import Postprocess
from engine.reproduce import identity_of
from engine.sampling_params import SamplingParams
from engine.scheduler import SchedulerLimits, make_scheduler
from engine.scheduler.kv_cache import blocks_needed
from engine.sequence import Done, FinishedAborted, Sequence, StopReason
from engine.step_data import NOTHING_RAN, RunnerOutput
from engine.step_recovery import StepRecovery

log = logging.getLogger(__name__)


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
        kernels = self.loaded.model.choose_kernels(device, config.triton_attention, config.invariant_gemm)
        if device.type == "cuda":
            log.info("%s", kernels)
        self.kv_cache, self.length_limit = sized_kv_pool(config, self.loaded, self.max_model_len)
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
        self.last_step: RunnerOutput = NOTHING_RAN  # the last step's rows, for inspection (snapshot())
        # Called after the device loop with each sequence the funnel stands down (metrics, tests).
        self.stand_down_listeners: list[Callable[[Sequence], None]] = []
        self._requests: dict[str, LiveRequest] = {}  # by request id; Postprocess.finish forgets a finished one
        self.runtime_flags = RuntimeFlags(self.device_loop, self.runner, self.scheduler)
        self.runtime_flags.audit.permille = config.replay_audit_permille
        # The model's name, not a path on this server (records travel to users).
        # The CPU's kernels are asked only there, after the load has built or refused them (never for a GPU).
        device_type = self.loaded.device.type
        own_kernels = native_available() if device_type == "cpu" else self.loaded.model.invariant_gemm
        self.identity = identity_of(Path(str(config.model)).name, self.loaded.path, device_type, config.weight_format,
                                    config.dtype, own_kernels)  # stamped on each record
        self._intake = Intake(config, self.loaded, self.max_model_len)
        self._postprocess = Postprocess(self.scheduler, self._requests, self.loaded.eos_token_ids, self.length_limit,
                                        self.identity)
        self._recovery = StepRecovery(self.runner, self.device_loop, self.leak_events, self._postprocess)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.loaded.tokenizer

    # -- requests -------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival: float | None = None, cache_scope: str = "") -> None:
        """Queue a request. Raises (PromptError, RequestError, InvalidSamplingParams) before anything
        changes if it is bad (engine/intake.py). `arrival` (time.monotonic) is when the request reached
        whoever hands it to the engine, if earlier than now: its queue time and time to first token
        count from then. `cache_scope`: whom the request serves (the serving layer passes its user); it
        finds only prefixes cached for the same scope, unless the config's prefix_cache_scope is
        "deployment"."""
        request = self._intake.admit(request_id, prompt, params, self._requests, arrival, cache_scope,
                                     self._stand_down)
        self._requests[request_id] = request
        self.scheduler.add(request.seq)

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
        """Every sequence not yet finished, in arrival order."""
        return [request.seq for request in self._requests.values()]

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        self.runtime_flags.apply()
        outputs = self._postprocess.aborted()
        batch = self.scheduler.schedule()
        outputs += [self._postprocess.finish(self._requests[seq.request_id]) for seq in batch.ignored]
        self.last_step = NOTHING_RAN  # until the runner returns: no sequence sits at a row
        if not batch:
            return outputs
        seqs = batch.sequences
        now = time.monotonic()
        for seq in seqs:
            if seq.timings.first_scheduled is None:
                seq.timings.first_scheduled = now
        requests = [self._requests[seq.request_id] for seq in seqs]
        eos = self.loaded.eos_token_ids
        try:
            self.last_step = self.runner.run(batch, [request.sample_request(eos) for request in requests])
        except Exception as exc:  # one bad step must not take the engine down with it (step_recovery.py)
            recovered, self.last_step = self._recovery.after_failure(exc, requests, batch)
            return outputs + recovered
        for index, (request, row) in enumerate(zip(requests, self.last_step.rows)):
            outputs += self._postprocess.row_done(request, row, batch.feeds(index))
        return outputs

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
        per_prompt = self._intake.generate_params(prompts, params)
        ids = [f"generate-{next(self._intake.seq_ids)}" for _ in prompts]
        for request_id, prompt, p in zip(ids, prompts, per_prompt):
            self.add_request(request_id, prompt, p)
        collected: dict[str, list[RequestOutput]] = {request_id: [] for request_id in ids}
        while self.has_unfinished_requests():
            for output in self.step():
                collected[output.request_id].append(output)
        return [GenerationResult.from_deltas(collected[request_id]) for request_id in ids]

    # -- for a host that runs the engine (workbench/serving): counts, inspection, flags, leak events --

    def stats(self) -> EngineStats:
        """The counts a host reports (load, heartbeat, metrics), as of now; call on the engine's thread."""
        return stats_of(self.kv_cache, self.scheduler, self.device_loop, self.runner.graphs)

    def snapshot(self, with_sequences: bool = True) -> EngineSnapshot:
        """The inner state an operator inspects (engine/host/snapshot.py), as of now; call on the engine's
        thread. Without `with_sequences` the per-sequence list, which grows with the load, is left out."""
        return take_snapshot(self.device_loop, self.runner, self.leak_events, self.live_sequences(), self.last_step,
                             self.stats(), self.scheduler.prefix_caching, self.config.prefix_cache_scope, self.identity,
                             with_sequences)

    def apply_flags(self) -> None:
        """Put the flag changes asked for (set_flag) in force now. step() does this itself; a host calls
        it while the engine is idle, where no step comes: between steps is the boundary."""
        self.runtime_flags.apply()

    def leak_events_since(self, cursor: int) -> tuple[list[LeakEvent], int]:
        """The leak events after `cursor` (0 at first) still kept, and the cursor for the next call."""
        return self.leak_events.since(cursor)
