"""The reasoning splitter (workbench/api/reasoning.py) on its own: whole replies, and every way of cutting a
reply into deltas gives the whole reply's split; and the Responses and Messages shapes built on it (a
reasoning item, a thinking block), whole and streamed. The chat route itself: test_reasoning_routes.py."""

from __future__ import annotations

import pytest

from workbench.api.anthropic import reply
from workbench.api.openai.tool_calls import Tools
from workbench.api.reasoning import ReasoningSplit, prompt_opens_thinking, split_whole
from workbench.api.responses.output import Output

CASES = [
    ("<think>\nLet me see.\n</think>\n\nParis.", False, ("\nLet me see.\n", "Paris.")),
    ("  <think>a<b</think>answer <think> stays", False, ("a<b", "answer <think> stays")),
    ("Paris, no thinking.", False, (None, "Paris, no thinking.")),
    ("<thin", False, (None, "<thin")),  # a tag never finished is text
    ("<think>never closed </thi", False, ("never closed </thi", "")),
    ("reasoning first</think>\n\nthe answer", True, ("reasoning first", "the answer")),
    ("<think></think>\n\nempty thoughts", False, ("", "empty thoughts")),
    ("", False, (None, "")),
]


@pytest.mark.parametrize("text, opened, expected", CASES)
def test_a_whole_reply(text, opened, expected):
    assert split_whole(text, opened) == expected


@pytest.mark.parametrize("text, opened, expected", CASES)
def test_any_cut_into_deltas_gives_the_whole_replys_split(text, opened, expected):
    for size in range(1, max(len(text), 1) + 1):
        split = ReasoningSplit(opened)
        parts = [split.feed(text[at:at + size]) for at in range(0, len(text), size)] + [split.feed("", final=True)]
        reasoning, answer = "".join(r for r, _ in parts), "".join(a for _, a in parts)
        assert (reasoning if split.thought else None, answer) == expected, size


def test_a_generation_prompt_that_opens_the_block():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")


REPLY = "<think>\nweigh it\n</think>\n\nParis."


def test_a_responses_reply_has_a_reasoning_item_first_whole_and_streamed():
    whole = Output(Tools((), "none"), ReasoningSplit())
    whole.feed(REPLY, final=True)
    assert [item["type"] for item in whole.items] == ["reasoning", "message"]
    assert whole.items[0]["content"] == [{"type": "reasoning_text", "text": "\nweigh it\n"}]
    assert whole.items[1]["content"][0]["text"] == "Paris."
    streamed = Output(Tools((), "none"), ReasoningSplit())
    events = [e for at in range(0, len(REPLY), 3) for e in streamed.feed(REPLY[at:at + 3], final=False)]
    events += streamed.feed("", final=True)
    assert [{k: v for k, v in item.items() if k != "id"} for item in streamed.items] == \
        [{k: v for k, v in item.items() if k != "id"} for item in whole.items]
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "\nweigh it\n"
    plain = Output(Tools((), "none"))
    plain.feed(REPLY, final=True)
    assert [item["type"] for item in plain.items] == ["message"], "without a splitter the text stays whole"


def test_a_messages_reply_has_a_thinking_block_first_whole_and_streamed():
    blocks = reply.content(REPLY, Tools((), "none"), ReasoningSplit())
    assert blocks == [{"type": "thinking", "thinking": "\nweigh it\n", "signature": ""},
                      {"type": "text", "text": "Paris."}]
    stream = reply.BlockStream(Tools((), "none"), ReasoningSplit())
    events = [e for at in range(0, len(REPLY), 3) for e in stream.events(REPLY[at:at + 3], final=False)]
    events += list(stream.events("", final=True))
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "\nweigh it\n"
    assert "".join(d.get("text", "") for d in deltas) == "Paris."
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1], "each block closed once, in order"
