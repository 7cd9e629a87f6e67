"""The device decode loop: bursts of K greedy decode steps without a host round trip, parked tokens.

For a decode batch of eligible sequences the loop runs K forward steps back to back: each step's
argmax goes into a ring and is committed as the next step's input on the device, with EOS disabled
(the burst always runs K steps; the host finish checks see every token later). The K tokens of each
row are then parked (engine/decode/parked_queue.py), and the engine drains one per step through the ordinary
finish checks.

The loop's rules live here, behind two calls a step makes: `lookahead` (the scheduler asks which rows
would burst, and for how many steps, before it grants their KV room) and `plan` (the runner asks, per
row: its parked token, the granted burst, or the host forward). Every change of the device-state
generation happens in this class: a stand-down, a foreign or stale drop, a host-served row the device
buffers were primed for, a faulted burst, the loop turned off.

Parked tokens must never outlive their sequence or reach another one. The mechanisms, from the
design notes (shared/reference), each with its own test and mutant (docs/DEVICE_LOOP.md):
- the funnel: `Sequence.set_state` calls `stand_down` for every state outside the running set, which
  drops the sequence's parked tokens, clears its eligibility and bumps the device-state generation;
- the owner tag: `ParkedQueue.take(row, seq_id)` returns Taken | Empty | Foreign; a foreign slot is
  dropped whole. This covers what no funnel sees: a scheduler moving a running sequence aside without
  a state change;
- the prefill guard (`_may_take`): a parked token only ever serves a one-token decode step;
- the generation reset: before a burst of a newer generation the static input buffers, ring head and
  fault word are re-primed from the host state (at engagement, not completion: between bursts is the
  only moment no ring write can be in flight);
- the kill switch: a fault (non-finite logits) inside a burst kills the loop for the process; host
  decode takes over until an operator re-arms it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.kernels.host_copy import device_tensor
from engine.decode.leak_events import LeakEventLog
from engine.decode.parked_queue import Foreign, ParkedQueue, Taken
from engine.sequence import Sequence
from engine.step_data import BurstGrant, ScheduledBatch, StepPlan
from engine.kernels.gpu.commit_token import commit_token
from engine.kernels.gpu.fault_word import fault_word
from engine.kernels.gpu.ring_argmax import ring_argmax

log = logging.getLogger(__name__)


class KillSwitch:
    """One fault stops the device loop of every engine that shares the switch: by default the process's
    KILL_SWITCH, so a fault in one engine stands down the loop of every engine of the process."""

    def __init__(self) -> None:
        self.killed = False
        self.reason: str | None = None

    def kill(self, reason: str) -> None:
        self.killed, self.reason = True, reason
        log.error("ArcGraph: device loop killed: %s; host decode takes over", reason)

    def rearm(self) -> None:
        self.killed, self.reason = False, None


KILL_SWITCH = KillSwitch()


@dataclass
class DeviceDecodeState:
    """What lives on the device between bursts: the static input buffers the next burst starts from,
    the ring the burst writes into, and the fault word. Valid only for `primed_generation` and
    `row_owners`; anything else must be re-primed before a burst reads it."""
    input_ids: torch.Tensor        # [rows] the last committed token of each row
    positions: torch.Tensor        # [rows] the position that token is fed at
    ring: torch.Tensor             # [K, rows] sampled tokens of the current burst
    fault: torch.Tensor            # int32 [1]: non-zero once a burst saw non-finite logits
    ring_head: int = 0
    primed_generation: int = -1
    row_owners: list[int] = field(default_factory=list)


# Signature of the forward a burst step runs: (input ids [B], positions [B], step index) -> logits [B, V].
BurstForward = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


class DeviceLoop:
    def __init__(self, burst_length: int, device: torch.device, *, length_limit: int, enabled: bool = False,
                 events: LeakEventLog | None = None, kill_switch: KillSwitch = KILL_SWITCH) -> None:
        if burst_length < 1:
            raise ValueError(f"burst_length must be >= 1, got {burst_length}")
        self.enabled = enabled
        self.burst_length = burst_length
        self.length_limit = length_limit  # no burst runs a sequence past this many tokens
        self.device = device
        self.kill_switch = kill_switch
        self.parked = ParkedQueue(events)
        self.generation = 0
        self.eligible: set[int] = set()
        self.bursts = 0
        self.resets = 0
        self.state: DeviceDecodeState | None = None

    @property
    def active(self) -> bool:
        return self.enabled and not self.kill_switch.killed

    # -- a step's decisions ---------------------------------------------------------------------

    def lookahead(self, seqs: tuple[Sequence, ...]) -> BurstGrant | None:
        """The burst this batch would run, for the scheduler to grant the KV room of (or not): the rows
        not served a parked token, when every one is an eligible one-token decode with two steps to go.
        Changes nothing; `plan` makes the same per-row decisions at run time."""
        if not self.active:
            return None
        rows = tuple(row for row, seq in enumerate(seqs) if not self._will_take(row, seq))
        rest = [seqs[row] for row in rows]
        if not rest or not all(s.num_uncached == 1 and self.can_burst(s) for s in rest):
            return None
        steps = min([self.burst_length] + [s.params.resolved_max_tokens - len(s.output_ids) for s in rest]
                    + [self.length_limit - s.num_tokens for s in rest])
        return BurstGrant(rows, steps) if steps >= 2 else None

    def plan(self, batch: ScheduledBatch) -> StepPlan:
        """Per row: its own parked token, else the burst the scheduler granted, else the host forward.
        Drops what this step makes stale and bumps the generation wherever the device buffers stop
        continuing the host's state."""
        seqs = batch.sequences
        parked = tuple(self._take(row, seq) for row, seq in enumerate(seqs))
        unserved = tuple(row for row, token in enumerate(parked) if token is None)
        # A grant for other rows than are left (the loop was killed since it was made) never runs.
        granted = batch.burst
        burst = granted if self.active and granted is not None and granted.rows == unserved else None
        rest = [seqs[row] for row in unserved]
        if rest:
            self._drop_stale(rest)
            if burst is None:
                self._host_serves(rest)
        return StepPlan(parked, burst)

    @staticmethod
    def _may_take(seq: Sequence) -> bool:
        """The prefill guard: a parked token only ever stands in for a one-token decode step."""
        return seq.num_uncached == 1

    def _will_take(self, row: int, seq: Sequence) -> bool:
        """Whether `_take` will serve this row its own parked token (the loop being active); asks only."""
        return self._may_take(seq) and self.parked.holds(row, seq.seq_id)

    def _take(self, row: int, seq: Sequence) -> int | None:
        """A one-token decode step's parked token, if its own sequence parked one at this row."""
        if not (self.active and self._may_take(seq)):
            return None
        result = self.parked.take(row, seq.seq_id)
        if isinstance(result, Foreign):
            # The owner's tokens are gone, so the device buffers no longer continue its host state:
            # the next burst must re-prime them, as after a stand-down.
            self.generation += 1
        return result.token if isinstance(result, Taken) else None

    def _drop_stale(self, seqs: list[Sequence]) -> None:
        """These sequences get this step's token without their parked queue (a prefill, a new burst,
        host decode): tokens they parked earlier, at another row, are stale. Dropping undrained tokens
        also means the device buffers ran ahead of the host: re-prime."""
        if self.parked.drop_owners({seq.seq_id for seq in seqs}):
            self.generation += 1

    def _host_serves(self, seqs: list[Sequence]) -> None:
        """These sequences advance on the host this step: device buffers primed for any of them go stale."""
        if self.state and set(self.state.row_owners) & {seq.seq_id for seq in seqs}:
            self.generation += 1

    # -- outside a step: the funnel and the operator --------------------------------------------

    def stand_down(self, seq: Sequence) -> None:
        """The funnel's hook: this sequence left the running set."""
        dropped = self.parked.drop_owners({seq.seq_id})
        if dropped:
            log.info("ArcGraph: stand-down of seq %d dropped %d parked tokens", seq.seq_id, dropped)
        self.eligible.discard(seq.seq_id)
        self.generation += 1

    def set_enabled(self, enabled: bool) -> None:
        """Turning the loop off drops everything parked: host decode moves the sequences on, and a
        token parked before that would be stale the moment the loop came back."""
        if not enabled:
            self.parked.clear()
            self.eligible.clear()
            self.generation += 1
        self.enabled = enabled

    @staticmethod
    def can_burst(seq: Sequence) -> bool:
        """Greedy rows whose every token the host can check afterwards: no sampling state, no logprobs to
        report, no confidence floor and no min_tokens mask, which need the logits of each step. A row with a
        response_format never bursts either: its grammar mask is computed on the host from the tokens committed
        so far (engine/grammar.py), and a burst's argmax on the device has no mask, so it could pick a token the
        grammar forbids. `lookahead` asks this of every row, so one constrained row keeps its whole decode batch
        on the host forward."""
        p = seq.params
        return (p.greedy and not p.has_penalties and p.logprobs is None and p.stop_below_prob is None
                and p.min_tokens == 0 and not p.constrained)

    # -- the burst ------------------------------------------------------------------------------

    def burst(self, grant: BurstGrant, seqs: list[Sequence], forward: BurstForward) -> list[int] | None:
        """Run the granted burst for `seqs` (at the grant's rows); park each row's tokens after the first
        and return the first ones. None when the burst faulted (the loop is then killed)."""
        rows, steps = grant.rows, grant.steps
        state = self._engage(seqs, steps)
        for step in range(steps):
            logits = forward(state.input_ids[: len(seqs)], state.positions[: len(seqs)], step)
            # On the device (engine/kernels/): fault word, argmax into the ring, commit into the next step's inputs.
            fault_word(logits, state.fault)
            ring_argmax(logits, state.ring, step)
            commit_token(state.ring[step, : len(seqs)], state.input_ids[: len(seqs)], state.positions[: len(seqs)])
        state.ring_head = steps
        self.bursts += 1
        if bool(state.fault):  # the burst's one host sync, together with the ring read below
            self.kill_switch.kill(f"non-finite logits in a burst for seqs {[s.seq_id for s in seqs]}")
            self.generation += 1  # host decode serves these rows now: the device buffers are garbage
            return None
        tokens = state.ring[:steps, : len(seqs)].t().tolist()  # [B, steps]
        for row, seq, row_tokens in zip(rows, seqs, tokens):
            self.parked.park(row, seq.seq_id, row_tokens[1:])
            self.eligible.add(seq.seq_id)
        return [row_tokens[0] for row_tokens in tokens]

    def _engage(self, seqs: list[Sequence], steps: int) -> DeviceDecodeState:
        owners = [seq.seq_id for seq in seqs]
        state = self.state
        if state is None or state.ring.shape[0] < steps or state.input_ids.shape[0] < len(seqs):
            size = max(len(seqs), 8)
            state = self.state = DeviceDecodeState(
                input_ids=torch.zeros(size, dtype=torch.long, device=self.device),
                positions=torch.zeros(size, dtype=torch.long, device=self.device),
                ring=torch.zeros(max(steps, self.burst_length), size, dtype=torch.long, device=self.device),
                fault=torch.zeros(1, dtype=torch.int32, device=self.device))
        # Continue from the device buffers only if nothing stood down since they were primed and the
        # same sequences sit in the same rows; otherwise re-prime them from the host's view.
        if state.primed_generation != self.generation or state.row_owners != owners:
            state.input_ids[: len(seqs)] = device_tensor([s.last_token for s in seqs], self.device)
            state.positions[: len(seqs)] = device_tensor([s.num_tokens - 1 for s in seqs], self.device)
            state.ring_head = 0
            state.fault.zero_()
            state.primed_generation = self.generation
            state.row_owners = owners
            self.resets += 1
        return state
