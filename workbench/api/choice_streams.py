"""A request's `n` choices (the OpenAI API's `n`, the websocket API's `params.n`), each its own engine
sequence: each one's params (its own seed), their submission and streams as one ChoiceGroup ((choice
index, event) in arrival order, until every choice has finished; whatever ends the reading cancels the
choices still running), and their usage summed (the prompt counted once, as OpenAI does).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType

from engine import SamplingParams
from engine.sampling_params import is_integer
from workbench.protocol.request_input import BAD_PARAMS, InvalidInput
from workbench.serving.limits import Admission
from workbench.serving.streams import RequestStream, StreamEvent
from workbench.serving.transport import Transport

MAX_N = 8  # choices per request: each is a sequence in the engine, and a request must not fill it alone
SEED_SPAN = 2**64  # torch.Generator's seed range is [-2**63, 2**64): derived seeds wrap inside it


def choice_count(value: object) -> int:
    """`n` as sent (the OpenAI body's, the websocket API's params'): a JSON integer from 1 to MAX_N, one
    rule and one message on both APIs."""
    if not is_integer(value) or not 1 <= value <= MAX_N:
        raise InvalidInput(BAD_PARAMS, f"n: must be an integer from 1 to {MAX_N}, got {value!r}", "n")
    return value


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """Each choice's params: choice i draws with the request's seed + i (wrapped into the seed range),
    so a seeded request repeats choice for choice and choice 0 is what n=1 gives; unseeded, each
    choice's generator is seeded at random by the engine."""
    if params.seed is None:
        return [params] * n
    low = -2**63
    return [dataclasses.replace(params, seed=(params.seed + i - low) % SEED_SPAN + low) for i in range(n)]


def choice_ids(engine_id: str, n: int) -> list[str]:
    """Each choice's engine id: the first keeps the request's, as with one choice."""
    return [engine_id if i == 0 else f"{engine_id}-{i}" for i in range(n)]


class ChoiceGroup:
    """A request's choices, submitted and read as one: `async with` it, iterate (choice index, event),
    and leaving the block (every choice done, a choice failed, or the reader went away) cancels every
    choice whose stream has not ended, so nothing runs on for a reply nobody reads."""

    def __init__(self, transport: Transport, engine_ids: list[str], streams: list[RequestStream]) -> None:
        self.transport, self.engine_ids, self.streams = transport, engine_ids, streams
        self._events = merged(streams)

    @classmethod
    def submit(cls, transport: Transport, admissions: list[Admission], engine_ids: list[str],
               prompt: str | list[int], params: SamplingParams, model: str, keep_record: bool = True) -> ChoiceGroup:
        """One engine sequence per choice, each through its own admission, with its own params (choice_params);
        `keep_record`: whether their reproducibility records are kept (limits.Admission.submit)."""
        streams = [admission.submit(transport, engine_id, prompt, choice, model, keep_record)
                   for admission, engine_id, choice in zip(admissions, engine_ids,
                                                           choice_params(params, len(engine_ids)))]
        return cls(transport, engine_ids, streams)

    def __aiter__(self) -> AsyncIterator[tuple[int, StreamEvent]]:
        return self._events

    async def __aenter__(self) -> ChoiceGroup:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self._events.aclose()
        for engine_id, stream in zip(self.engine_ids, self.streams):
            if not stream.closed:
                self.transport.cancel(engine_id)


async def merged(streams: list[RequestStream]) -> AsyncGenerator[tuple[int, StreamEvent], None]:
    if len(streams) == 1:  # the common case, without a task per stream
        async for event in streams[0]:
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, StreamEvent]] = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        async for event in stream:
            await queue.put((index, event))

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            index, event = await queue.get()
            left -= event.finished  # each stream ends with one finished event
            yield index, event
    finally:  # the reader went away (or is done): nothing may keep waiting on its streams
        for task in tasks:
            task.cancel()


def summed_usage(usages: list[dict | None]) -> dict | None:
    """One usage for all choices: their completion tokens added, the shared prompt's (and its cached part) once."""
    if not usages or any(usage is None for usage in usages):
        return None
    prompt = usages[0]["prompt_tokens"]  # type: ignore[index]  # checked just above
    completion = sum(usage["completion_tokens"] for usage in usages)  # type: ignore[index]
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if "cached_tokens" in usages[0]:  # type: ignore[operator]  # the shared prompt's cached part (prefix cache)
        usage["cached_tokens"] = usages[0]["cached_tokens"]  # type: ignore[index]
    return usage
