"""The engine's one reader of the process environment: every variable engine/ reads is named here.

`EngineConfig(...)` reads none of them, so the Python API behaves the same whoever calls it. Two kinds:
- the runtime flags (`ARC_*`), each an entry of the flag registry (engine/host/capabilities.py), read
  at a start by `EngineConfig.from_env` through `env_value` there;
- the build-time switches below, read where they act: they choose how the process is built (which CPU
  kernel path, whether the fused layer serves, where files are cached), not how a step runs, so
  nothing flips them while an engine runs.
Code elsewhere in engine/ calls `read` (tests/engine/test_environment.py checks that nothing else reads
os.environ), so this table is the whole list.
"""

from __future__ import annotations

import os

FLAG_PREFIX = "ARC_"  # the flag registry's names
SWITCHES = {
    "WORKBENCH_CPU_KERNEL": "the native CPU kernels' path: auto (default), scalar, avx2, avx512, amx; off: they are "
                            "not built and torch's kernels serve (engine/kernels/cpu)",
    "WORKBENCH_FUSED_LAYERS": "off: a quantized bfloat16 model on the CPU runs layer by layer instead of one "
                              "native call a layer (engine/model/fused_serving.py)",
    "WORKBENCH_MODEL_CACHE": "where packaged models are kept (engine/loading/packaged_models.py); default "
                             "$XDG_CACHE_HOME/workbench/models",
    "XDG_CACHE_HOME": "the user's cache directory (default ~/.cache), under which packaged models are kept",
    "TORCH_EXTENSIONS_DIR": "where the native CPU kernels are built (default ~/.cache/workbench/torch_extensions)",
    "CXX": "the C++ compiler that builds the native CPU kernels (default c++)",
    "PATH": "where the build looks for ninja and the compiler",
}


def read(name: str, default: str | None = None) -> str | None:
    """The variable `name`, or `default` where it is unset; KeyError for a name this module does not list."""
    if name not in SWITCHES and not name.startswith(FLAG_PREFIX):
        raise KeyError(f"{name} is not an environment variable the engine reads (engine/environment.py)")
    return os.environ.get(name, default)


def put_on_path(directory: str) -> None:
    """Puts `directory` first on PATH, for the tools the kernel build runs as subprocesses."""
    os.environ["PATH"] = f"{directory}{os.pathsep}{read('PATH', '')}"
