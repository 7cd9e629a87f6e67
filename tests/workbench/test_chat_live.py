"""workbench/chat/live.py: a follower gets the deltas from its offset then the live frames, in order,
and an entry lasts only until its reply ends (a later reply's entry is not removed by an earlier one)."""

from __future__ import annotations

from workbench.chat import live


def test_a_follower_catches_up_from_its_offset_then_gets_live_frames_in_order():
    reply = live.start(7001, "chat-7001-a")
    try:
        for index, text in [(0, "a"), (2, "b"), (5, "c")]:
            reply.publish({"type": "delta", "index": index, "text": text})
        got: list[live.Frame] = []
        reply.follow(got.append, 2)
        reply.publish({"type": "delta", "index": 6, "text": "d"})
        reply.unfollow(got.append)
        reply.publish({"type": "done"})
        assert [f.get("text") for f in got] == ["b", "c", "d"]
    finally:
        live.end(7001, reply)


def test_an_entry_lives_until_its_reply_ends_and_no_longer():
    before = live.count()
    first = live.start(7002, "chat-7002-a")
    assert live.count() == before + 1 and live.of(7002) is first  # liveness: the entry is there meanwhile
    second = live.start(7002, "chat-7002-b")
    live.end(7002, first)  # an earlier reply ending late leaves the newer one alone
    assert live.of(7002) is second
    live.end(7002, second)
    assert live.of(7002) is None and live.count() == before
