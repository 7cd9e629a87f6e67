"""RuntimeFlags: an operator's flag changes, queued and applied by the engine between steps.

Every flag is an entry of engine/host/capabilities.py; a change to an unknown or start-only flag is
refused when it is asked for, not at the next step.
"""

from __future__ import annotations

from engine.decode.device_loop import DeviceLoop
from engine.decode.graphs import GraphMode
from engine.decode.runner import ModelRunner
from engine.host.capabilities import capability, checked_value
from engine.host.replay_audit import AuditSettings
from engine.scheduler import SchedulerBase


class RuntimeFlags:
    def __init__(self, device_loop: DeviceLoop, runner: ModelRunner, scheduler: SchedulerBase) -> None:
        self._device_loop = device_loop
        self._runner = runner
        self._scheduler = scheduler
        self._pending: dict[str, bool | int] = {}
        self.audit = AuditSettings()  # the replay audit's share, which the host's ReplayAudit reads

    def request(self, name: str, value: bool | int) -> None:
        entry = capability(name)
        if not entry.settable:
            why = entry.description
            if name == "ARC_CAPTURE_STREAM":  # say what capture actually is here, not what it could be
                mode, reason = self._runner.graphs.capture_state()
                why = f"capture here is {mode}: {reason}"
            raise ValueError(f"{name} is fixed at start; {why}")
        self._pending[name] = checked_value(name, value)

    def in_force(self) -> dict[str, bool | int]:
        graphs = self._runner.graphs
        return {"ARC_GRAPH_DEVICE_LOOP": self._device_loop.enabled,
                "ARC_DEVICE_LOOP_KILLED": self._device_loop.kill_switch.killed,
                "ARC_GRAPHS": self._runner.use_graphs, "ARC_CAPTURE_STREAM": graphs.mode is GraphMode.CUDA_GRAPHS,
                "ARC_GRAPH_VERIFY_REPLAYS": graphs.verify.every, "ARC_GRAPH_VERIFY_ALWAYS": graphs.verify.always,
                "ARC_LAYER_BISECT": graphs.verify.bisect, "ARC_PREFIX_CACHING": self._scheduler.prefix_caching,
                "ARC_TRITON_ATTENTION": self._runner.loaded.model.decode_attention == "triton",
                "ARC_INVARIANT_GEMM": self._runner.loaded.model.invariant_gemm,
                "ARC_REPLAY_AUDIT_PERMILLE": self.audit.permille}

    def apply(self) -> None:
        """At a step boundary: apply every change asked for since the last one, in order."""
        graphs = self._runner.graphs
        for name, value in self._pending.items():
            match name:
                case "ARC_GRAPH_DEVICE_LOOP":
                    self._device_loop.set_enabled(bool(value))
                case "ARC_DEVICE_LOOP_KILLED":
                    switch = self._device_loop.kill_switch
                    switch.kill("set by operator") if value else switch.rearm()
                case "ARC_GRAPHS":
                    self._runner.use_graphs = bool(value)
                case "ARC_GRAPH_VERIFY_REPLAYS":
                    graphs.set_verification(every=int(value))
                case "ARC_GRAPH_VERIFY_ALWAYS":
                    graphs.set_verification(always=bool(value))
                case "ARC_LAYER_BISECT":
                    graphs.set_verification(bisect=bool(value))
                case "ARC_PREFIX_CACHING":
                    self._scheduler.set_prefix_caching(bool(value))
                case "ARC_REPLAY_AUDIT_PERMILLE":
                    self.audit.permille = min(int(value), 1000)
        self._pending.clear()
