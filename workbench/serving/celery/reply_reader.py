"""The Celery transport's reply channel read for as long as the link loop runs: the workers' deltas
relayed to their requests' streams (PendingRequests), flag answers to the fan-out that awaits them,
operators' cancels' answers to OperatorCancels.

A message holds a worker's step for many requests, a batch several steps: what one read brings is
delivered to the consumers' loop with one wake-up.
"""

from __future__ import annotations

import asyncio
import logging

from workbench.serving.celery import wire
from workbench.serving.celery.flag_fanout import FlagFanout
from workbench.serving.celery.operator_cancels import OperatorCancels
from workbench.serving.celery.pending import PendingRequests
from workbench.serving.celery.redis_layer import OneTripChannelLayer
from workbench.serving.streams import RequestStream, StreamEvent, deliver

log = logging.getLogger(__name__)


async def read_replies_forever(layer: OneTripChannelLayer, reply_channel: str, pending: PendingRequests,
                               flags: FlagFanout, cancels: OperatorCancels) -> None:
    while True:
        try:
            messages = await layer.receive_batch(reply_channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("reply channel: %s: %s; retrying", type(exc).__name__, exc)
            await asyncio.sleep(0.5)
            continue
        deliveries: list[tuple[RequestStream, StreamEvent]] = []
        for message in messages:
            try:
                if message.get("type") == wire.FLAG_DONE:
                    flags.answered(message)
                    continue
                if message.get("type") == wire.CANCEL_DONE:
                    cancels.answered(message)
                    continue
                relayed = (pending.relay(wire_id, event) for wire_id, event in wire.events_of(message))
                deliveries += filter(None, relayed)
            except Exception:  # a garbled message (a worker of another version?) must not end every stream here
                log.exception("unreadable message on the reply channel; requests it carried end with an error "
                              "(delivery_gap at their next delta, or worker_lost)")
        deliver(deliveries)
