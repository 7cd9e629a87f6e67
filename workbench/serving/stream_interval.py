"""The stream interval and gap: how many tokens, and how much time, a request's deltas gather before
they are sent.

Every delta costs the server a wake-up, a JSON frame and a socket write (or a Redis message from a
Celery worker), and the client a read, whatever it carries. On a busy server that per-message cost,
not the tokens, is what serving spends. Two levers, which can be combined:

- the interval, N tokens: a request's deltas go out every N tokens, so N times fewer messages. The
  same lever as vLLM's and SGLang's `--stream-interval` (vllm-project/vllm#27869).
- the gap, G seconds: a request's deltas go out at most once every G, carrying every token made
  since. A reader cannot see the difference between a token every 2 ms and ten tokens every 20 ms,
  but the server sends a tenth of the messages; and where a step takes longer than G (a big model, a
  slow device) every token still goes out as it comes, so it costs nothing where there is nothing to
  save.

The first tokens of a request always go at once (time to first token is untouched), and so does its
last event (finish, cancel, error), which carries whatever was held. Interval 1 and gap 0 send every
step's tokens as they come.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from workbench.serving.streams import StreamEvent


class DeltaHold:
    """Per request, the deltas not yet sent; used on the engine thread only."""

    def __init__(self, interval: int = 1, gap_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"the stream interval must be a whole number of tokens, at least 1, not {interval!r}")
        if isinstance(gap_s, bool) or not isinstance(gap_s, (int, float)) or not 0 <= gap_s < math.inf:
            raise ValueError(f"the stream gap must be a number of seconds, 0 or more, not {gap_s!r}")
        self.interval, self.gap_s, self._clock = interval, gap_s, clock
        self._held: dict[str, StreamEvent] = {}
        self._sent_at: dict[str, float] = {}  # request id -> when its last delta went out

    def release(self, request_id: str, event: StreamEvent) -> StreamEvent | None:
        """The event to send now for this request (with what was held merged in front), or None to hold."""
        if self.interval == 1 and not self.gap_s:
            return event  # the default holds nothing: no bookkeeping per token on the engine thread
        held = self._held.pop(request_id, None)
        if held is not None:
            held.merge(event)
            event = held
        if event.finished:
            self._sent_at.pop(request_id, None)
            return event
        now = self._clock()
        # index 0: nothing of this request has been sent yet, so its first tokens go out at once.
        if event.index == 0 or self._due(request_id, event, now):
            self._sent_at[request_id] = now
            return event
        self._held[request_id] = event
        return None

    def due(self) -> list[tuple[str, StreamEvent]]:
        """Held deltas whose gap has passed though no new token of theirs came (the scheduler left the
        request waiting): taken out, to be sent now. Called once per engine step."""
        if not self._held or not self.gap_s:
            return []
        now = self._clock()
        ready = [(rid, event) for rid, event in self._held.items() if self._due(rid, event, now)]
        for request_id, _ in ready:
            del self._held[request_id]
            self._sent_at[request_id] = now
        return ready

    def flush(self, request_id: str) -> StreamEvent | None:
        """What is held for a request that ends without a last event of its own (an engine failure)."""
        self._sent_at.pop(request_id, None)
        return self._held.pop(request_id, None)

    def _due(self, request_id: str, event: StreamEvent, now: float) -> bool:
        return (len(event.token_ids) >= self.interval
                and now - self._sent_at.get(request_id, -math.inf) >= self.gap_s)
