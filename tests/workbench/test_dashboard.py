"""The operator dashboard's socket and page: staff only; what it shows of a live engine (a sequence with
its user, appearing and finishing; the dropped-foreign-tokens event of a staged waitlist interleave,
with its counts, also stored for the admin); flag changes over the socket need the permission."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager
from dataclasses import replace
from unittest.mock import ANY

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import OperationalError

from engine import Engine, EngineConfig, SamplingParams
from engine.decode.device_loop import KillSwitch
from engine.decode.leak_events import FOREIGN_PARKED_DROPPED
from tests.reference import solo
from tests.waiting import wait_until
from tests.workbench.test_chat import as_user
from tests.workbench.test_websocket_api import connect
from workbench.ops import recorder
from workbench.ops.models import FlagChange, LeakEvent, ReplayCheck
from workbench.ops.recorder import Recorder
from workbench.ops.routing import websocket_urlpatterns
from workbench.serving import bridge
from workbench.serving.engine_host import EngineHost
from workbench.serving.inprocess import LOCAL_WORKER, InProcessTransport

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("sam", password="pw-sam-12345", is_staff=True)


async def dashboard(user) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(as_user(user, websocket_urlpatterns), "/ws/ops/dashboard")
    connected, code = await ws.connect(timeout=30)
    assert connected, f"refused with {code}"
    ws.shown = None  # the last state frame: what the page shows until the next one
    return ws


async def state_until(ws: WebsocketCommunicator, predicate, timeout: float = 20) -> dict:
    """The state the dashboard shows once its workers satisfy `predicate` (the socket sends a state
    only when it changed, so the last one received counts)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while ws.shown is None or not predicate(ws.shown["workers"]):
        left = deadline - asyncio.get_running_loop().time()
        assert left > 0, "the dashboard never showed it"
        frame = json.loads(await ws.receive_from(timeout=left))
        if frame["type"] == "state":
            ws.shown = frame
    return ws.shown


@pytest.mark.asyncio
async def test_only_staff_get_the_dashboard_socket(django_user_model):
    user = await sync_to_async(django_user_model.objects.create_user)("ursula", password="pw-ursula-1")
    for who in (AnonymousUser(), user):
        connected, code = await WebsocketCommunicator(as_user(who, websocket_urlpatterns), "/ws/ops/dashboard").connect()
        assert not connected and code == 4403


@pytest.mark.asyncio
async def test_an_api_token_never_opens_the_dashboard_even_a_staff_members(staff):
    """Through the real ASGI stack: a token is for generating, not for operating."""
    from workbench.api.models import ApiToken
    from workbench.asgi import application

    _, token = await sync_to_async(ApiToken.issue)(staff, "ops")
    ws = WebsocketCommunicator(application, "/ws/ops/dashboard", headers=[(b"authorization", f"Bearer {token}".encode())])
    connected, code = await ws.connect()
    assert not connected and code == 4403
    api = WebsocketCommunicator(application, "/ws/v1/generate", headers=[(b"authorization", f"Bearer {token}".encode())])
    assert (await api.connect())[0], "liveness: the same token opens the API socket"
    await api.disconnect()


@pytest.mark.django_db
def test_only_staff_get_the_dashboard_page(client, django_user_model, staff, operator):
    assert client.get("/ops/dashboard").status_code == 302  # anonymous: to the login page
    client.force_login(django_user_model.objects.create_user("ursula", password="pw-ursula-1"))
    assert client.get("/ops/dashboard").status_code == 403
    client.force_login(staff)
    page = client.get("/ops/dashboard")
    assert page.status_code == 200 and 'data-may-flip="false"' in page.content.decode()
    assert '/ops/dashboard"' in client.get("/admin/").content.decode(), "linked from the admin"
    client.force_login(operator)
    assert 'data-may-flip="true"' in client.get("/ops/dashboard").content.decode()


