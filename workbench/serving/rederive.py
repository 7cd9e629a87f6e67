"""Re-deriving a stored reply from its reproducibility record, for its own user (the chat's "reproduce"
and POST /v1/reproduce/{id}).

The recorded prompt token ids run with the recorded sampling parameters (seed included) through the
ordinary serving path, under the user's limits and prefix-cache scope, like any request of theirs: on a
bit-invariant route whatever else runs beside it cannot change a bit, so this is the claim checked where
the user can see it. The answer says "identical", or where the two first part and what each has there;
on a route that promises no bits (a GPU, torch's kernels) it also gives the logprob distance.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from engine.reproduce import ReproRecord, compare
from workbench.serving import bridge, limits, served_models


class RederiveFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


async def rederive(user: str, stored: dict[str, Any], model: str) -> dict[str, Any]:
    """Runs the record `stored` (ReproRecord.as_dict()) again for `user` on `model`; limits.Refused when
    the user's limits say no, RederiveFailed when the re-run fails."""
    try:
        recorded = ReproRecord.from_dict(stored)
        params = recorded.sampling_params()
    except (TypeError, ValueError, KeyError):  # a record kept by a version whose fields differ
        raise RederiveFailed("no_record", "this record was kept by another version of the server and cannot be "
                                          "run again") from None
    transport = await bridge.transport_from_loop()
    admission = limits.admit(user)
    request_id = f"reproduce-{uuid.uuid4().hex}"
    stream = admission.submit(transport, request_id, recorded.prompt_ids, params, model, keep_record=False)
    last = None
    try:
        async for event in stream:
            last = event
    finally:
        if last is None or not last.finished:  # the client went away: the re-run stops with it
            transport.cancel(request_id)
    if last is None or last.reproduce is None:
        code = (last.error_code if last else None) or "engine_error"
        raise RederiveFailed(code, (last.error if last else None) or "the re-run did not run to its end")
    rerun = ReproRecord.from_dict(last.reproduce)
    result = compare(recorded, rerun)
    tokenizer = await asyncio.to_thread(served_models.tokenizer_of, transport, model)  # read once per model

    def shown(token: int | None) -> dict[str, Any] | None:
        return None if token is None else {"id": token, "text": tokenizer.decode([token], skip_special_tokens=False)}

    return {"identical": result.identical,
            "first_difference": None if result.identical else {
                "index": result.index, "recorded": shown(result.recorded_token),
                "reproduced": shown(result.rerun_token)},
            "distance": result.distance, "same_model": recorded.identity == rerun.identity,
            "route": rerun.identity.route, "invariant": rerun.identity.invariant,
            "recorded_digest": recorded.digest, "reproduced_digest": rerun.digest}
