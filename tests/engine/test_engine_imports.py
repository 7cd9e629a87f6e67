"""What a CPU engine process imports: neither torch._dynamo (1.7 s of a process's start here, through
torch.nn.attention.bias) nor triton, nor torch's symbolic shapes (a third of a second, through empty_like of
a meta tensor in Module.to_empty). Every Celery worker, CLI run and engine subprocess of the suite starts
an engine; the code that needs one of them imports it where it is used (a prefill after cached keys on the
torch path, the Triton kernels on CUDA)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch._dynamo", "triton", "torch.fx.experimental.symbolic_shapes")

SCRIPT = f"""
import json, sys
from engine import Engine, EngineConfig, SamplingParams
engine = Engine(EngineConfig(model="demo"))
# Greedy, and the second prompt starts with the first: a prefix-cache hit served on the native path.
engine.generate(["hello there, how are you", "hello there, how are you today"],
                SamplingParams(max_tokens=4, temperature=0))
served = [name for name in {HEAVY!r} if name in sys.modules]
import torch.nn.attention.bias  # the control: the module the torch path's prefill imports
print(json.dumps({{"served": served, "control": [name for name in {HEAVY!r} if name in sys.modules]}}))
"""


def test_a_cpu_engine_serves_without_importing_dynamo_triton_or_symbolic_shapes(native_cpu_kernels):
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    imported = json.loads(run.stdout.splitlines()[-1])
    assert imported["served"] == [], imported
    installed = [name for name in HEAVY if name != "triton" or importlib.util.find_spec("triton") is not None]
    assert imported["control"] == installed, "liveness: the check sees the imports it guards against"
