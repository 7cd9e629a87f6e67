"""Keeping one request's deltas whole and in order across Redis: offsets checked, repeats trimmed.

Every delta from a worker says where it starts, in tokens (`index`, from the engine) and in characters
(`text_offset`, stamped by the worker's outbox). The web side keeps what it has received so far and
accepts each delta only if it continues exactly there: a delta that repeats what arrived already (a
resend after a send that half-failed) is trimmed to its new part or dropped; one that starts further
on means something was lost, and the request ends with an error instead of a reply with a hole in it.
"""

from __future__ import annotations

from dataclasses import replace

from workbench.serving.streams import StreamEvent


class DeliveryGap(Exception):
    pass


class InOrder:
    def __init__(self) -> None:
        self.tokens = 0  # token offset the next delta must reach
        self.chars = 0   # character offset likewise

    def accept(self, event: StreamEvent) -> StreamEvent | None:
        """The part of `event` not yet received (None when there is none); raises DeliveryGap."""
        if event.error_code:
            return self._failure(event)
        if event.index > self.tokens or event.text_offset > self.chars:
            raise DeliveryGap(f"tokens {self.tokens}-{event.index - 1} were lost in transit")
        new_tokens = event.token_ids[self.tokens - event.index:]
        new_text = event.text[self.chars - event.text_offset:]
        if not new_tokens and not new_text and not event.finished:
            return None
        self.tokens += len(new_tokens)
        self.chars += len(new_text)
        if event.finished and event.usage and event.usage.get("completion_tokens") != self.tokens:
            raise DeliveryGap(f"{event.usage.get('completion_tokens')} tokens were generated, {self.tokens} arrived")
        return StreamEvent(index=self.tokens - len(new_tokens), text=new_text, token_ids=new_tokens,
                           finished=event.finished, finish_reason=event.finish_reason, usage=event.usage,
                           timings=event.timings, text_offset=self.chars - len(new_text))

    def _failure(self, event: StreamEvent) -> StreamEvent:
        """A failure ends the request wherever it stands. The tokens it may carry (held back by a stream
        interval) pass the same check as a delta's: their new part if they continue what arrived, none
        if they would leave a hole (the error says the request is incomplete anyway)."""
        if not event.token_ids and not event.text:
            return event
        continues = event.index <= self.tokens and event.text_offset <= self.chars
        new_tokens = event.token_ids[self.tokens - event.index:] if continues else []
        new_text = event.text[self.chars - event.text_offset:] if continues else ""
        self.tokens += len(new_tokens)
        self.chars += len(new_text)
        return replace(event, index=self.tokens - len(new_tokens), token_ids=new_tokens, text=new_text,
                       text_offset=self.chars - len(new_text))
