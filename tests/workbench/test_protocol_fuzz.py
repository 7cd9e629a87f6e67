"""Property-based fuzzing (Hypothesis) of the three websockets' protocols through the session's shared
in-process Daphne (docs/PROTOCOL.md; docs/TESTING.md, "Shared servers"): real sockets over loopback, so
Daphne's own encoding of every reply is in the path (where the crashes test_hostile_input.py found were).

- /ws/v1/generate, single frames: arbitrary JSON, each field with a wrong type or a huge integer, lone
  surrogates escaped in JSON, NUL, right-to-left and combining marks, emoji sequences, non-JSON text,
  binary; and sequences of frames: reused ids, cancels before start and after the end, a cancel of
  another user's id, resume (not a frame of this socket).
- /ws/chat/<id>: every frame type with fuzzed fields and arbitrary JSON (valid turns ask for 2 tokens).
- /ws/ops/dashboard (as the admin): set_flag with every flag and values of the wrong kind (so nothing is
  ever flipped on the shared server), cancel_request with fuzzed workers and ids, arbitrary JSON.

The properties: no frame crashes anything (no `internal_error`, never a close: a socket that closes
fails the check waiting on it); every frame gets exactly its answer, which names the field at fault; every
accepted request ends with `done` and deltas whose offsets add up (a greedy one of the sequences equal
to its solo run, a canceled one a prefix of it); and a canary, a greedy request run again and again on
another user's socket for the whole module (as request "victim", the id the fuzzer tries to cancel),
gets its solo run's answer every time.

Deterministic: `derandomize=True` and no example database, so CI runs the same cases every time. The
number of cases run is printed. `WORKBENCH_FUZZ_SCALE=N` runs N times as many (a long run, by hand).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from engine import SamplingParams
from engine.host.capabilities import REGISTRY
from tests.cluster import issue_tokens
from tests.conftest import ADMIN_PASSWORD
from tests.workbench.daphne_session import Session
from tests.workbench.fuzz_socket import (ANSWERS_TO_OTHER_FRAMES, CHAT_MARKER, DASHBOARD_MARKER, MARKER, Loop, Socket,
                                         answers, check_stream, request_frames)
from tests.reference import greedy_solo as solo

pytestmark = pytest.mark.slow

SCALE = int(os.environ.get("WORKBENCH_FUZZ_SCALE", "1"))
# No shrinking: a failing case here costs seconds to replay (a timeout, tens), so the first failure is
# reported as found, whole, rather than after minutes of replays.
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
PARAMS = [field.name for field in dataclasses.fields(SamplingParams)]
GREEDY = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
PROMPTS = ["The list type", "A dictionary is", "def f(x):"]
CANARY = ("The list type", 24)
# Every error code the API documents (docs/PROTOCOL.md); internal_error is the one a bug gets.
CODES = {"invalid_json", "invalid_frame", "frame_too_large", "rate_limited", "overloaded", "timeout",
         "invalid_request", "unknown_type", "invalid_params", "duplicate_request_id", "too_many_requests",
         "unknown_request_id", "engine_error", "unavailable", "worker_lost", "delivery_gap"}
CHAT_CODES = {"invalid_frame", "frame_too_large", "unknown_type", "invalid_request", "invalid_params", "busy",
              "rate_limited", "overloaded"}
DASHBOARD_CODES = {"invalid_frame", "invalid_change", "invalid_cancel"}

UNICODE_EDGES = ["\x00", "\u202e", "\u200f", "\u061c", "e\u0301", "a\u0300\u0301\u0302\u0303", "\U0001f44d",
                 "\U0001f469\u200d\U0001f469\u200d\U0001f467", "\U0001f1fa\U0001f1f8", "\ufeff", "\uffff",
                 "\u2028", "\U0010ffff", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u05e9\u05dc\u05d5\u05dd"]
edge_text = st.lists(st.sampled_from(UNICODE_EDGES) | st.text(min_size=1, max_size=3), min_size=1,
                     max_size=6).map("".join)
printable_edge_text = st.lists(st.sampled_from([edge for edge in UNICODE_EDGES if edge.isprintable()])
                               | st.text(min_size=1, max_size=3).filter(str.isprintable), min_size=1,
                               max_size=6).map("".join)
huge_ints = st.sampled_from([2**63, 2**64, -2**63 - 1, 10**30, -(10**30), 2**1000]) | st.integers(min_value=2**64)
scalars = (st.none() | st.booleans() | st.integers() | huge_ints | st.text(max_size=8) | edge_text
           | st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
# A value of another JSON type than a field's: every field takes a string, an integer or a list, not all.
wrong_types = st.one_of(st.booleans(), huge_ints, st.floats(allow_nan=False, allow_infinity=False),
                        st.dictionaries(st.text(max_size=4), scalars, max_size=2), st.lists(scalars, max_size=2))


def generate(request_id: str = "f", prompt: object = "The list type", **params: object) -> dict:
    return {"type": "generate", "request_id": request_id, "prompt": prompt, "params": {**GREEDY, **params}}


@st.composite
def field_faults(draw) -> tuple[dict, str]:
    """A valid generate frame with one field's value replaced by a wrong-typed or huge one; the field."""
    field = draw(st.sampled_from(["type", "request_id", "prompt", "messages", "params", *PARAMS]))
    frame, value = generate(), draw(wrong_types)
    if field in PARAMS:
        frame["params"][field] = value
    elif field == "messages":
        del frame["prompt"]
        frame["messages"] = draw(wrong_types | st.lists(wrong_types, min_size=1, max_size=2))
    else:
        frame[field] = value
    return frame, field


