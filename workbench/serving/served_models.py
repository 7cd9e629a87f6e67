"""Which models the deployment serves now, and the one a request asks for.

A web process serves what its transport reaches: the in-process engine's one model, or every model some
live Celery worker has loaded (each worker reports its WORKBENCH_MODEL in its heartbeat; workers may host
different ones). A request names a model (the OpenAI `model` field, the chat page's selector, the
websocket API's `model`) or leaves it out for the default: this process's WORKBENCH_MODEL where some
worker serves it, else the first served name, so a deployment whose workers all run another model still
answers. A name nobody serves is refused as OpenAI refuses an unknown model (404 model_not_found),
except WORKBENCH_MODEL itself, which is the deployment's own: with no worker of it live the request
fails as `unavailable` (503), as it did before there were several models.

A served model's tokenizer is read here, on the first request that names it; where this process cannot
read it (its files are not where the workers' WORKBENCH_MODEL names them) every API refuses the request
with the same message, as `unavailable`.
"""

from __future__ import annotations

from django.conf import settings

from engine.loading.tokenizer import Tokenizer
from workbench.serving import bridge, model_facts
from workbench.serving.transport import Transport


class UnknownModel(Exception):
    """The request names a model no live worker serves (or names it with something not a string)."""

    def __init__(self, message: str, not_a_string: bool = False) -> None:
        super().__init__(message)
        self.message, self.not_a_string = message, not_a_string


class TokenizerUnreadable(Exception):
    """This process cannot read the tokenizer (or the config) of a model it routes requests to."""

    def __init__(self, model: str, cause: Exception, part: str = "tokenizer") -> None:
        self.message = f"this server cannot read the {part} of {model!r}: {type(cause).__name__}: {cause}"
        super().__init__(self.message)


def tokenizer_of(transport: Transport, model: str) -> Tokenizer:
    """The tokenizer of a served model (read once per process: a few milliseconds), or TokenizerUnreadable."""
    try:
        return transport.tokenizer_for(model)
    except Exception as exc:
        raise TokenizerUnreadable(model, exc) from None


def vocabulary_of(model: str) -> int:
    """The vocabulary size of a served model (workbench/serving/model_facts.py), or TokenizerUnreadable
    where this process cannot read its config."""
    try:
        return model_facts.vocabulary_size(model)
    except Exception as exc:
        raise TokenizerUnreadable(model, exc, "config") from None


def served() -> list[str]:
    """The models requests can be routed to now, in a stable order. The in-process transport's is its
    configured one, known without loading it (a page or /v1/models must not wait for a model load)."""
    return [settings.WORKBENCH_MODEL] if _engine_not_started() else bridge.transport().models()


def default(names: list[str]) -> str:
    """The model a request that names none gets (WORKBENCH_MODEL when nothing is served: the request then
    fails as unavailable, as before there were several models)."""
    return settings.WORKBENCH_MODEL if settings.WORKBENCH_MODEL in names or not names else names[0]


def resolve(asked: object, names: list[str]) -> str:
    """The served model `asked` names (None or "": the default), or UnknownModel saying what is served.
    WORKBENCH_MODEL is always accepted: the request then waits on no worker but fails as unavailable."""
    if asked is None or asked == "":
        return default(names)
    if not isinstance(asked, str):
        raise UnknownModel("model must be a string", not_a_string=True)
    # The configured default is never "unknown": with its workers all away for a moment (restarting,
    # draining) a request for it is `unavailable` (503, which clients retry), not 404.
    if asked not in names and asked != settings.WORKBENCH_MODEL:
        listed = ", ".join(repr(name) for name in names) or "none right now"
        raise UnknownModel(f"the model {asked!r} does not exist here; this server serves {listed} (GET /v1/models)")
    return asked


async def served_from_loop() -> list[str]:
    """served(), from an event loop: starting the Celery link blocks, so that on a thread."""
    return [settings.WORKBENCH_MODEL] if _engine_not_started() else (await bridge.transport_from_loop()).models()


def _engine_not_started() -> bool:
    """The in-process engine has not been started yet: its one model is the configured one."""
    return settings.WORKBENCH_TRANSPORT != "celery" and bridge.running() is None
