"""py-spy's raw (folded) stacks of our server, sorted into where its threads' time went.

`py-spy record -f raw --threads --idle` writes one line per distinct stack: the thread
(`thread (TID): NAME`), then the Python frames root first (`function (path:line)`), then how many samples
had it. Every thread is sampled at every tick, idle ones too, so a thread's samples are its wall time
and a category's share of them is a share of that thread's time. The raw format carries no thread
state, so a thread counts as idle where its innermost frame is a known wait (the event loop's select, a
condition or queue wait, an executor worker with no work item). A thread waiting for the GIL shows the
frame it waits in and counts as that work: py-spy's `--gil` would keep only the samples of the thread
holding it, and so lose the web side's idle time, the figure that says whether it bounds the server.

Pure: `profile_of` reads the text and `format_table` writes the table; bench/busy_server.py runs py-spy.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

THREAD = re.compile(r"thread \((?:0x)?[0-9a-fA-F]+\)(?:: (?P<name>.*))?")  # a thread py-spy saw start has no name
FRAME = re.compile(r"(?P<function>.*) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)")

# Thread groups, by the names our server gives its threads (threading's names, as py-spy reports them).
GROUPS = (("engine", re.compile(r"engine$")), ("event loop", re.compile(r"MainThread$")),
          ("sampling draws", re.compile(r"sampling-draws")),
          ("sync threads", re.compile(r"asyncio_|ThreadPoolExecutor-")))
OTHER_GROUP = "other threads"

# The engine thread's categories, by the first rule that a frame of the stack meets, in this order: the
# sampler waits on its draw workers inside sample(), so that wait is sampling, not idleness.
ENGINE_RULES = (("sampling", ("engine/sampler.py", "engine/sampling_draws.py")),
                ("detokenizing", ("engine/detokenizer.py",)),
                ("forward", ("engine/model/", "engine/kernels/", "engine/decode/")),
                ("scheduling", ("engine/scheduler/",)),
                ("publishing", ("engine/host/", "workbench/serving/")))
ENGINE_CATEGORIES = (*(name for name, _ in ENGINE_RULES), "other", "idle")
# The web side: the application's work (Django, Channels, ours, JSON, SSE) over the transport's writes.
WEB_RULES = (("application", ("django/", "channels/", "asgiref/", "workbench/", "json/")),
             ("transport", ("twisted/", "daphne/", "autobahn/")))
WEB_CATEGORIES = ("application", "transport", "other", "idle")
BUSY_CATEGORIES = ("busy", "idle")
# Frames under every stack of a thread, which say nothing of its work: the server's main, and the engine
# thread's loop and step (the engine's own frames say what the step did).
BASE_FRAMES = {("workbench/serve.py", "<module>"), ("workbench/serve.py", "main"),
               ("workbench/serve.py", "main.<locals>.ClosingServer.run"),
               ("workbench/serving/engine_host.py", "EngineHost._run"),
               ("workbench/serving/engine_host.py", "EngineHost._step")}
# Waits that mean "nothing to do": (function, path) of the innermost frame.
IDLE_LEAVES = {("EpollSelector.select", "selectors.py"), ("PollSelector.select", "selectors.py"),
               ("SelectSelector.select", "selectors.py"), ("Condition.wait", "threading.py"),
               ("Event.wait", "threading.py"), ("Queue.get", "queue.py"),
               ("_worker", "concurrent/futures/thread.py")}  # an executor worker's SimpleQueue.get is native


@dataclass(frozen=True)
class Frame:
    function: str
    path: str


@dataclass
class Profile:
    """Samples per (thread group, category), each group's samples and threads, and the seconds sampled."""

    seconds: float
    samples: Counter[tuple[str, str]] = field(default_factory=Counter)
    group_samples: Counter[str] = field(default_factory=Counter)
    threads: dict[str, set[str]] = field(default_factory=dict)

    def share(self, group: str, category: str) -> float:
        total = self.group_samples[group]
        return self.samples[group, category] / total if total else float("nan")


def categories(group: str) -> tuple[str, ...]:
    return {"engine": ENGINE_CATEGORIES, "event loop": WEB_CATEGORIES}.get(group, BUSY_CATEGORIES)


def profile_of(raw: str, seconds: float) -> Profile:
    """The profile of py-spy's raw output `raw`, sampled over `seconds`."""
    profile = Profile(seconds)
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        thread, *rest = stack.split(";")
        match = THREAD.fullmatch(thread)
        if match is None:
            raise ValueError(f"not a --threads stack (its first frame names no thread): {line[:200]!r}")
        frames = [_frame(text) for text in rest]
        group = next((g for g, name in GROUPS if name.search(match["name"] or "")), OTHER_GROUP)
        profile.samples[group, category(group, frames)] += int(count)
        profile.group_samples[group] += int(count)
        profile.threads.setdefault(group, set()).add(thread)
    return profile


def category(group: str, frames: list[Frame]) -> str:
    """Where a stack of `group`'s thread was (frames root first)."""
    rules = {"engine": ENGINE_RULES, "event loop": WEB_RULES}.get(group)
    if group == "event loop":  # what the loop ran: Daphne and twisted's reactor are under every stack
        loops = [i for i, frame in enumerate(frames) if frame.function == "BaseEventLoop._run_once"]
        frames = frames[loops[-1]:] if loops else frames
    if rules is None:
        return "idle" if _idle(frames) else "busy"
    for name, marks in rules:
        if any(_meets(frame, marks) for frame in frames):
            return name
    return "idle" if _idle(frames) else "other"


def _frame(text: str) -> Frame:
    match = FRAME.fullmatch(text)
    return Frame(match["function"], match["path"]) if match else Frame(text, "")


def _meets(frame: Frame, marks: tuple[str, ...]) -> bool:
    return (frame.path, frame.function) not in BASE_FRAMES and any(
        frame.path.startswith(mark) or frame.function == mark for mark in marks)


def _idle(frames: list[Frame]) -> bool:
    return not frames or (frames[-1].function, frames[-1].path) in IDLE_LEAVES


def format_table(profiles: dict[int, Profile]) -> str:
    """Each thread group's categories as shares of its samples, one column per client count."""
    counts = sorted(profiles)
    lines = [f"{'share of the thread group' + chr(39) + 's samples':<40}"
             + "".join(f"{f'{c} clients':>12}" for c in counts)]
    groups = [g for g, _ in GROUPS] + [OTHER_GROUP]
    for group in groups:
        if not any(profiles[c].group_samples[group] for c in counts):
            continue
        threads = "/".join(str(len(profiles[c].threads.get(group, ()))) for c in counts)
        lines.append(f"{group} ({threads} threads)")
        for name in categories(group):
            cells = "".join(f"{profiles[c].share(group, name):>12.0%}" if profiles[c].group_samples[group]
                            else f"{'-':>12}" for c in counts)  # no such thread at that count
            lines.append(f"  {name:<38}{cells}")
    return "\n".join(lines)