@st.composite
def lone_surrogates(draw) -> tuple[str, str]:
    """A frame's text with a lone surrogate escaped in one string or key (as JSON lets a client send it)."""
    where = draw(st.sampled_from(["request_id", "prompt", "stop", "key", "message"]))
    escape = draw(st.sampled_from(["\\ud800", "\\udbff", "\\udc00", "\\udfff", "a\\ud83d", "\\ude00b"]))
    frame = generate(request_id="s", prompt="@S@") if where == "prompt" else generate(request_id="s")
    if where == "request_id":
        frame["request_id"] = "@S@"
    elif where == "stop":
        frame["params"]["stop"] = ["ok", "@S@"]
    elif where == "key":
        frame["params"]["@S@"] = 1
    elif where == "message":
        del frame["prompt"]
        frame["messages"] = [{"role": "user", "content": "@S@"}]
    return json.dumps(frame).replace("@S@", escape), {"key": "a key in params", "stop": "params.stop[1]",
                                                      "message": "messages[0].content"}.get(where, where)


@st.composite
def unicode_requests(draw) -> dict:
    """A valid greedy request whose request_id, prompt and stop strings hold Unicode's edge cases (the
    request_id the printable ones: a control, separator or format character in it is refused, since it
    reaches the workers' logs)."""
    request_id = draw(printable_edge_text.filter(lambda text: len(text) <= 128))
    return generate(request_id=request_id, prompt="Hi " + draw(edge_text), stop=[draw(edge_text)])


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


not_json = st.text(max_size=20).filter(lambda text: not _parses(text))
# Each kind of single frame with its own share of the cases, so every kind runs however Hypothesis
# would weigh the branches of one strategy (a share of one branch varied from 5% to 60% between runs).
SINGLE_FRAMES = {
    "any": (json_values.map(lambda value: ("any", json.dumps(value), None)), 20),
    "field": (field_faults().map(lambda case: ("field", case[0], case[1])), 25),
    "surrogate": (lone_surrogates().map(lambda case: ("surrogate", case[0], case[1])), 10),
    "unicode": (unicode_requests().map(
        lambda frame: ("unicode", json.dumps(frame, ensure_ascii=False), frame["request_id"])), 25),
    "not json": (not_json.map(lambda text: ("not json", text, None)), 10),
    "binary": (st.binary(max_size=20).map(lambda data: ("binary", data, None)), 10),
}


