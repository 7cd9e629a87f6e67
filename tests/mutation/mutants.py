"""The named mutants: each removes one leak-prevention mechanism, and names what must catch it: tests
that must fail, or an error the type check (`make typecheck`, mypy) must report.

A mutant is a textual edit of one production file. The original text must occur exactly once, so a
refactor that moves the mechanism fails loudly here instead of leaving a mutant that tests nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

LEAKS = "tests/engine/test_device_loop_leaks.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    original: str
    replacement: str
    tests: tuple[str, ...] = ()  # pytest node ids (or -k style prefixes) that must fail under the mutant
    type_error: str = ""  # instead of tests: a message mypy must report at `path` under the mutant

    def __post_init__(self) -> None:
        if bool(self.tests) == bool(self.type_error):
            raise ValueError(f"mutant '{self.name}' names tests or a type error, exactly one of them")


MUTANTS = (
    Mutant(
        "funnel arm removed",
        "engine/sequence.py",
        "                    self.timings.finished = time.monotonic()\n                self._stand_down(self)\n",
        "                    self.timings.finished = time.monotonic()\n",
        (f"{LEAKS}::test_a_sequence_stopping_mid_burst_leaves_no_parked_tail",),
    ),
    Mutant(
        "owner comparison removed",
        "engine/parked_queue.py",
        "        return slot, slot.owner == seq_id\n",
        "        return slot, True\n",
        (f"{LEAKS}::test_a_waitlisted_sequence_with_no_state_change_cannot_leak_into_the_next",),
    ),
    Mutant(
        "prefill guard removed",
        "engine/device_loop.py",
        "        return seq.num_uncached == 1\n",
        "        return True\n",
        (f"{LEAKS}::test_parked_tokens_never_replace_a_prefill",),
    ),
    Mutant(
        "generation reset removed",
        "engine/device_loop.py",
        "        if state.primed_generation != self.generation or state.row_owners != owners:\n",
        "        if state.row_owners != owners:\n",
        (f"{LEAKS}::test_a_waitlisted_sequence_with_no_state_change_cannot_leak_into_the_next",),
    ),
    Mutant(
        "static-buffer copy-in skipped",
        "engine/graphs.py",
        "        buffers.positions[: positions.shape[0]].copy_(positions)\n",
        "",
        ("tests/engine/test_graphs.py::test_graph_replays_match_eager_exactly_and_leave_the_cache_alone",),
    ),
    Mutant(
        "padding rows write a real block",
        "engine/graphs.py",
        "        table += [[pad] * blocks] * (bucket - rows)\n",
        "        table += [[0] * blocks] * (bucket - rows)\n",
        ("tests/engine/test_graphs.py::test_graph_replays_match_eager_exactly_and_leave_the_cache_alone",),
    ),
    Mutant(
        "stale slot kept when a sequence is served elsewhere",
        "engine/device_loop.py",
        "            self._drop_stale(rest)\n",
        "            pass\n",
        (f"{LEAKS}::test_a_sequence_served_at_another_row_never_drains_its_old_slot",),
    ),
    Mutant(
        "faulted burst not scrubbed",
        "engine/runner.py",
        "            self._scrub(seqs, grant.steps)\n",
        "            pass\n",
        (f"{LEAKS}::test_a_faulted_burst_leaves_no_nan_in_the_kv_cache",),
    ),
    Mutant(
        "aliased-logits check removed",
        "engine/runner.py",
        "        check_identity(logits, seqs)\n",
        "",
        (f"{LEAKS}::test_an_aliased_step_fails_instead_of_sampling_another_sequences_logits",),
    ),
    Mutant(
        "a SequenceState variant added without a funnel arm",
        "engine/sequence.py",
        "SequenceState = Union[Waiting, RunningPrompt, RunningCompletion, Swapped, Done, Error, FinishedAborted,\n"
        "                      FinishedIgnored]\n",
        "@dataclass(frozen=True)\n"
        "class Paused:\n"
        "    \"\"\"A new state that no arm of set_state decides for.\"\"\"\n"
        "\n\n"
        "SequenceState = Union[Waiting, RunningPrompt, RunningCompletion, Swapped, Done, Error, FinishedAborted,\n"
        "                      FinishedIgnored, Paused]\n",
        type_error='Argument 1 to "assert_never" has incompatible type "Paused"',
    ),
)

TEST_MUTANTS = tuple(m for m in MUTANTS if m.tests)
TYPE_MUTANTS = tuple(m for m in MUTANTS if m.type_error)
