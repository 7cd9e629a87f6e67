"""Transport: what the web side (consumers, views, the ops app) may ask of the serving layer.

Two classes implement it: InProcessTransport (workbench/serving/inprocess.py, the engine on a thread of
this process) and CeleryTransport (workbench/serving/celery/transport.py, GPU workers over Redis). The
bridge (bridge.py) hands out one of them typed as this protocol, so a type checker holds both to it
and a consumer cannot reach past it. Operators' calls name workers: the in-process transport has one,
LOCAL_WORKER; the Celery transport's are its live workers' ids.
"""

from __future__ import annotations

from typing import Callable, NotRequired, Protocol, TypedDict, runtime_checkable

from engine import SamplingParams
from engine.loading.tokenizer import Tokenizer
from workbench.serving.metrics import MetricsSnapshot
from workbench.serving.streams import RequestStream

# A flag change is in force after the engine's next step boundary: milliseconds, unless it is stuck.
FLAG_ANSWER_S = 10.0
# An operator's cancel is answered by the engine that holds the request, at its next step boundary, as a
# flag change is. The dashboard showed the request as of its worker's last step or heartbeat, so the
# request may have ended since: the operator (and the audit log) hears which.
CANCEL_ANSWER_S = FLAG_ANSWER_S
NOT_HELD = "no such request on this worker (it may have just finished)"
FINISHED_FIRST = "it had already finished when the cancel reached the engine: nothing was canceled"

Flags = dict[str, bool | int]  # the runtime flags in force on one worker, by name (engine/host/capabilities.py)


class EngineState(TypedDict, total=False):
    """An engine's inspection for the operator dashboard: engine/host/inspection.py's engine_state (every
    key but `error`), or only `error` when taking it failed, or empty before the first. JSON-ready; the
    page and the ops app (recorder.py, request_cancels.py) read it."""
    device_loop: dict[str, object]  # enabled, engaged, killed and why, generation, bursts, resets, parked
    parked_slots: list[dict[str, object]]  # per decode row: its owner, tokens parked, whether the owner lives
    capture: dict[str, object]  # graph capture's mode and reason, replays
    sequences: list[dict[str, object]] | None  # the live sequences; None while no dashboard watches a worker
    sequence_count: int
    leak_events: list[dict[str, object]]  # the latest, each with its `number`
    prefix_cache: dict[str, object]  # enabled, scope, usage, queries, hits, hit_rate
    replay_checks: list[dict[str, object]]  # the latest and the divergent replay verifications, each with `replay`
    route: dict[str, object]  # the arithmetic route, whether it is bit-invariant, the weights' SHA-256
    error: str


class FlagAnswer(TypedDict, total=False):
    """One worker's answer to a flag change: the flags in force after it, or why it did not apply."""
    in_force: Flags | None
    error: str


class WorkerView(TypedDict):
    """The operator dashboard's view of one worker (the page and the event recorder read it)."""
    device: str
    model: str
    engine_run: str  # the engine's start, as its records in the database name it
    running: int
    waiting: int
    draining: bool
    flags: Flags
    state: EngineState
    heartbeat_age_s: NotRequired[int]  # a Celery worker's, whole seconds since its last heartbeat


@runtime_checkable
class Transport(Protocol):
    @property
    def tokenizer(self) -> Tokenizer:
        """The default model's tokenizer (WORKBENCH_MODEL), for chat templates and prompt fitting on the web side."""
        ...

    def tokenizer_for(self, model: str) -> Tokenizer:
        """The tokenizer of `model`, one of models() (workers may host different models)."""
        ...

    def models(self) -> list[str]:
        """The models a request can be routed to now, sorted: the in-process engine's one, or each model
        some live, undrained Celery worker has loaded (workbench/serving/served_models.py)."""
        ...

    def start(self) -> None:
        """Blocks until it serves (the in-process engine loaded, or the Celery link open)."""
        ...

    def stop(self) -> None: ...

    def submit(self, request_id: str, prompt: str | list[int], params: SamplingParams,
               user: str = "", model: str = "") -> RequestStream:
        """From an event loop: the request's outputs arrive on the returned stream, in that loop.
        `user` names whom it serves, for the operator dashboard; `model` the model that must run it
        ("": WORKBENCH_MODEL), which only a worker that has it loaded gets; none: an `unavailable` error."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a submitted request; its stream ends with finish_reason "canceled" (or whatever came first)."""
        ...

    async def cancel_as_operator(self, worker: str, request_id: str) -> str | None:
        """An operator's cancel of any request a worker holds, by the ids the dashboard shows (the
        engine's request id on that worker): None once the engine has canceled it, else why not ("no such
        worker", NOT_HELD, FINISHED_FIRST, ...). The request ends canceled, as if its client had asked."""
        ...

    async def audit_as_operator(self, worker: str, request_id: str) -> str | None:
        """An operator's pick of a request a worker holds for the replay audit, by the ids the dashboard
        shows: re-run alone once it has finished and compared bit for bit with its record. None once
        asked, else why not ("no such worker", NOT_HELD, ...). A request that finished meanwhile is
        audited all the same (ReplayAudit.pick), so this one is not confirmed by the engine."""
        ...

    def running_request_ids(self) -> set[str]:
        """The requests the engines hold now (this process's by their request id)."""
        ...

    def answering(self) -> bool:
        """Whether an engine takes requests now, read without waiting (GET /health): the in-process
        engine loaded and its thread running; for Celery, a live worker that is not draining."""
        ...

    async def change_flag(self, name: str, value: bool | int,
                          workers: list[str] | None = None) -> dict[str, FlagAnswer]:
        """Change a runtime flag on `workers` (None: every one); each one's answer by worker id."""
        ...

    def flags_in_force(self) -> dict[str, Flags]: ...

    def metrics_by_worker(self) -> dict[str, MetricsSnapshot]: ...

    def watch_state(self) -> Callable[[], None]:
        """A dashboard opens: the workers' views carry their sequence lists until the returned unwatch."""
        ...

    def workers_view(self) -> dict[str, WorkerView]: ...
