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
        if not self._continues(event):
            raise DeliveryGap(f"tokens {self.tokens}-{event.index - 1} were lost in transit")
        fresh = self._advance(event)
        if not fresh.token_ids and not fresh.text and not event.finished:
            return None
        if event.finished and event.usage and event.usage.get("completion_tokens") != self.tokens:
            raise DeliveryGap(f"{event.usage.get('completion_tokens')} tokens were generated, {self.tokens} arrived")
        return fresh

    def _failure(self, event: StreamEvent) -> StreamEvent:
        """A failure ends the request wherever it stands. The tokens it may carry (held back by a stream
        interval) pass the same check as a delta's: their new part if they continue what arrived, none
        if they would leave a hole (the error says the request is incomplete anyway)."""
        if not event.token_ids and not event.text:
            return event
        if self._continues(event):
            return self._advance(event)
        return replace(event, token_ids=[], text="", logprobs=None if event.logprobs is None else [])

    def _continues(self, event: StreamEvent) -> bool:
        return event.index <= self.tokens and event.text_offset <= self.chars

    def _advance(self, event: StreamEvent) -> StreamEvent:
        """`event` trimmed to what was not yet received, which now counts as received."""
        new_tokens = event.token_ids[self.tokens - event.index:]
        # a token's logprob record goes wherever its token goes
        new_logprobs = None if event.logprobs is None else event.logprobs[self.tokens - event.index:]
        new_text = event.text[self.chars - event.text_offset:]
        repeated = self.tokens > event.index  # its prompt logprobs, if any, arrived with its first part
        self.tokens += len(new_tokens)
        self.chars += len(new_text)
        return replace(event, index=self.tokens - len(new_tokens), token_ids=new_tokens, text=new_text,
                       text_offset=self.chars - len(new_text), logprobs=new_logprobs,
                       prompt_logprobs=None if repeated else event.prompt_logprobs)
