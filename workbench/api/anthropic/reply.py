"""A Messages reply in Anthropic's shapes, whole or as the events of a stream, from what the engine
sent: its text (split into text and tool_use blocks by the OpenAI route's tool-call parser,
workbench/api/openai/tool_calls.py), its finish and its usage.

- stop_reason: `tool_use` (the answer is a call), `max_tokens` (max_tokens ended it),
  `model_context_window_exceeded` (the model's length ended it first: Claude Code sends max_tokens far
  past a small model's length), `stop_sequence` (one of stop_sequences ended it, named in
  `stop_sequence`), else `end_turn`.
- A thinking model's reasoning (workbench/api/reasoning.py) is a `thinking` block ahead of the answer's
  blocks (its `signature` empty: nothing here signs it), streamed as `thinking_delta`s.
- usage: `input_tokens` the prompt tokens computed, `cache_read_input_tokens` those the prefix cache
  held (the two add up to the prompt, as count_tokens counts it), `output_tokens` the tokens generated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from engine.loading.tokenizer import Tokenizer
from workbench.api.openai import tool_calls
from workbench.api.reasoning import ReasoningSplit, split_whole


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped call (tool_calls.parse's) as Anthropic's tool_use block."""
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
            "name": call["function"]["name"], "input": json.loads(call["function"]["arguments"])}


def content(text: str, tools: tool_calls.Tools, split: ReasoningSplit | None = None) -> list[dict[str, Any]]:
    """A whole answer's content blocks: its reasoning (a thinking model's), its text (when any), then its call."""
    thinking: list[dict[str, Any]] = []
    if split is not None:
        reasoning, text = split_whole(text, split.opened)
        if reasoning is not None:
            thinking = [{"type": "thinking", "thinking": reasoning, "signature": ""}]
    said, calls = tool_calls.parse(text, tools)
    return thinking + ([{"type": "text", "text": said}] if said else []) + [tool_use(call) for call in calls]


def stop_reason(finish: str | None, has_call: bool, token_ids: list[int], tokenizer: Tokenizer,
                stop: list[str], context_full: bool = False) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence); `context_full`: the prompt and the reply fill the model's length. The
    engine reports a stop string as `stop`, as it does the EOS; the two are told apart by the tokens: a
    reply a stop string ended holds it in its tokens' text (cut from the text sent), and one that did not
    holds none (the engine stops at the first), an EOS adding no text."""
    if has_call:
        return "tool_use", None
    if finish == "length":
        return ("model_context_window_exceeded" if context_full else "max_tokens"), None
    if finish == "stop" and stop:
        whole = tokenizer.decode(token_ids)
        hits = sorted((at, n) for n, s in enumerate(stop) if (at := whole.find(s)) >= 0)
        if hits:
            return "stop_sequence", stop[hits[0][1]]
    return "end_turn", None


def usage(engine_usage: dict | None) -> dict[str, int]:
    if engine_usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    cached = engine_usage.get("cached_tokens", 0)
    return {"input_tokens": engine_usage["prompt_tokens"] - cached, "cache_read_input_tokens": cached,
            "output_tokens": engine_usage["completion_tokens"]}


class BlockStream:
    """The content-block events of a streamed answer: text deltas in a text block until a call
    starts, then the call as a tool_use block (its input as one input_json_delta, sent when the call's
    closing tag has come), each block opened with content_block_start and closed with content_block_stop."""

    def __init__(self, tools: tool_calls.Tools, split: ReasoningSplit | None = None) -> None:
        self.calls = tool_calls.CallStream(tools)
        self.split = split
        self.index = -1  # the open block's, or the last one's
        self.open_text = False
        self.open_thinking = False

    def events(self, text: str, final: bool) -> Iterator[dict[str, Any]]:
        if self.split is not None:
            reasoning, text = self.split.feed(text, final)
            if reasoning and not self.open_thinking:
                self.index += 1
                self.open_thinking = True
                yield {"type": "content_block_start", "index": self.index,
                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
            if reasoning:
                yield {"type": "content_block_delta", "index": self.index,
                       "delta": {"type": "thinking_delta", "thinking": reasoning}}
            if self.open_thinking and (text or final):
                self.open_thinking = False
                yield {"type": "content_block_stop", "index": self.index}
        items = self.calls.feed(text) + (self.calls.close() if final else [])
        for kind, value in items:
            if kind == "content":
                if not self.open_text:
                    self.index += 1
                    self.open_text = True
                    yield {"type": "content_block_start", "index": self.index,
                           "content_block": {"type": "text", "text": ""}}
                yield {"type": "content_block_delta", "index": self.index,
                       "delta": {"type": "text_delta", "text": value}}
                continue
            yield from self._close_text()
            self.index += 1
            block = tool_use(value)
            yield {"type": "content_block_start", "index": self.index, "content_block": {**block, "input": {}}}
            yield {"type": "content_block_delta", "index": self.index,
                   "delta": {"type": "input_json_delta", "partial_json": value["function"]["arguments"]}}
            yield {"type": "content_block_stop", "index": self.index}
        if final:
            yield from self._close_text()

    def _close_text(self) -> Iterator[dict[str, Any]]:
        if self.open_text:
            self.open_text = False
            yield {"type": "content_block_stop", "index": self.index}
