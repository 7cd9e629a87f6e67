"""Every engine of a test built the way `make run` serves a GGUF file on a CPU: quantized weights in
bfloat16, so the fused decoder layer on our native kernels (engine/model/fused_serving.py), whatever
EngineConfig the test writes. For the oracles that build many engines with their own configurations."""

from __future__ import annotations

import pytest

from engine import EngineConfig
from engine import engine as engine_module


def serve_as_make_run(monkeypatch: pytest.MonkeyPatch) -> None:
    load = engine_module.load_model

    def load_served(model, device="cpu", dtype="float32", weights="dequantized"):  # type: ignore[no-untyped-def]
        return load(model, device=device, dtype="bfloat16", weights="quantized")

    monkeypatch.setattr(EngineConfig, "weight_format", property(lambda self: "quantized"))
    monkeypatch.setattr(engine_module, "load_model", load_served)
