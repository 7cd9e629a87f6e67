"""A transactional test's flush that waits for a write still running on another thread of the test process.

The in-memory SQLite test database (shared cache) answers a second writer with "database table is
locked" at once, where a file database waits out its busy timeout and PostgreSQL waits for the lock.
Threads of the test process write to it on their own time: the ops recorder (workbench/ops/recorder.py,
when a poll brings new leak events or replay checks) and a reproducibility record's write after a
request's last frame (workbench/api/reproduce_records.py). One of them mid-write as a transactional test
ended made the flush fail, which left that test's rows behind, and the next test's setup then failed on
a unique user name. Wrapped here, the flush tries again for up to WAIT_S, as a file database would wait,
and then warns with where the test process's other threads were when it first met the lock, so the
writer is named.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

WAIT_S = 10.0
RETRY_EVERY_S = 0.05
LOCKED = ("database table is locked", "database is locked")
REPO = Path(__file__).resolve().parents[2]


def waiting_for_other_writers(flush: Callable, pause: Callable[[float], None] = time.sleep) -> Callable:
    """`flush` (TransactionTestCase._fixture_teardown) tried again while another connection holds a lock;
    `pause` waits between tries."""

    @functools.wraps(flush)
    def flush_when_free(self) -> None:
        started, threads = time.monotonic(), None
        while True:
            try:
                flush(self)
                break
            except Exception as exc:  # Django's flush command wraps the OperationalError in a CommandError
                if not _locked(exc) or time.monotonic() - started > WAIT_S:
                    raise
                threads = threads or where_threads_are()
            pause(RETRY_EVERY_S)
        if threads is not None:
            warnings.warn(f"the test database's flush waited {time.monotonic() - started:.2f} s for another "
                          f"writer; the other threads at first: {threads}", stacklevel=2)

    return flush_when_free


def _locked(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if any(text in str(exc) for text in LOCKED):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def where_threads_are() -> str:
    """Each other thread's name and its innermost frame in the project's own code (else its innermost)."""
    frames, places = sys._current_frames(), []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident) if thread is not threading.current_thread() else None
        if frame is None:
            continue
        innermost, own = frame, None
        while frame is not None and own is None:
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(REPO) and ".venv" not in path.parts:
                own = frame
            frame = frame.f_back
        shown = own or innermost
        places.append(f"{thread.name} at {Path(shown.f_code.co_filename).name}:{shown.f_lineno} ({shown.f_code.co_name})")
    return "; ".join(places) or "none"
