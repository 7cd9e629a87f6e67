"""Delivery between a worker and a web process: the worker's outbox coalesces and keeps
order through failed sends; the web side's InOrder accepts exactly the continuation of what it has,
trims repeats and turns holes into errors; the one-round-trip send is what channels-redis reads, and
the batch receive reads what either sends."""

from __future__ import annotations

import uuid

import pytest

from tests.cluster import RedisServer
from workbench.serving.celery.outbox import Outbox
from workbench.serving.celery.sequencing import DeliveryGap, InOrder
from workbench.serving.streams import StreamEvent, deliver


def delta(index: int, tokens: list[int], text: str, text_offset: int, **finish) -> StreamEvent:
    return StreamEvent(index=index, token_ids=tokens, text=text, text_offset=text_offset, **finish)


def test_in_order_deltas_pass_unchanged():
    order = InOrder()
    assert order.accept(delta(0, [1, 2], "ab", 0)).token_ids == [1, 2]
    last = order.accept(delta(2, [3], "c", 2, finished=True, finish_reason="length", usage={"completion_tokens": 3}))
    assert (last.index, last.token_ids, last.text, last.finished) == (2, [3], "c", True)


def test_a_repeat_is_dropped_and_an_overlap_trimmed_to_its_new_part():
    order = InOrder()
    order.accept(delta(0, [1, 2], "ab", 0))
    assert order.accept(delta(0, [1, 2], "ab", 0)) is None
    overlap = order.accept(delta(1, [2, 3, 4], "bcd", 1))
    assert (overlap.index, overlap.token_ids, overlap.text, overlap.text_offset) == (2, [3, 4], "cd", 2)
    assert (order.tokens, order.chars) == (4, 4)


@pytest.mark.parametrize("event", [delta(3, [4], "d", 3), delta(2, [3], "c", 5)], ids=["tokens", "text"])
def test_a_hole_raises(event):
    order = InOrder()
    order.accept(delta(0, [1, 2], "ab", 0))
    with pytest.raises(DeliveryGap):
        order.accept(event)


def test_a_last_delta_that_does_not_account_for_every_token_raises():
    """A canceled request's last delta carries no tokens: without the usage check, tokens dropped just
    before it would go unnoticed."""
    order = InOrder()
    order.accept(delta(0, [1, 2], "ab", 0))
    with pytest.raises(DeliveryGap):
        order.accept(delta(2, [], "", 2, finished=True, finish_reason="canceled", usage={"completion_tokens": 5}))


def test_a_failure_passes_wherever_the_stream_stands():
    order = InOrder()
    order.accept(delta(0, [1, 2], "ab", 0))
    assert order.accept(StreamEvent.failure("worker_lost", "gone")).error_code == "worker_lost"


def test_a_failure_carrying_held_tokens_is_checked_like_a_delta():
    """With a stream interval a failure carries the tokens held before it: a resend's repeat is trimmed,
    and tokens that would leave a hole are dropped (the error stands either way)."""
    order = InOrder()
    order.accept(delta(0, [1, 2], "ab", 0))
    resent = order.accept(delta(1, [2, 3], "bc", 1, finished=True, finish_reason="error", error_code="engine_error",
                                error="boom"))
    assert (resent.index, resent.token_ids, resent.text, resent.error_code) == (2, [3], "c", "engine_error")
    assert (order.tokens, order.chars) == (3, 3)
    beyond = InOrder()
    beyond.accept(delta(0, [1], "a", 0))
    holed = beyond.accept(delta(4, [5], "e", 4, finished=True, finish_reason="error", error_code="engine_error",
                                error="boom"))
    assert (holed.token_ids, holed.text, holed.error_code) == ([], "", "engine_error")


def test_logprob_records_go_where_their_tokens_go_when_coalesced_and_trimmed():
    def with_logprobs(index: int, tokens: list[int], text: str, text_offset: int) -> StreamEvent:
        return StreamEvent(index=index, token_ids=tokens, text=text, text_offset=text_offset,
                           logprobs=[[t, -0.5 * t, [[t, -0.5 * t]]] for t in tokens])

    outbox = Outbox(lambda: None)
    sink = outbox.sink("web-1", "r")
    sink.push_threadsafe(with_logprobs(0, [1, 2], "ab", 0))
    sink.push_threadsafe(with_logprobs(2, [3], "c", 0))
    taken = outbox.take()["web-1"]["r"]
    assert [record[0] for record in taken.logprobs] == taken.token_ids == [1, 2, 3]
    order = InOrder()
    order.accept(with_logprobs(0, [1, 2], "ab", 0))
    fresh = order.accept(with_logprobs(0, [1, 2, 3, 4], "abcd", 0))  # a resend that overlaps
    assert fresh.token_ids == [3, 4] and [record[0] for record in fresh.logprobs] == [3, 4]


def test_outbox_coalesces_per_request_and_wakes_once_per_channel():
    wakes = []
    outbox = Outbox(lambda: wakes.append(1))
    a, b = outbox.sink("web-1", "ra"), outbox.sink("web-1", "rb")
    a.push_threadsafe(delta(0, [1], "x", 0))
    a.push_threadsafe(delta(1, [2], "yy", 0))
    b.push_threadsafe(delta(0, [7], "z", 0))
    assert len(wakes) == 1
    taken = outbox.take()["web-1"]
    assert (taken["ra"].index, taken["ra"].token_ids, taken["ra"].text, taken["ra"].text_offset) == (0, [1, 2], "xyy", 0)
    a.push_threadsafe(delta(2, [3], "w", 0))
    assert len(wakes) == 2 and outbox.take()["web-1"]["ra"].text_offset == 3, "the sink stamps character offsets"


