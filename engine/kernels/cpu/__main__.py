"""`python -m engine.kernels.cpu`: build (or find built) the native CPU kernels now and say how long it took, so
that `make run`'s first model load does not pay for the compile. Where they cannot be built, the one
log line says why (the engine then uses torch)."""

import sys
import time

from engine.kernels.cpu import build

started = time.monotonic()
if build.ensure_loaded():
    print(f"native CPU kernels ready in {time.monotonic() - started:.1f} s ({build.build_directory()})")
sys.exit(0)
