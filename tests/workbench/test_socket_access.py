"""An open socket loses its user at the next frame (workbench/protocol/socket_access.py), through the
session's shared in-process Daphnes (the demo model's, and SmolLM2's where a reply must outlast a wait)
with real websocket clients: a chat user deactivated while their reply streams, a staff member who is
no longer staff, or no longer holds the flag permission, on the dashboard; a session logged out in this
web process (its sockets closed at once with SIGNED_OUT) or in another one (its session row gone: refused
at the next frame). Each has its liveness control: the same frames are taken while the user still may.

Users are changed in the SQLite file the server reads, as an admin's save or another web process's
logout changes it: the server hears of it only through the database, so at the first frame once the
answer the socket keeps is older than WORKBENCH_SOCKET_RECHECK_S (`seen_by_the_server`; a change saved by
the server's own process ends it at once: tests/workbench/test_socket_recheck.py).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import websockets

from tests.waiting import wait_until
from tests.workbench.daphne_session import PASSWORD, Session
from tests.workbench.test_security import running_requests
from workbench.protocol.socket_access import SIGNED_OUT_CLOSE

pytestmark = pytest.mark.slow  # the shared Daphne's start, when this module runs first
# To the model's length: runs until stopped. Served by SmolLM2: the demo model's 512 positions take it
# under a second on a fast machine, less than the recheck's wait.
LONG = {"max_tokens": None, "ignore_eos": True, "temperature": 0}
SHORT = {"max_tokens": 4, "ignore_eos": True, "temperature": 0}
# The first socket of a fresh server may wait for the engine's start (the dashboard's before accept).
OPEN_TIMEOUT = 90


async def seen_by_the_server() -> None:
    """Waits out the answer an open socket keeps (WORKBENCH_SOCKET_RECHECK_S, the shared servers' default):
    its next frame asks the database again."""
    from django.conf import settings

    await asyncio.sleep(settings.WORKBENCH_SOCKET_RECHECK_S)


def change_user(db_path: Path, username: str, **columns: int) -> None:
    """Set columns of the user's row (is_active, is_staff) in the served database."""
    assignments = ", ".join(f"{name} = ?" for name in columns)
    with sqlite3.connect(db_path) as db:
        changed = db.execute(f"UPDATE auth_user SET {assignments} WHERE username = ?", (*columns.values(), username))
        assert changed.rowcount == 1, username
    db.close()


def set_flag_permission(db_path: Path, username: str, held: bool) -> None:
    with sqlite3.connect(db_path) as db:
        (user_id,), (permission_id,) = (db.execute("SELECT id FROM auth_user WHERE username = ?", (username,)).fetchone(),
                                        db.execute("SELECT id FROM auth_permission WHERE codename = 'flip_flags'").fetchone())
        if held:
            db.execute("INSERT INTO auth_user_user_permissions (user_id, permission_id) VALUES (?, ?)", (user_id, permission_id))
        else:
            db.execute("DELETE FROM auth_user_user_permissions WHERE user_id = ?", (user_id,))
    db.close()


def delete_session(db_path: Path, session: Session) -> None:
    """What a logout served by another web process does here: the session's row is gone."""
    [key] = [cookie.value for cookie in session.jar if cookie.name == "sessionid"]
    with sqlite3.connect(db_path) as db:
        assert db.execute("DELETE FROM django_session WHERE session_key = ?", (key,)).rowcount == 1
    db.close()


def replies(db_path: Path, conversation: int) -> list[str]:
    """The finish_reason of each stored reply of the conversation."""
    with sqlite3.connect(db_path) as db:
        rows = db.execute("SELECT finish_reason FROM chat_message WHERE conversation_id = ? AND role = 'assistant'",
                          (conversation,)).fetchall()
    db.close()
    return [row[0] for row in rows]


class Frames:
    """One socket's frames as they come, kept in order."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws, self.frames = ws, []

    async def send(self, frame: dict) -> None:
        await self.ws.send(json.dumps(frame))

    async def until(self, predicate: Callable[[dict], bool], timeout: float = 60) -> dict:
        while True:
            frame = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            self.frames.append(frame)
            if predicate(frame):
                return frame

    async def until_closed(self, timeout: float = 30) -> int | None:
        """The close code the server ends the socket with (frames before it kept)."""
        try:
            while True:
                self.frames.append(json.loads(await asyncio.wait_for(self.ws.recv(), timeout)))
        except websockets.ConnectionClosed:
            return self.ws.close_code

    def errors(self) -> list[str]:
        return [f["code"] for f in self.frames if f["type"] == "error"]


def chat_socket(session: Session, conversation: int):
    return websockets.connect(f"{session.base.replace('http', 'ws')}/ws/chat/{conversation}",
                              additional_headers=session.socket_headers(), open_timeout=OPEN_TIMEOUT)


def dashboard_socket(session: Session):
    return websockets.connect(f"{session.base.replace('http', 'ws')}/ws/ops/dashboard",
                              additional_headers=session.socket_headers(), open_timeout=OPEN_TIMEOUT)


def test_a_user_deactivated_while_their_reply_streams_is_refused_at_the_next_frame(smollm2_daphne, make_user):
    served = smollm2_daphne  # its replies run for seconds, past the recheck's wait, on any machine we have
    user = make_user(served.address, "deactivated")
    conversation = user.new_conversation()

    async def run() -> tuple[Frames, int | None, float]:
        async with chat_socket(user, conversation) as ws:
            chat = Frames(ws)
            await chat.send({"type": "send", "content": "Tell me about lists", "params": LONG})
            first = await chat.until(lambda f: f["type"] == "delta")
            # Liveness: while active, a frame is taken (following its own reply, a resume answers nothing).
            await chat.send({"type": "resume", "from_offset": 0})
            await chat.until(lambda f: f["type"] == "delta" and f["index"] > first["index"] + 2)
            assert chat.errors() == [], chat.frames
            running = running_requests(served.address)
            await asyncio.to_thread(change_user, served.db_path, user.username, is_active=0)
            await seen_by_the_server()
            await chat.send({"type": "resume", "from_offset": 0})
            return chat, await chat.until_closed(), running

    chat, code, running = asyncio.run(run())
    assert running >= 1, "liveness: the reply ran when the user was deactivated"
    assert chat.errors() == ["account_disabled"] and code == 4401, (chat.frames[-3:], code)
    assert not any(f["type"] == "done" for f in chat.frames), "the long reply did not run to its end"
    # The refused socket's reply is stopped in the engine and stored as far as it got.
    wait_until(lambda: replies(served.db_path, conversation) == ["canceled"], 30, "the stopped reply stored")
    wait_until(lambda: running_requests(served.address) == 0, 30, "the engine to let the reply go")


def test_a_user_who_stays_active_keeps_the_socket_turn_after_turn(inprocess_daphne, make_user):
    """The control of the refusals here: the same frames, the user unchanged, all answered."""
    user = make_user(inprocess_daphne.address, "stays")
    conversation = user.new_conversation()

    async def run() -> Frames:
        async with chat_socket(user, conversation) as ws:
            chat = Frames(ws)
            for turn in ("first", "second", "third"):
                await chat.send({"type": "send", "content": turn, "params": SHORT})
                await chat.until(lambda f: f["type"] in ("done", "error"))
            return chat

    chat = asyncio.run(run())
    assert chat.errors() == [] and [f["finish_reason"] for f in chat.frames if f["type"] == "done"] == ["length"] * 3
    assert replies(inprocess_daphne.db_path, conversation) == ["length"] * 3


def test_staff_who_is_no_longer_staff_is_refused_at_the_next_dashboard_frame(inprocess_daphne, make_user):
    served = inprocess_daphne
    operator = make_user(served.address, "demoted")
    change_user(served.db_path, operator.username, is_staff=1)
    ask = {"type": "cancel_request", "worker": "no-such-worker", "request_id": "no-such-request"}

    async def run() -> tuple[Frames, dict, int | None]:
        async with dashboard_socket(operator) as ws:
            dashboard = Frames(ws)
            await dashboard.until(lambda f: f["type"] == "state")
            await dashboard.send({**ask, "id": "while-staff"})
            answered = await dashboard.until(lambda f: f["type"] != "state")
            await asyncio.to_thread(change_user, served.db_path, operator.username, is_staff=0)
            await seen_by_the_server()
            await dashboard.send({**ask, "id": "no-longer"})
            return dashboard, answered, await dashboard.until_closed()

    dashboard, answered, code = asyncio.run(run())
    assert answered["type"] == "cancel_result" and answered["id"] == "while-staff", "liveness: answered while staff"
    assert dashboard.errors() == ["forbidden"] and code == 4403, (dashboard.frames[-2:], code)
    assert not any(f.get("id") == "no-longer" for f in dashboard.frames), "the refused frame was not acted on"


def test_an_operator_without_the_flag_permission_has_the_next_change_refused(inprocess_daphne, make_user):
    """Still staff, so still watching: only the change is refused, and nothing is changed or logged."""
    served = inprocess_daphne
    operator = make_user(served.address, "unflagged")
    change_user(served.db_path, operator.username, is_staff=1)
    set_flag_permission(served.db_path, operator.username, held=True)

    async def run() -> tuple[Frames, dict, dict]:
        async with dashboard_socket(operator) as ws:
            dashboard = Frames(ws)
            state = await dashboard.until(lambda f: f["type"] == "state")
            [worker] = state["workers"]
            # The value in force set again, so the shared server's flags stay as they were.
            change = {"type": "set_flag", "name": "ARC_GRAPH_VERIFY_REPLAYS", "worker": worker,
                      "value": state["workers"][worker]["flags"]["ARC_GRAPH_VERIFY_REPLAYS"]}
            await dashboard.send({**change, "id": "held"})
            held = await dashboard.until(lambda f: f["type"] != "state")
            await asyncio.to_thread(set_flag_permission, served.db_path, operator.username, held=False)
            await dashboard.send({**change, "id": "removed"})
            removed = await dashboard.until(lambda f: f["type"] != "state")
            await dashboard.until(lambda f: f["type"] == "state", timeout=10)  # it still watches
            return dashboard, held, removed

    dashboard, held, removed = asyncio.run(run())
    assert held["type"] == "flag_result" and held["id"] == "held", f"liveness: the permission works while held: {held}"
    assert (removed["type"], removed["id"], removed["code"]) == ("error", "removed", "forbidden"), removed


def test_logging_out_closes_that_sessions_sockets_at_once_and_no_other_sessions(smollm2_daphne, make_user):
    served = smollm2_daphne
    user = make_user(served.address, "leaver")
    change_user(served.db_path, user.username, is_staff=1)
    other = Session(served.address).log_in(user.username, PASSWORD)  # the same user in another browser
    streaming, elsewhere = user.new_conversation(), user.new_conversation()

    async def run() -> tuple[Frames, int | None, Frames, int | None, Frames]:
        async with chat_socket(user, streaming) as chat_ws, dashboard_socket(user) as dashboard_ws, \
                chat_socket(other, elsewhere) as other_ws:
            chat, dashboard, kept = Frames(chat_ws), Frames(dashboard_ws), Frames(other_ws)
            await dashboard.until(lambda f: f["type"] == "state")
            await chat.send({"type": "send", "content": "Tell me about lists", "params": LONG})
            await chat.until(lambda f: f["type"] == "delta")
            await asyncio.to_thread(user.log_out)
            # Nothing more is sent on these sockets: the logout alone closes them.
            chat_code, dashboard_code = await chat.until_closed(), await dashboard.until_closed()
            await kept.send({"type": "send", "content": "still here", "params": SHORT})
            await kept.until(lambda f: f["type"] in ("done", "error"))
            return chat, chat_code, dashboard, dashboard_code, kept

    chat, chat_code, dashboard, dashboard_code, kept = asyncio.run(run())
    assert chat.errors() == ["signed_out"] and chat_code == SIGNED_OUT_CLOSE, (chat.frames[-2:], chat_code)
    assert dashboard.errors() == ["signed_out"] and dashboard_code == SIGNED_OUT_CLOSE, (dashboard.frames[-2:], dashboard_code)
    assert kept.errors() == [] and kept.frames[-1]["type"] == "done", "the other session's socket goes on"
    wait_until(lambda: replies(served.db_path, streaming) == ["canceled"], 30, "the stopped reply stored")


def test_a_logout_in_another_web_process_ends_the_socket_at_its_next_frame(inprocess_daphne, make_user):
    """No group message crosses processes (the consumers' layer is in memory): the frame's own check
    finds the session gone."""
    served = inprocess_daphne
    user = make_user(served.address, "elsewhere")
    conversation = user.new_conversation()

    async def run() -> tuple[Frames, int | None]:
        async with chat_socket(user, conversation) as ws:
            chat = Frames(ws)
            await chat.send({"type": "send", "content": "before", "params": SHORT})
            await chat.until(lambda f: f["type"] in ("done", "error"))
            assert chat.errors() == [], "liveness: signed in, the turn is answered"
            await asyncio.to_thread(delete_session, served.db_path, user)
            await seen_by_the_server()
            await chat.send({"type": "send", "content": "after", "params": SHORT})
            return chat, await chat.until_closed()

    chat, code = asyncio.run(run())
    assert chat.errors() == ["signed_out"] and code == SIGNED_OUT_CLOSE, (chat.frames[-2:], code)
    assert replies(served.db_path, conversation) == ["length"], "the refused turn stored nothing"