@pytest.mark.asyncio
@pytest.mark.usefixtures("quick_dashboard")  # two pushes while 400 tokens run: under a second on a fast machine
async def test_a_sequence_appears_with_its_user_and_leaves_when_it_finishes(staff, api_user):
    ws = await dashboard(staff)
    api = await connect(api_user[1])
    await api.send_to(text_data=json.dumps({"type": "generate", "request_id": "watched", "prompt": "The list type",
                                            "params": {"max_tokens": 400, "temperature": 0, "ignore_eos": True}}))

    def watched(workers):
        return [s for s in workers[LOCAL_WORKER]["state"]["sequences"] if s["request_id"].endswith("watched")]

    frame = await state_until(ws, lambda workers: watched(workers))
    [seq] = watched(frame["workers"])
    assert seq["user"] == "alice" and seq["state"] in ("RunningPrompt", "RunningCompletion", "Waiting")
    assert seq["max_tokens"] == 400 and seq["owner_matches"] is True
    await state_until(ws, lambda workers: watched(workers) and watched(workers)[0]["tokens"] > seq["tokens"])
    await api.send_to(text_data=json.dumps({"type": "cancel", "request_id": "watched"}))
    await state_until(ws, lambda workers: not watched(workers))
    await api.disconnect()
    await ws.disconnect()


@pytest.mark.asyncio
async def test_a_staff_member_without_the_permission_cannot_flip_over_the_socket(staff):
    ws = await dashboard(staff)
    before = (await state_until(ws, lambda workers: True))["workers"][LOCAL_WORKER]["flags"]
    await ws.send_to(text_data=json.dumps({"type": "set_flag", "id": 7, "name": "ARC_GRAPH_DEVICE_LOOP",
                                           "value": not before["ARC_GRAPH_DEVICE_LOOP"]}))
    answer = await _answer(ws)
    assert (answer["type"], answer["id"], answer["code"]) == ("error", 7, "forbidden")
    await asyncio.sleep(0.3)
    assert bridge.transport().flags_in_force()[LOCAL_WORKER] == before
    assert await FlagChange.objects.acount() == 0
    await ws.disconnect()


@pytest.mark.asyncio
async def test_an_operator_flips_over_the_socket_and_bad_frames_are_refused(operator):
    ws = await dashboard(operator)
    was = (await state_until(ws, lambda workers: True))["workers"][LOCAL_WORKER]["flags"]["ARC_GRAPH_VERIFY_REPLAYS"]
    for bad, code in (("not json", "invalid_frame"), (json.dumps([1]), "invalid_frame"),
                      (json.dumps({"type": "set_flag", "name": "ARC_GRAPH_VERIFY_REPLAYS", "value": "3"}), "invalid_change"),
                      (json.dumps({"type": "set_flag", "name": "ARC_NOPE", "value": True}), "invalid_change"),
                      ("x" * (settings.WORKBENCH_MAX_FRAME_BYTES + 1), "frame_too_large")):
        await ws.send_to(text_data=bad)
        assert (await _answer(ws))["code"] == code
    # Every error echoes the frame's id, one about its type too (the protocol fuzzer found it missing there).
    await ws.send_to(text_data=json.dumps({"type": "flip", "id": "which"}))
    assert await _answer(ws) == {"type": "error", "id": "which", "code": "invalid_frame", "message": ANY}
    assert await FlagChange.objects.acount() == 0
    await ws.send_to(text_data=json.dumps({"type": "set_flag", "id": "a", "name": "ARC_GRAPH_VERIFY_REPLAYS",
                                           "value": was + 3, "worker": LOCAL_WORKER}))
    answer = await _answer(ws)
    assert answer["id"] == "a" and answer["answers"][LOCAL_WORKER]["in_force"]["ARC_GRAPH_VERIFY_REPLAYS"] == was + 3
    await state_until(ws, lambda workers: workers[LOCAL_WORKER]["flags"]["ARC_GRAPH_VERIFY_REPLAYS"] == was + 3)
    change = await FlagChange.objects.aget()
    assert (change.user_id, change.name, change.value, change.workers) == (operator.pk, "ARC_GRAPH_VERIFY_REPLAYS",
                                                                          was + 3, [LOCAL_WORKER])
    shown = (await state_until(ws, lambda workers: ws.shown["changes"]))["changes"]
    assert [(c["id"], c["user"], c["name"], c["value"], c["workers"], c["refused_by"]) for c in shown] == \
        [(change.pk, "olga", "ARC_GRAPH_VERIFY_REPLAYS", was + 3, LOCAL_WORKER, [])], "the log, on the dashboard"
    await ws.send_to(text_data=json.dumps({"type": "set_flag", "name": "ARC_GRAPH_VERIFY_REPLAYS", "value": was}))
    await _answer(ws)
    await ws.disconnect()