def test_one_engine_step_for_many_requests_wakes_the_link_once():
    # Woken per request, the link took a step's deltas as they came: four messages a step at 8 clients.
    wakes = []
    outbox = Outbox(lambda: wakes.append(1))
    sinks = [outbox.sink("web-1", f"r{n}") for n in range(3)] + [outbox.sink("web-2", "s")]
    deliver([(sink, delta(0, [n], "ab", 0)) for n, sink in enumerate(sinks)])
    assert len(wakes) == 1
    taken = outbox.take()
    assert sorted(taken["web-1"]) == ["r0", "r1", "r2"] and list(taken["web-2"]) == ["s"]
    deliver([(sinks[0], delta(1, [9], "c", 0))])
    assert len(wakes) == 2 and outbox.take()["web-1"]["r0"].text_offset == 2, "each sink stamps its own offsets"


def test_a_failed_send_goes_back_in_front_of_newer_deltas():
    outbox = Outbox(lambda: None)
    sink = outbox.sink("web-1", "r")
    sink.push_threadsafe(delta(0, [1], "a", 0))
    failed = outbox.take()["web-1"]
    sink.push_threadsafe(delta(1, [2], "b", 0, finished=True, finish_reason="length"))
    outbox.put_back("web-1", failed)
    merged = outbox.take()["web-1"]["r"]
    assert (merged.index, merged.token_ids, merged.text, merged.finished) == (0, [1, 2], "ab", True)
    order = InOrder()
    assert order.accept(merged).token_ids == [1, 2]


def test_discard_drops_only_that_channel():
    outbox = Outbox(lambda: None)
    outbox.sink("web-1", "r1").push_threadsafe(delta(0, [1], "a", 0))
    outbox.sink("web-2", "r2").push_threadsafe(delta(0, [2], "b", 0))
    outbox.discard("web-1")
    assert list(outbox.take()) == ["web-2"] and not outbox


@pytest.mark.asyncio
async def test_the_one_trip_send_is_read_by_channels_redis_and_refuses_when_full():
    from channels.exceptions import ChannelFull
    from channels_redis.core import RedisChannelLayer

    from workbench.serving.celery.redis_layer import OneTripChannelLayer

    # A prefix of this run's own: the machine's Redis is shared by test runs side by side (flush() below
    # deletes everything under it).
    prefix = f"wbtest-onetrip-{uuid.uuid4().hex[:8]}"
    sender = OneTripChannelLayer(hosts=["redis://127.0.0.1:6379/0"], capacity=2, prefix=prefix)
    receiver = RedisChannelLayer(hosts=["redis://127.0.0.1:6379/0"], capacity=2, prefix=prefix)
    try:
        for channel in (await receiver.new_channel(), "wbtest-general"):
            await sender.send(channel, {"type": "t", "n": 1})
            await sender.send(channel, {"type": "t", "n": 2})
            with pytest.raises(ChannelFull):
                await sender.send(channel, {"type": "t", "n": 3})
            assert [(await receiver.receive(channel))["n"] for _ in range(2)] == [1, 2]
    finally:
        await receiver.flush()  # only this test's prefix
        await sender.close_pools()
        await receiver.close_pools()


@pytest.fixture(scope="module")
def redis_without_bzmpop():
    """A Redis that answers BZMPOP as one before 7.0 does: unknown command."""
    server = RedisServer("--rename-command", "BZMPOP", "").start()
    yield server.url
    server.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("redis_7", [True, False], ids=["bzmpop", "before-redis-7"])
async def test_the_batch_receive_takes_what_waits_in_order_and_reads_channels_redis_sends(redis_7, request):
    from channels_redis.core import RedisChannelLayer

    from workbench.serving.celery.redis_layer import OneTripChannelLayer

    url = "redis://127.0.0.1:6379/0" if redis_7 else request.getfixturevalue("redis_without_bzmpop")
    prefix = f"wbtest-batch-{uuid.uuid4().hex[:8]}"  # this run's own, as above
    receiver = OneTripChannelLayer(hosts=[url], prefix=prefix)
    plain = RedisChannelLayer(hosts=[url], prefix=prefix)
    receiver.brpop_timeout = 1
    try:
        channel = await receiver.new_channel()
        for n in range(5):
            await (plain if n == 2 else receiver).send(channel, {"type": "t", "n": n})
            if n == 3:  # and something no layer sent, among them
                await receiver.connection(0).zadd(receiver.prefix + receiver.non_local_name(channel), {b"junk": 1e12})
        received = []
        while len(received) < 5:
            batch = await receiver.receive_batch(channel, limit=3)
            assert 0 < len(batch) <= (3 if redis_7 else 1)
            received += batch
        assert received == [{"type": "t", "n": n} for n in range(5)]
        assert await receiver.receive_batch(channel) == [], "nothing waiting: empty after the timeout"
        assert receiver.has_bzmpop == redis_7
    finally:
        await receiver.flush()  # only this test's prefix
        await receiver.close_pools()
        await plain.close_pools()
