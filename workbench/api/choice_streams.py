"""The streams of an OpenAI request's `n` choices read as one: (choice index, event) in arrival order,
until every choice has finished; and their usage summed (the prompt counted once, as OpenAI does).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from workbench.serving.streams import RequestStream, StreamEvent


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
