"""The named mutants: each removes one leak-prevention mechanism, and names what must catch it: tests
that must fail, or an error the type check (`make typecheck`, mypy) must report.

A mutant edits one production file: in the function or method `scope` ("" for the module), the code
`original` (an expression, or statements in a row) becomes `replacement`. The original is found by its
syntax tree (tests/mutation/anchors.py), so reformatting the file moves nothing, and it must occur
exactly once in its scope, so a refactor that moves the mechanism fails loudly here instead of leaving
a mutant that tests nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

LEAKS = "tests/engine/test_device_loop_leaks.py"
PREFIX = "tests/engine/test_prefix_cache.py"
CHUNKED = "tests/engine/test_chunked_prefill.py"
AUDIT = "tests/engine/test_replay_audit.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    scope: str
    original: str
    replacement: str
    tests: tuple[str, ...] = ()  # pytest node ids (or -k style prefixes) that must fail under the mutant
    type_error: str = ""  # instead of tests: a message mypy must report at `path` under the mutant

    def __post_init__(self) -> None:
        if bool(self.tests) == bool(self.type_error):
            raise ValueError(f"mutant '{self.name}' names tests or a type error, exactly one of them")


MUTANTS = (
    Mutant(
        # Not a leak of another sequence's tokens, but the same kind of guard: a burst's unmasked argmax
        # would hand a constrained row tokens its grammar forbids.
        "constrained row allowed to burst",
        "engine/decode/device_loop.py", "DeviceLoop.can_burst",
        "not p.constrained",
        "True",
        ("tests/engine/test_structured_output.py::test_constrained_and_free_rows_in_one_batch_get_their_solo_tokens",),
    ),
    Mutant(
        "funnel arm removed",
        "engine/sequence.py", "Sequence.set_state",
        """
        if self.timings.finished is None:
            self.timings.finished = time.monotonic()
        self._stand_down(self)
        """,
        """
        if self.timings.finished is None:
            self.timings.finished = time.monotonic()
        """,
        (f"{LEAKS}::test_a_sequence_stopping_mid_burst_leaves_no_parked_tail",),
    ),
    Mutant(
        "owner comparison removed",
        "engine/decode/parked_queue.py", "ParkedQueue._lookup",
        "slot.owner == seq_id",
        "True",
        (f"{LEAKS}::test_a_waitlisted_sequence_with_no_state_change_cannot_leak_into_the_next",),
    ),
    Mutant(
        "prefill guard removed",
        "engine/decode/device_loop.py", "DeviceLoop._may_take",
        "return seq.num_uncached == 1",
        "return True",
        (f"{LEAKS}::test_parked_tokens_never_replace_a_prefill",),
    ),
    Mutant(
        "generation reset removed",
        "engine/decode/device_loop.py", "DeviceLoop._engage",
        "state.primed_generation != self.generation or state.row_owners != owners",
        "state.row_owners != owners",
        (f"{LEAKS}::test_a_waitlisted_sequence_with_no_state_change_cannot_leak_into_the_next",),
    ),
    Mutant(
        "static-buffer copy-in skipped",
        "engine/decode/graphs.py", "DecodeGraphs._copy_in",
        "buffers.positions[: positions.shape[0]].copy_(positions)",
        "",
        ("tests/engine/test_graphs.py::test_graph_replays_match_eager_exactly_and_leave_the_cache_alone",),
    ),
    Mutant(
        "padding rows write a real block",
        "engine/decode/block_table.py", "DeviceBlockTable.table",
        "tables[row] if row < len(tables) else []",
        "tables[row] if row < len(tables) else [0]",
        ("tests/engine/test_graphs.py::test_graph_replays_match_eager_exactly_and_leave_the_cache_alone",),
    ),
    Mutant(
        "a row's blocks remembered by reference to the scheduler's list",
        "engine/decode/block_table.py", "DeviceBlockTable._write_row",
        "self._remembered[row] = list(blocks)",
        "self._remembered[row] = blocks",
        ("tests/engine/test_block_table.py::test_a_list_cut_short_in_place_loses_its_blocks",),
    ),
    Mutant(
        "stale slot kept when a sequence is served elsewhere",
        "engine/decode/device_loop.py", "DeviceLoop.plan",
        "self._drop_stale(rest)",
        "",
        (f"{LEAKS}::test_a_sequence_served_at_another_row_never_drains_its_old_slot",),
    ),
    Mutant(
        "faulted burst not scrubbed",
        "engine/decode/runner.py", "ModelRunner._burst",
        "self._scrub(seqs, grant.steps)",
        "",
        (f"{LEAKS}::test_a_faulted_burst_leaves_no_nan_in_the_kv_cache",),
    ),
    Mutant(
        "aliased-logits check removed",
        "engine/decode/runner.py", "ModelRunner._serve",
        "check_identity(logits, sampled_seqs)",
        "",
        (f"{LEAKS}::test_an_aliased_step_fails_instead_of_sampling_another_sequences_logits",),
    ),
    Mutant(
        "prefix-cache scope dropped from the block hash",
        "engine/scheduler/block_pool.py", "block_hash",
        'digest.update(len(encoded_scope).to_bytes(4, "little") + encoded_scope)',
        "",
        (f"{PREFIX}::test_another_scope_never_hits_while_the_same_scope_does",),
    ),
    Mutant(
        "a cached block freed while another sequence still holds it",
        "engine/scheduler/block_pool.py", "BlockPool.free",
        "refs > 1",
        "refs > 1 and False",
        (f"{PREFIX}::test_a_block_another_sequence_holds_is_not_freed_when_one_holder_finishes",),
    ),
    Mutant(
        "a burst granted room in a shared block",
        "engine/scheduler/base.py", "SchedulerBase._grant",
        """
        if any(self._writes_shared(seq, seq.num_tokens - 1, tokens) for seq, tokens in rows):
            return False
        """,
        "",
        (f"{PREFIX}::test_a_burst_is_never_granted_room_in_a_block_another_sequence_holds",),
    ),
    Mutant(
        # A chunk's last logits are a plausible token: emitted, the rest of the prompt is never prefilled.
        "a prefill chunk sampled before its prompt's end",
        "engine/step_data.py", "ScheduledBatch.completes",
        "return self.feeds(row) == self.sequences[row].num_uncached",
        "return True",
        (f"{CHUNKED}::test_decodes_progress_every_step_of_a_long_prefill",),
    ),
    Mutant(
        # A chunk placed at position 0: it overwrites the prompt's start (a cached prefix's shared blocks
        # included) and its own positions are never written.
        "a prefill chunk's cached-length offset skipped",
        "engine/decode/runner.py", "ModelRunner.forward",
        "[s.num_cached for s in seqs]",
        "[0 if n < s.num_uncached else s.num_cached for s, n in zip(seqs, feeds)]",
        (f"{CHUNKED}::test_chunked_answer_equals_unchunked_after_a_cached_prefix",),
    ),
    Mutant(
        # Not a leak guard but the property they stand on: a row's bits must not follow its company. Here
        # a float projection takes another arithmetic once a call has more than 3 rows, as borrowed
        # kernels (oneDNN, MKL) choose their blocking by the row count.
        "a float projection's path chosen by the row count",
        "engine/model/layers.py", "float_linear",
        "return cpu_kernels.dense_linear(x, weight, bias)",
        """
        if x.reshape(-1, x.shape[-1]).shape[0] > 3:
            return F.linear(x.double(), weight.double(), None if bias is None else bias.double()).to(x.dtype)
        return cpu_kernels.dense_linear(x, weight, bias)
        """,
        ("tests/engine/test_attention_invariance.py::"
         "test_tokens_and_logprobs_alone_batched_or_beside_a_chunked_prompt[host-decode-bfloat16]",),
    ),
    Mutant(
        # The replay audit re-runs every drawn request but finds every re-run equal: the batched-row mutant
        # of its test (one row's logits perturbed only in a batch of more than 3) must still be caught.
        "replay audit compares nothing",
        "engine/host/replay_audit.py", "ReplayAudit._judge",
        "compare(job.record, rerun)", "Comparison(True)",
        (f"{AUDIT}::test_a_row_perturbed_only_when_batched_is_a_leak_event",),
    ),
    Mutant(
        "replay audit re-runs under a user's prefix-cache scope",
        "engine/host/replay_audit.py", "ReplayAudit.tick",
        "engine.add_request(rerun_id, job.record.prompt_ids, job.record.sampling_params(), cache_scope=AUDIT_SCOPE)",
        "engine.add_request(rerun_id, job.record.prompt_ids, job.record.sampling_params())",
        (f"{AUDIT}::test_an_audit_yields_to_live_work_and_runs_under_its_own_scope",),
    ),
    Mutant(
        "a request without a seed drawn from entropy nobody recorded",
        "engine/intake.py", "Intake.admit",
        "generator.manual_seed(seed)", "generator.seed()",
        (f"{AUDIT}::test_an_unseeded_request_records_a_drawn_seed_that_reproduces_it",),
    ),
    Mutant(
        "a SequenceState variant added without a funnel arm",
        "engine/sequence.py", "",
        "SequenceState = Union[Waiting, RunningPrompt, RunningCompletion, Swapped, Done, Error, FinishedAborted, "
        "FinishedIgnored]",
        '''
        @dataclass(frozen=True)
        class Paused:
            """A new state that no arm of set_state decides for."""


        SequenceState = Union[Waiting, RunningPrompt, RunningCompletion, Swapped, Done, Error, FinishedAborted,
                              FinishedIgnored, Paused]
        ''',
        type_error='Argument 1 to "assert_never" has incompatible type "Paused"',
    ),
)

TEST_MUTANTS = tuple(m for m in MUTANTS if m.tests)
TYPE_MUTANTS = tuple(m for m in MUTANTS if m.type_error)
