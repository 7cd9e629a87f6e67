"""The reasoning splitter (workbench/api/reasoning.py) on its own: whole replies, and every way of cutting a
reply into deltas gives the whole reply's split."""

from __future__ import annotations

import pytest

from workbench.api.reasoning import ReasoningSplit, prompt_opens_thinking, split_whole

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