class Canary:
    """Runs CANARY again and again on its own user's socket, always as request "victim" (the id the
    fuzzer tries to cancel), and checks each answer against the solo run. `failure` keeps what broke it."""

    def __init__(self, socket: Socket) -> None:
        self.socket, self.runs, self.failure = socket, 0, None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        prompt, max_tokens = CANARY
        try:
            while True:
                start = len(self.socket.frames)
                await self.socket.send(generate("victim", prompt, max_tokens=max_tokens))
                accepted = await self.socket.wait_for(lambda _, f: f.get("request_id") == "victim", start)
                assert self.socket.frames[accepted]["type"] == "accepted", self.socket.frames[accepted]
                await self.socket.wait_for(lambda _, f: f.get("request_id") == "victim"
                                           and f["type"] in ("done", "error"), accepted + 1)
                check_stream(request_frames(self.socket.frames, "victim", accepted)[0], solo(prompt, max_tokens))
                self.runs += 1
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failure = exc

    async def ran_since(self, since: int) -> None:
        while self.runs <= since and self.failure is None and self.task is not None and not self.task.done():
            await asyncio.sleep(0.05)

    def check(self, since: int) -> None:
        """The canary never failed, and ran whole at least once since it had run `since` times."""
        assert self.failure is None, f"the canary's answer changed beside the fuzzer: {self.failure!r}"
        assert self.runs > since, "the canary never ran whole beside the fuzzer"


@dataclasses.dataclass
class Fuzzing:
    loop: Loop
    address: str
    api: Socket  # the fuzzer's websocket API socket, user "fuzzer"
    canary: Canary


@pytest.fixture(scope="module")
def fuzzing(inprocess_daphne):
    """The fuzzer's API socket and a canary beside it for the whole module, on the shared in-process Daphne
    (users of their own: "fuzzer", "fuzz-canary"). At the end the canary must be intact."""
    served = inprocess_daphne
    tokens = issue_tokens(served.env, served.db_path, ["fuzzer", "fuzz-canary"])
    solo(*CANARY)  # before the canary starts, so its first run is compared at once
    loop = Loop()
    url = f"ws://{served.address}/ws/v1/generate"
    fuzzed, canary_socket = (loop.run(Socket(url, {"Authorization": f"Bearer {tokens[name]}"}).open())
                             for name in ("fuzzer", "fuzz-canary"))
    canary = Canary(canary_socket)
    loop.run(canary.start())
    try:
        yield Fuzzing(loop, served.address, fuzzed, canary)
        canary.check(0)
    finally:
        if canary.task is not None:
            canary.task.cancel()
        loop.run(fuzzed.close())
        loop.run(canary_socket.close())
        loop.stop()


def run_fuzz(fuzzing: Fuzzing, strategy, check, examples: int, timeout: float = 60) -> list:
    """Run `check(case)` on the fuzzing loop for `examples` * SCALE cases of `strategy`; the cases run.
    The canary must have stayed intact and run whole meanwhile."""
    cases: list = []
    canary_runs = fuzzing.canary.runs

    @settings(FUZZ, max_examples=examples * SCALE)  # one @settings: Hypothesis refuses a second
    @given(strategy)
    def one(case) -> None:
        cases.append(case)
        fuzzing.loop.run(check(case), timeout + 30)  # the checks' own waits time out first, saying why

    one()
    fuzzing.loop.run(fuzzing.canary.ran_since(canary_runs), 60)  # a quick fuzz: its next run still comes whole
    fuzzing.canary.check(canary_runs)
    return cases


async def finish(socket: Socket, accepted: dict[int, tuple[str, tuple[int, ...] | None]]) -> None:
    """Wait for every accepted request to end and check its stream (against its solo run where known)."""
    for at, (request_id, expected) in accepted.items():
        await socket.wait_for(lambda _, f, rid=request_id: f.get("request_id") == rid and f["type"] in ("done", "error")
                              and f.get("code") not in ANSWERS_TO_OTHER_FRAMES, at + 1)
        check_stream(request_frames(socket.frames, request_id, at)[0], expected)


