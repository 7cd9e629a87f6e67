"""A worker's table of held requests by reply channel: what it gives the link loop's deliveries and its
orphan watch (workbench/serving/celery/reply_channels.py). No Redis needed."""

from __future__ import annotations

from workbench.serving.celery.reply_channels import ReplyChannels


def test_a_gone_web_process_gives_up_exactly_its_own_requests() -> None:
    table = ReplyChannels()
    table.hold("a1", "web-a")
    table.hold("a2", "web-a")
    table.hold("b1", "web-b")
    assert table.channels() == ["web-a", "web-b"], "each web process once"
    assert sorted(table.forget_channel("web-a")) == ["a1", "a2"]
    assert table.channels() == ["web-b"]
    assert table.forget_channel("web-a") == [], "forgotten: a second watch finds nothing to cancel"


def test_a_finished_request_leaves_the_table_and_its_channel_with_the_last() -> None:
    table = ReplyChannels()
    table.hold("a1", "web-a")
    table.hold("a2", "web-a")
    table.finished(["a1", "unknown"])  # a request id it never held is no error
    assert table.channels() == ["web-a"], "liveness: a2 still holds the channel"
    table.finished(iter(["a2"]))
    assert table.channels() == [] and table.forget_channel("web-a") == []
