"""A Responses reply's output items, built from the engine's text as it comes, with the stream events
each step makes: a whole reply and its stream are built by the same code, so they carry the same items.

Text goes into one assistant `message` item (its one `output_text` part) until a call starts; the call
(parsed by the chat route's tool-call parser, workbench/api/openai/tool_calls.py) is a `function_call`
item of its own. A thinking model's reasoning (workbench/api/reasoning.py) comes first, as a `reasoning`
item with one `reasoning_text` part. Events, as OpenAI streams them:

    response.output_item.added, response.content_part.added, response.reasoning_text.delta ...,
    response.reasoning_text.done, response.content_part.done, response.output_item.done  (reasoning)

    response.output_item.added, response.content_part.added, response.output_text.delta ...,
    response.output_text.done, response.content_part.done, response.output_item.done      (a message)
    response.output_item.added, response.function_call_arguments.delta,
    response.function_call_arguments.done, response.output_item.done                     (a call)
"""

from __future__ import annotations

import uuid
from typing import Any

from workbench.api.openai import tool_calls
from workbench.api.reasoning import ReasoningSplit
from workbench.api.responses.tools import flat_name

Event = dict[str, Any]


class Output:
    def __init__(self, tools: tool_calls.Tools, split: ReasoningSplit | None = None,
                 namespaced: dict[str, tuple[str, str]] | None = None) -> None:
        self.calls = tool_calls.CallStream(tools)
        self.namespaced = namespaced or {}  # the chat route's name of a namespace's function -> (namespace, name)
        self.split = split
        self.items: list[dict[str, Any]] = []
        self._text: dict[str, Any] | None = None  # the open message item's output_text part
        self._reasoning: dict[str, Any] | None = None  # the open reasoning item's reasoning_text part

    def feed(self, text: str, final: bool) -> list[Event]:
        """The events of the next `text` (and, when `final`, of the reply's end)."""
        events: list[Event] = []
        if self.split is not None:
            reasoning, text = self.split.feed(text, final)
            if reasoning:
                events += self._open_reasoning() + [self._at({"type": "response.reasoning_text.delta",
                                                              "delta": reasoning})]
                assert self._reasoning is not None
                self._reasoning["text"] += reasoning
            if text or final:
                events += self._close_reasoning()
        for kind, value in self.calls.feed(text) + (self.calls.close() if final else []):
            if kind == "content":
                events += self._open_message() + [self._at({"type": "response.output_text.delta", "delta": value,
                                                            "logprobs": []})]
                assert self._text is not None
                self._text["text"] += value
            else:
                events += self._close_message() + self._call(value)
        return events + (self._close_message() if final else [])

    @property
    def has_call(self) -> bool:
        return self.calls.calls > 0

    def messages(self) -> list[dict[str, Any]]:
        """The reply as chat messages, for a follow-up's conversation."""
        text = "".join(part["text"] for item in self.items if item["type"] == "message" for part in item["content"])
        calls = [{"id": item["call_id"], "type": "function",
                  "function": {"name": flat_name(item["namespace"], item["name"]) if "namespace" in item else item["name"],
                               "arguments": item["arguments"]}}
                 for item in self.items if item["type"] == "function_call"]
        return [{"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}]

    def _at(self, event: Event) -> Event:
        item = self.items[-1]
        return {**event, "item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _open_message(self) -> list[Event]:
        if self._text is not None:
            return []
        self._text = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "in_progress", "role": "assistant",
                "content": []}
        self.items.append(item)
        added = {"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": dict(item)}
        return [added, self._at({"type": "response.content_part.added", "part": dict(self._text)})]

    def _open_reasoning(self) -> list[Event]:
        if self._reasoning is not None:
            return []
        self._reasoning = {"type": "reasoning_text", "text": ""}
        item = {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "status": "in_progress", "summary": [],
                "content": []}
        self.items.append(item)
        added = {"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": dict(item)}
        return [added, self._at({"type": "response.content_part.added", "part": dict(self._reasoning)})]

    def _close_reasoning(self) -> list[Event]:
        if self._reasoning is None:
            return []
        part, self._reasoning = self._reasoning, None
        item = self.items[-1]
        item.update(status="completed", content=[part])
        return [self._at({"type": "response.reasoning_text.done", "text": part["text"]}),
                self._at({"type": "response.content_part.done", "part": part}),
                {"type": "response.output_item.done", "output_index": len(self.items) - 1, "item": item}]

    def _close_message(self) -> list[Event]:
        if self._text is None:
            return []
        part, self._text = self._text, None
        item = self.items[-1]
        item.update(status="completed", content=[part])
        return [self._at({"type": "response.output_text.done", "text": part["text"], "logprobs": []}),
                self._at({"type": "response.content_part.done", "part": part}),
                {"type": "response.output_item.done", "output_index": len(self.items) - 1, "item": item}]

    def _call(self, call: dict[str, Any]) -> list[Event]:
        function = call["function"]
        item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                "name": function["name"], "arguments": "", "status": "in_progress"}
        if function["name"] in self.namespaced:
            item["namespace"], item["name"] = self.namespaced[function["name"]]
        self.items.append(item)
        index = len(self.items) - 1
        added = {"type": "response.output_item.added", "output_index": index, "item": dict(item)}
        item.update(arguments=function["arguments"], status="completed")
        where = {"item_id": item["id"], "output_index": index}
        return [added, {"type": "response.function_call_arguments.delta", **where, "delta": function["arguments"]},
                {"type": "response.function_call_arguments.done", **where, "name": item["name"],
                 "arguments": function["arguments"]},
                {"type": "response.output_item.done", "output_index": index, "item": item}]