class Pending:
    """Requests the single-frame fuzz had accepted and not yet seen end: checked in batches, so the
    fuzzer goes on sending while they generate (waiting for each in turn costs seconds per case on a
    loaded machine)."""

    BATCH = 8

    def __init__(self, socket: Socket) -> None:
        self.socket, self.accepted, self.ids = socket, {}, itertools.count()

    def running(self, request_id: object, before: int) -> bool:
        """Whether a request under this id had not ended by frame `before` (the server's answer that
        says it runs: its end may arrive while that answer is being checked)."""
        frames = self.socket.frames[:before]
        return any(rid == request_id and request_frames(frames, rid, at)[1] is None
                   for at, (rid, _) in self.accepted.items())

    async def add(self, at: int, request_id: str) -> None:
        self.accepted[at] = (request_id, None)
        if len(self.accepted) >= self.BATCH:
            await self.finish()

    async def finish(self) -> None:
        await finish(self.socket, self.accepted)
        self.accepted = {}


async def check_single(pending: Pending, case: tuple[str, str | bytes | dict, str | None]) -> None:
    kind, frame, about = case
    socket = pending.socket
    if isinstance(frame, dict):  # a field fault: an id of its own, so no earlier request's id is in the way
        frame = json.dumps({**frame, "request_id": f"f{next(pending.ids)}"} if about != "request_id" else frame)
    start, end = await socket.exchange(frame)
    got = answers(socket.frames[start:end])
    assert len(got) == 1, (case, got)
    answer = got[0]
    assert answer["type"] in ("accepted", "error"), answer
    if answer["type"] == "accepted":
        assert kind in ("any", "field", "unicode"), (case, answer)  # the others are never valid
        if kind == "unicode":
            assert answer["request_id"] == about, "the request_id comes back exactly as sent"
        await pending.add(start + socket.frames[start:end].index(answer), answer["request_id"])
        return
    assert answer["code"] in CODES and answer["message"], answer  # internal_error is a bug
    if answer["code"] == "duplicate_request_id":
        answered_at = start + socket.frames[start:end].index(answer)
        assert kind in ("any", "field", "unicode") and pending.running(answer["request_id"], answered_at), \
            (case, answer)
    elif kind == "field":
        assert about in answer["message"], f"the error names the field {about!r}: {answer}"
    elif kind == "surrogate":
        assert answer["code"] == "invalid_request" and "lone surrogate" in answer["message"], answer
        assert answer["message"].startswith(about), answer
        assert answer["request_id"] in (None, "s"), answer
    elif kind == "unicode":
        raise AssertionError(f"a valid request with Unicode's edge cases was refused: {answer}")
    elif kind == "not json":
        assert answer["code"] == "invalid_json", answer
    elif kind == "binary":
        assert answer["code"] == "invalid_frame", answer


def test_single_frames_get_their_answer_and_nothing_else_changes(fuzzing, capsys):
    pending = Pending(fuzzing.api)
    cases = {kind: run_fuzz(fuzzing, strategy, lambda case: check_single(pending, case), examples)
             for kind, (strategy, examples) in SINGLE_FRAMES.items()}
    fuzzing.loop.run(pending.finish(), 120)
    with capsys.disabled():
        print(f"\nprotocol fuzz, /ws/v1/generate: {sum(map(len, cases.values()))} single frames "
              f"{ {kind: len(run) for kind, run in cases.items()} }")


IDS = st.sampled_from(["a", "b", "c"])
actions = st.one_of(
    st.tuples(st.just("generate"), IDS, st.integers(0, len(PROMPTS) - 1), st.integers(1, 4)),
    st.tuples(st.just("cancel"), IDS | st.just("victim") | st.text(min_size=1, max_size=4)),
    st.tuples(st.just("resume"), IDS, st.integers(-1, 2**70)),
)


