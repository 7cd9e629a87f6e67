"""A thinking model's reply split into its reasoning and its answer, whole or delta by delta.

Models whose chat template knows `<think>` blocks (Qwen3, DeepSeek-R1: Tokenizer.thinks) open a reply
with `<think>reasoning</think>` and then answer; some templates open the block in the generation
prompt itself, so the reply starts inside it and only closes it. Each API gives the reasoning its own
place (chat completions' `reasoning_content`, a Responses reasoning item, a Messages thinking block)
and the answer the usual one; the newlines that follow `</think>` are not part of the answer.

A reply that does not open with `<think>` (after whitespace) is all answer; one whose block never
closes is all reasoning. Streaming holds back only what could still be the start of a tag, so that
the deltas joined are exactly the whole reply's split.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def prompt_opens_thinking(prompt_tail: str) -> bool:
    """Whether the generation prompt (its last characters) leaves the reply inside a `<think>` block."""
    return prompt_tail.rstrip().endswith(OPEN)


def _held(text: str, tag: str) -> int:
    """The length of the longest end of `text` that could be the start of `tag`."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ReasoningSplit:
    """Feed the reply's text deltas in order; each call returns the (reasoning, answer) text it can release."""

    def __init__(self, opened: bool = False) -> None:
        self.opened = opened  # the generation prompt opened the block
        self.state = "reasoning" if opened else "start"
        self.buffer = ""
        self.thought = opened  # whether the reply has a thinking block

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buffer += text
        reasoning, answer = "", ""
        while True:
            if self.state == "start":
                head = self.buffer.lstrip()
                if head.startswith(OPEN):
                    self.state, self.buffer, self.thought = "reasoning", head[len(OPEN):], True
                elif OPEN.startswith(head) and not final:
                    return reasoning, answer  # whitespace, or the tag's start: undecided yet
                else:
                    self.state = "answer"
            elif self.state == "reasoning":
                end = self.buffer.find(CLOSE)
                if end >= 0:
                    reasoning += self.buffer[:end]
                    self.state, self.buffer = "after", self.buffer[end + len(CLOSE):]
                    continue
                keep = 0 if final else _held(self.buffer, CLOSE)
                reasoning += self.buffer[:len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep:]
                return reasoning, answer
            elif self.state == "after":
                rest = self.buffer.lstrip("\n")
                if not rest and not final:
                    self.buffer = ""
                    return reasoning, answer
                self.state, self.buffer = "answer", rest
            else:
                answer += self.buffer
                self.buffer = ""
                return reasoning, answer


def split_whole(text: str, opened: bool = False) -> tuple[str | None, str]:
    """A whole reply's (reasoning, answer); reasoning None where the reply has no thinking block."""
    split = ReasoningSplit(opened)
    reasoning, answer = split.feed(text, final=True)
    return (reasoning if split.thought else None), answer
