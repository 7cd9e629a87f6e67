"""The stream interval: how many tokens a request's deltas gather before they are sent.

Every delta costs the server a wake-up, a JSON frame and a socket write (or a Redis message from a
Celery worker), and the client a read, whatever it carries. On a busy server that per-message cost,
not the tokens, is what serving spends: with the interval at N a request's deltas go out every N
tokens, so N times fewer messages. The first tokens of a request always go at once (time to first
token is untouched), and so does its last event (finish, cancel, error), which carries whatever was
held. The same lever as vLLM's and SGLang's `--stream-interval` (vllm-project/vllm#27869); the default,
1, sends every step's tokens as they come.
"""

from __future__ import annotations

from workbench.serving.streams import StreamEvent


class DeltaHold:
    """Per request, the deltas not yet sent; used on the engine thread only."""

    def __init__(self, interval: int) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"the stream interval must be a whole number of tokens, at least 1, not {interval!r}")
        self.interval = interval
        self._held: dict[str, StreamEvent] = {}

    def release(self, request_id: str, event: StreamEvent) -> StreamEvent | None:
        """The event to send now for this request (with what was held merged in front), or None to hold."""
        if self.interval == 1:
            return event  # the default holds nothing: no bookkeeping per token on the engine thread
        held = self._held.pop(request_id, None)
        if held is not None:
            held.merge(event)
            event = held
        # index 0: nothing of this request has been sent yet, so its first tokens go out at once.
        if event.finished or event.index == 0 or len(event.token_ids) >= self.interval:
            return event
        self._held[request_id] = event
        return None

    def flush(self, request_id: str) -> StreamEvent | None:
        """What is held for a request that ends without a last event of its own (an engine failure)."""
        return self._held.pop(request_id, None)