@pytest.mark.asyncio
async def test_an_operator_who_loses_the_permission_loses_it_on_the_open_socket_too(operator):
    ws = await dashboard(operator)
    await ws.send_to(text_data=json.dumps({"type": "set_flag", "name": "ARC_GRAPH_VERIFY_REPLAYS", "value": 0}))
    assert "answers" in await _answer(ws), "liveness: the permission works while held"
    await sync_to_async(operator.user_permissions.clear)()
    await ws.send_to(text_data=json.dumps({"type": "set_flag", "name": "ARC_GRAPH_VERIFY_REPLAYS", "value": 0}))
    assert (await _answer(ws))["code"] == "forbidden"
    assert await FlagChange.objects.acount() == 1
    await ws.disconnect()


@pytest.mark.asyncio
async def test_a_user_who_stops_being_staff_is_dropped_from_the_open_socket(staff, monkeypatch):
    from workbench.ops import consumers

    monkeypatch.setattr(consumers, "RECHECK_S", 0.2)
    ws = await dashboard(staff)
    assert await first_close(ws, within=0.8) is None, "liveness: several re-checks pass while staff"
    staff.is_staff = False
    await staff.asave(update_fields=["is_staff"])
    assert await first_close(ws, within=5) == 4403


async def first_close(ws: WebsocketCommunicator, within: float) -> int | None:
    """The close code the socket sends within `within` seconds (state frames skipped), or None."""
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        if await ws.receive_nothing(timeout=0.05, interval=0.01):
            continue  # (receive_output's own timeout would cancel the consumer)
        output = await ws.receive_output(timeout=1)
        if output["type"] == "websocket.close":
            return output["code"]
    return None


async def _answer(ws: WebsocketCommunicator) -> dict:
    while True:
        frame = json.loads(await ws.receive_from(timeout=15))
        if frame["type"] != "state":
            return frame
        ws.shown = frame


# -- the waitlist interleave, seen on the dashboard ----------------------------------------------

class Collected:
    """A sink that keeps a request's tokens (the engine thread pushes to it)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.done = threading.Event()

    def push_threadsafe(self, event) -> None:
        self.tokens += event.token_ids
        if event.finished:
            self.done.set()


@contextmanager
def serving_engine(config: EngineConfig):
    """The in-process transport serving an engine built from `config` for the length of the block, with a
    kill switch of its own: nothing another test did to the process's switch can stand its loop down."""
    transport = InProcessTransport(EngineHost(lambda: Engine(config, kill_switch=KillSwitch())), config.model)
    transport.start()
    saved = bridge._transports.get("inprocess")
    bridge._transports["inprocess"] = transport
    try:
        yield transport
    finally:
        bridge._transports.pop("inprocess")
        if saved is not None:
            bridge._transports["inprocess"] = saved
        transport.stop()


@pytest.fixture
def interleaving_transport(tiny_checkpoint):
    """An engine staged for the waitlist interleave (docs/DEVICE_LOOP.md, the owner tag): the bucket scheduler runs one
    length bucket per step and moves the other sequence aside with no state change, so only the parked
    queue's owner tag stands between the two (as in tests/engine/test_device_loop_leaks.py)."""
    checkpoint = tiny_checkpoint("llama", seed=11)
    config = EngineConfig(model=str(checkpoint), block_size=4, device_loop=True, burst_length=4, scheduler="bucket")
    with serving_engine(config) as transport:
        yield transport, checkpoint