async def check_sequence(socket: Socket, steps: list[tuple]) -> None:
    accepted: dict[int, tuple[str, tuple[int, ...] | None]] = {}
    last: dict[str, int] = {}  # request_id -> where its latest request was accepted

    def ended(request_id: str) -> bool:
        return request_id in last and request_frames(socket.frames, request_id, last[request_id])[1] is not None

    for step in steps:
        if step[0] == "generate":
            _, request_id, prompt, max_tokens = step
            start, end = await socket.exchange(generate(request_id, PROMPTS[prompt], max_tokens=max_tokens))
            got = answers(socket.frames[start:end])
            assert len(got) == 1, (step, got)
            at = start + socket.frames[start:end].index(got[0])
            if got[0]["type"] == "accepted":
                # Only once the request with that id ended (its done was sent before this answer).
                previous_end = request_frames(socket.frames, request_id, last[request_id])[1] if request_id in last else -1
                assert previous_end is not None and previous_end < at, (step, "accepted while that id still ran")
                accepted[at] = (request_id, solo(PROMPTS[prompt], max_tokens))
                last[request_id] = at
            elif got[0]["code"] != "rate_limited":  # the shared server's per-user limits are real
                assert got[0]["code"] == "duplicate_request_id" and request_id in last, (step, got[0])
        elif step[0] == "cancel":
            request_id = step[1]
            start, end = await socket.exchange({"type": "cancel", "request_id": request_id})
            got = answers(socket.frames[start:end])
            if request_id not in last or ended(request_id):
                # Never started here (another user's "victim" included), or over: unknown. (One that ended
                # just now may still be leaving, so its cancel may pass unanswered.)
                assert [(g["code"], g["request_id"]) for g in got] in (
                    [("unknown_request_id", request_id)], *([[]] if request_id in last else [])), (step, got)
            else:
                assert got == [], (step, got)
        else:
            start, end = await socket.exchange({"type": "resume", "request_id": step[1], "from_offset": step[2]})
            got = answers(socket.frames[start:end])
            assert [g["code"] for g in got] == ["unknown_type"] and "type" in got[0]["message"], (step, got)
    await finish(socket, accepted)


def test_sequences_of_frames_keep_each_request_its_own(fuzzing, capsys):
    cases = run_fuzz(fuzzing, st.lists(actions, min_size=1, max_size=8),
                     lambda steps: check_sequence(fuzzing.api, steps), 15, timeout=120)
    with capsys.disabled():
        print(f"\nprotocol fuzz, /ws/v1/generate: {len(cases)} sequences, {sum(map(len, cases))} frames")


CHAT_PARAMS = {"max_tokens": 2, "temperature": 0}
chat_fields = st.fixed_dictionaries({
    "type": st.sampled_from(["send", "regenerate", "edit", "stop", "resume"]) | scalars,
    "content": st.just("Hello") | edge_text | wrong_types,
    "params": st.just(CHAT_PARAMS) | st.dictionaries(st.sampled_from(PARAMS), wrong_types, min_size=1, max_size=1)
    .map(lambda bad: {**CHAT_PARAMS, **bad}) | wrong_types,
    "message_id": st.none() | wrong_types | st.integers(-3, 10**6),
    "from_offset": st.integers(-3, 2**70) | wrong_types,
})
chat_frames = st.one_of(
    chat_fields.map(lambda frame: json.dumps(frame, ensure_ascii=False)),
    json_values.map(json.dumps),
    not_json,
    st.binary(max_size=20),
)


def _turn(text: str | bytes) -> bool:
    """Whether a chat frame asks for a reply (send, regenerate, edit): if nothing refuses it at once, a
    reply starts, whose frames come through the conversation's live outbox, after the marker's answer."""
    try:
        frame = json.loads(text)
    except ValueError:
        return False
    return isinstance(frame, dict) and frame.get("type") in ("send", "regenerate", "edit")


