#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (an H200 here): the GPU-marked tests (kernels against
# their references, CUDA graphs against eager, the engine on CUDA), the 1B decode benchmark and, where
# the python has the web packages, the serving benchmark on CUDA (in-process; issue 5's goals were set
# for this: on the 2-core CPU machines the engine's step alone outlasts the TTFT budget).
# Uses the machine's own python3 with its CUDA torch and CuPy; needs nothing from the network.
# Finishes in well under 8 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
"$PY" -c "import cupy; print('cupy', cupy.__version__)" || echo "cupy missing: kernel tests will use the torch references"

echo "== GPU-marked tests"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu -s tests/kernels tests/engine/test_gpu.py
tests=$?

echo "== 1B decode benchmark (eager vs graphs vs graphs + device loop)"
timeout 240 "$PY" bench/gpu_decode.py
bench=$?

echo "== serving over the websocket API, engine on CUDA, beside the engine alone (bench/serving.py)"
if "$PY" -c "import django, channels, daphne, websockets, celery, channels_redis, whitenoise" 2>/dev/null; then
    timeout 240 "$PY" bench/serving.py --device cuda --transports inprocess --rounds 2
    serving=$?
else
    echo "skipped: this python lacks the web packages (pyproject.toml: the dependencies and websockets)"
    serving=0
fi

echo "== exit: tests $tests, bench $bench, serving $serving"
exit $(( tests != 0 || bench != 0 || serving != 0 ))