@pytest.mark.asyncio
async def test_replay_checks_show_with_their_layer_deltas_and_are_stored_once(staff, tiny_checkpoint):
    config = EngineConfig(model=str(tiny_checkpoint("llama", seed=11)), graphs=True, verify_always=True,
                          layer_bisect=True)
    with serving_engine(config) as transport:
        ws = await dashboard(staff)
        done = Collected()
        transport.host.add("r", list(range(100, 105)), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                           done)
        assert await asyncio.to_thread(done.done.wait, 30)
        frame = await state_until(ws, lambda workers: len(workers[LOCAL_WORKER]["state"]["replay_checks"]) == 11)
        checks = frame["workers"][LOCAL_WORKER]["state"]["replay_checks"]
        layers = len(transport.host.engine.loaded.model.model.layers)
        assert [c["replay"] for c in checks] == list(range(1, 12)), "one check per decode step, in order"
        assert all(c["max_abs_delta"] == 0 and not c["divergent"] and c["argmax_agrees"]
                   and len(c["layer_deltas"]) == layers for c in checks), \
            "a correct replay matches its eager step exactly, layer by layer"
        assert frame["workers"][LOCAL_WORKER]["state"]["capture"]["mode"] == "cpu-replay"
        for _ in range(2):  # two web processes' recorders: each check stored once
            await sync_to_async(Recorder(transport).record_once)()
        stored = [c async for c in ReplayCheck.objects.order_by("replay")]
        assert [(c.replay, c.max_abs_delta, c.divergent, c.layer_deltas) for c in stored] == \
            [(c["replay"], 0.0, False, c["layer_deltas"]) for c in checks]

        # A replay that produced NaN: the worst divergence, shown and stored as such, and the socket
        # still sends valid JSON (a bare NaN would stop the page).
        records = transport.host.engine.runner.graphs.verify.records
        broken = replace(records[-1], replay=99, max_abs_delta=float("nan"), layer_deltas=(0.0, float("nan")),
                         first_divergent_layer=1)
        records.append(broken)  # the engine thread is idle: nothing races
        transport.host.add("s", [7, 8, 9], SamplingParams(max_tokens=1, temperature=0), Collected())  # a new snapshot
        frame = await state_until(
            ws, lambda workers: any(c["replay"] == 99 for c in workers[LOCAL_WORKER]["state"]["replay_checks"]))
        [shown] = [c for c in frame["workers"][LOCAL_WORKER]["state"]["replay_checks"] if c["replay"] == 99]
        assert (shown["max_abs_delta"], shown["divergent"], shown["layer_deltas"]) == (None, True, [0.0, None])
        await sync_to_async(Recorder(transport).record_once)()
        stored = await ReplayCheck.objects.aget(replay=99)
        assert (stored.max_abs_delta, stored.divergent) == (None, True)
        await ws.disconnect()


