"""The registry of runtime flags: every `ARC_*` switch the engine reads, what reads it, and its status.

Each entry names the flag, the production symbol that reads it (`module:Class.attribute`), the part
of the engine it belongs to, and whether it is Live (production code reaches the symbol) or Dead
(retired: its symbol must be gone). `tests/engine/test_capabilities.py` is the ratchet: an `ARC_*`
name in the code without an entry, a Live entry whose symbol nothing reaches, and a Dead entry whose
symbol still exists all fail it. `EngineConfig.from_env` reads the flags that name a config field from
the environment at start (the serving layer and the command lines use it; `EngineConfig(...)` itself
reads nothing), and `Engine.set_flag` changes them between steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine import environment


@dataclass(frozen=True)
class Capability:
    name: str
    symbol: str
    parent: str
    status: Literal["Live", "Dead"]
    description: str
    # None: the device decides (EngineConfig says how): on CUDA on, elsewhere off.
    default: bool | int | None = False
    settable: bool = True  # an operator may change it at runtime
    kind: Literal["bool", "int"] = "bool"
    # The EngineConfig field that EngineConfig.from_env sets from this flag; None: not read at start.
    config_field: str | None = None


REGISTRY: tuple[Capability, ...] = (
    Capability("ARC_GRAPH_DEVICE_LOOP", "engine.decode.device_loop:DeviceLoop.enabled", "engine/decode/device_loop", "Live",
               "Decode eligible greedy batches in device bursts of K steps and park the tokens.",
               config_field="device_loop"),
    Capability("ARC_DEVICE_LOOP_KILLED", "engine.decode.device_loop:KillSwitch.killed", "engine/decode/device_loop", "Live",
               "Process-wide kill switch: set by a fault inside a burst; clearing it re-arms the loop."),
    Capability("ARC_GRAPHS", "engine.decode.runner:ModelRunner.use_graphs", "engine/decode/graphs", "Live",
               "Run decode steps as captured graphs per batch-size bucket (CPU: the replay backend). "
               "Unset: on on CUDA (every graph captured at start), off elsewhere.",
               default=None, config_field="graphs"),
    Capability("ARC_CAPTURE_STREAM", "engine.decode.graphs:GraphMode.CUDA_GRAPHS", "engine/decode/graphs", "Live",
               "On CUDA, capture real CUDA graphs on a dedicated capture stream; off: INERT (eager). Unset: "
               "on on CUDA.", default=None, settable=False, config_field="capture_stream"),
    Capability("ARC_GRAPH_VERIFY_REPLAYS", "engine.decode.graphs:VerifySettings.every", "engine/decode/graphs", "Live",
               "Verify every Nth graph replay against the eager forward (0: off).", default=0, kind="int",
               config_field="verify_replays"),
    Capability("ARC_GRAPH_VERIFY_ALWAYS", "engine.decode.graphs:VerifySettings.always", "engine/decode/graphs", "Live",
               "Verify every graph replay against the eager forward.", config_field="verify_always"),
    Capability("ARC_LAYER_BISECT", "engine.decode.graphs:VerifySettings.bisect", "engine/decode/graphs", "Live",
               "With verification, record per-layer checksums and name the first divergent layer.",
               config_field="layer_bisect"),
    Capability("ARC_TRITON_ATTENTION", "engine.model.attention:Attention.decode_backend",
               "engine/kernels/gpu/triton_paged_decode", "Live",
               "On CUDA, decode attention through the Triton paged kernel (the cache read in place) where "
               "triton imports; off: the torch path (blocks gathered, SDPA with a mask).", default=True,
               settable=False, config_field="triton_attention"),
    Capability("ARC_INVARIANT_GEMM", "engine.model.layers:Linear.invariant_gemm",
               "engine/kernels/gpu/triton_linear", "Live",
               "On CUDA, float projections through the Triton GEMM whose rows are the same bits at any batch "
               "where triton imports; off: F.linear (cuBLAS, whose choice of kernel follows the row count).",
               default=True, settable=False, config_field="invariant_gemm"),
    Capability("ARC_PREFIX_CACHING", "engine.scheduler.base:SchedulerBase.prefix_caching", "engine/scheduler/block_pool", "Live",
               "Reuse cached KV blocks of a prompt prefix computed before for the same cache scope (the user, "
               "unless widened); off forgets every cached prefix.", default=True, config_field="prefix_caching"),
    Capability("ARC_REPLAY_AUDIT_PERMILLE", "engine.host.replay_audit:AuditSettings.permille", "engine/host/replay_audit",
               "Live", "Per thousand finished requests, how many the replay audit re-runs alone while the engine "
               "is idle and compares bit for bit (1000: every one; 0: only those an operator picks).",
               default=10, kind="int", config_field="replay_audit_permille"),
)

BY_NAME = {capability.name: capability for capability in REGISTRY}


class UnknownFlag(KeyError):
    pass


def capability(name: object) -> Capability:
    """The registered flag called `name`; UnknownFlag for anything else (an operator's or a peer's input)."""
    entry = BY_NAME.get(name) if isinstance(name, str) else None
    if entry is None:
        raise UnknownFlag(f"unknown flag {name!r}; registered: {', '.join(BY_NAME)}")
    return entry


def env_value(name: str) -> bool | int | None:
    """A registered flag from the environment, by its kind: booleans are true for "1", "true", "yes",
    "on"; an integer flag that is not an integer is an error naming it. Unset: the flag's default."""
    entry = capability(name)
    raw = environment.read(name)
    if raw is None:
        return entry.default
    if entry.kind == "bool":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def checked_value(name: str, value: object) -> bool | int:
    """An operator's new value for a flag, refused (ValueError, UnknownFlag) unless it is of the flag's
    kind: true/false for a bool flag, a whole number >= 0 for an int flag. No coercion: "0" is not 0."""
    entry = capability(name)
    if entry.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{name} takes true or false, not {value!r}")
    elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} takes a whole number >= 0, not {value!r}")
    return value