async def check_chat(socket: Socket, text: str | bytes) -> None:
    """One frame's immediate answer: at most one error, with a documented code and a message; a turn that
    nothing refused ends with `done` (its 2 tokens) before the next frame is sent."""
    start, end = await socket.exchange(text)
    got = socket.frames[start:end]
    errors = [f for f in got if f["type"] == "error"]
    assert len(errors) <= 1 and all(f["code"] in CHAT_CODES and f["message"] for f in errors), (text, got)
    if _turn(text) and not errors:
        # A resume's answer is a done with "content"; a turn's own done has none.
        at = await socket.wait_for(lambda _, f: (f["type"] == "done" and "content" not in f)
                                   or (f["type"] == "error" and f["code"] != "unknown_type"), start, timeout=60)
        ended = socket.frames[at]
        assert ended["type"] == "done" and ended["finish_reason"] in ("length", "stop"), (text, ended)
        assert any(f["type"] == "started" for f in socket.frames[start:at]), (text, socket.frames[start:at + 1])


def test_the_chat_socket_answers_every_frame_and_stays_open(fuzzing, capsys, make_user):
    session = make_user(fuzzing.address, "chat-fuzzer")
    conversation = session.new_conversation()
    socket = fuzzing.loop.run(Socket(f"ws://{fuzzing.address}/ws/chat/{conversation}", session.socket_headers(),
                                     CHAT_MARKER).open())
    try:
        cases = run_fuzz(fuzzing, chat_frames, lambda text: check_chat(socket, text), 40)
        assert socket.closed is None, socket.closed
    finally:
        fuzzing.loop.run(socket.close())
    replies = sum(1 for f in socket.frames if f["type"] == "started")
    with capsys.disabled():
        print(f"\nprotocol fuzz, /ws/chat/<id>: {len(cases)} frames, {replies} replies generated")


# set_flag is drawn only with values of the wrong kind, so the shared server's flags never change.
not_a_flag_value = st.none() | st.text(max_size=6) | st.floats(allow_nan=False) | st.lists(st.integers(), max_size=2)
dashboard_frames = st.one_of(
    st.fixed_dictionaries({"type": st.just("set_flag"), "id": scalars,
                           "name": st.sampled_from([entry.name for entry in REGISTRY]) | scalars,
                           "value": not_a_flag_value, "worker": st.none() | scalars})
    .map(lambda frame: json.dumps(frame, ensure_ascii=False)),
    st.fixed_dictionaries({"type": st.just("cancel_request"), "id": scalars, "worker": scalars,
                           "request_id": scalars | st.just("victim")}).map(lambda frame: json.dumps(frame)),
    json_values.map(json.dumps),
    not_json,
    st.binary(max_size=20),
)


async def check_dashboard(socket: Socket, text: str | bytes) -> None:
    start, end = await socket.exchange(text)
    got = socket.frames[start:end]
    assert len(got) == 1, (text, got)
    answer = got[0]
    if answer["type"] == "cancel_result":
        assert answer["error"], ("a fuzzed cancel named no live request", answer)
        return
    assert answer["type"] == "error" and answer["code"] in DASHBOARD_CODES and answer["message"], (text, answer)


def test_the_dashboard_socket_answers_every_frame_and_flips_nothing(fuzzing, capsys, inprocess_daphne):
    inprocess_daphne.ensure_admin()
    session = Session(fuzzing.address).log_in("admin", ADMIN_PASSWORD)
    socket = fuzzing.loop.run(Socket(f"ws://{fuzzing.address}/ws/ops/dashboard", session.socket_headers(),
                                     DASHBOARD_MARKER, skip=lambda frame: frame["type"] == "state").open())
    try:
        cases = run_fuzz(fuzzing, dashboard_frames, lambda text: check_dashboard(socket, text), 30)
        assert socket.closed is None, socket.closed
    finally:
        fuzzing.loop.run(socket.close())
    with capsys.disabled():
        print(f"\nprotocol fuzz, /ws/ops/dashboard: {len(cases)} frames")


assert MARKER not in "".join(UNICODE_EDGES)