@pytest.mark.asyncio
async def test_a_staged_waitlist_interleave_shows_its_dropped_foreign_tokens_on_the_socket(staff, interleaving_transport):
    transport, checkpoint = interleaving_transport
    ws = await dashboard(staff)
    quiet = await state_until(ws, lambda workers: True)
    assert quiet["workers"][LOCAL_WORKER]["state"]["leak_events"] == [], "liveness: nothing before the staging"
    greedy = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=14, temperature=0.8, seed=3, ignore_eos=True)  # never bursts
    a, b = Collected(), Collected()
    transport.host.add("A", list(range(100, 105)), greedy, a, user="alice")
    transport.host.add("B", list(range(200, 212)), sampled, b, user="bob")

    def dropped(workers):
        return [e for e in workers[LOCAL_WORKER]["state"]["leak_events"] if e["kind"] == FOREIGN_PARKED_DROPPED]

    frame = await state_until(ws, dropped)
    assert await asyncio.to_thread(a.done.wait, 30) and await asyncio.to_thread(b.done.wait, 30)
    events = dropped(frame["workers"])
    assert all(e["dropped"] > 0 and f"dropped {e['dropped']} foreign parked tokens" in e["message"] for e in events)
    final = await state_until(ws, lambda workers: workers[LOCAL_WORKER]["state"]["sequences"] == [])
    loop = final["workers"][LOCAL_WORKER]["state"]["device_loop"]
    assert sum(e["dropped"] for e in dropped(final["workers"])) == loop["foreign_dropped"] > 0, "the counts add up"
    # The drop kept each its own: both answers are their solo runs.
    assert a.tokens == solo(checkpoint, list(range(100, 105)), greedy, device_loop=False)
    assert b.tokens == solo(checkpoint, list(range(200, 212)), sampled, device_loop=False)
    # Two web processes' recorders, running as the bridge runs them: each event stored once.
    def recorders() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "ops-recorder")

    already = recorders()  # the bridge's own, for the transport other tests use
    stops = [recorder.start(transport), recorder.start(transport)]
    assert recorders() == already + 2
    expected = [(LOCAL_WORKER, e["number"], e["dropped"]) for e in dropped(final["workers"])]

    async def stored():
        try:
            return [(e.worker, e.number, e.dropped) async for e in LeakEvent.objects.order_by("number")]
        except OperationalError:  # the test database (SQLite, shared in memory) locks a table being written
            return None

    for _ in range(50):
        if await stored() == expected:
            break
        await asyncio.sleep(0.1)
    await asyncio.to_thread(lambda: [stop() for stop in stops])
    assert await stored() == expected
    assert recorders() == already, "each stops when told"
    await ws.disconnect()


def test_a_recorder_whose_connection_cleanup_fails_keeps_recording(monkeypatch):
    polls = []

    class NoWorkers:  # nothing to store: only the loop is under test
        def workers_view(self):
            polls.append(1)
            return {}

    def database_away():
        raise OperationalError("database away")

    monkeypatch.setattr(recorder, "close_old_connections", database_away)
    monkeypatch.setattr(recorder, "EVERY_S", 0.01)
    keeper = Recorder(NoWorkers())
    thread = threading.Thread(target=keeper.run, name="test-recorder")
    thread.start()
    try:
        wait_until(lambda: len(polls) >= 3, 10, "three polls past a failing cleanup")
    finally:
        keeper.stopping.set()
        thread.join(5)


def listing(transport) -> tuple[bool, bool]:
    """(a worker's heartbeat lists a sequence of the busy user, a worker's counts its sequences unlisted)"""
    beats = transport.workers().values()
    listed = any(s["user"] == "kept-busy" for beat in beats for s in beat.state.get("sequences") or [])
    unlisted = any(beat.state.get("sequences") is None and beat.state.get("sequence_count") for beat in beats)
    return listed, unlisted


async def until(predicate, timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.1)
    return False


@pytest.mark.asyncio
@pytest.mark.parametrize("serving_transport", ["celery"], indirect=True)
async def test_celery_workers_send_their_sequence_lists_only_while_a_dashboard_is_open(serving_transport, staff):
    """The list grows with the load and rides every heartbeat, so it goes only while someone looks."""
    transport = await bridge.transport_from_loop()
    stop = asyncio.Event()

    async def keep_busy() -> None:  # one request after another (the demo model's 512 positions are ~2 s)
        n = 0
        while not stop.is_set():
            n += 1
            params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
            async for _ in transport.submit(f"busy-{id(stop)}-{n}", "The list type", params, user="kept-busy"):
                pass

    busy = asyncio.create_task(keep_busy())
    lost_after = transport.link_settings.lost_after_s
    try:
        assert await until(lambda: listing(transport) == (False, True), lost_after + 10), \
            "unwatched, a worker counts its sequences without listing them"
        ws = await dashboard(staff)
        shown = await state_until(ws, lambda workers: any(
            s["user"] == "kept-busy" for w in workers.values() for s in w["state"].get("sequences") or []), 15)
        assert shown["type"] == "state"
        await ws.disconnect()
        assert await until(lambda: listing(transport) == (False, True), lost_after + 10), \
            "the lists stop once the last dashboard closed"
    finally:
        stop.set()
        await asyncio.wait_for(busy, 30)
