#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (an H200 here): the GPU-marked tests (kernels against
# their references, CUDA graphs against eager, the engine on CUDA), the 1B decode benchmark and, where
# the python has the web packages (or .whl/ holds them: bench/gpu_webdeps.py), the serving benchmark on
# CUDA (in-process; issue 5's goals were set for this: on the 2-core CPU machines the engine's step
# alone outlasts the TTFT budget).
# Uses the machine's own python3 with its CUDA torch and CuPy; needs nothing from the network.
# Each step is bounded (240 + 240 + 90 s, and the wheels' install): run it with the 10-minute limit. Never run yet on a GPU.
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
if [ -d .whl ]; then  # the web packages as wheels, fetched beforehand by bench/gpu_webdeps.py and carried
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
if "$PY" -c "import django, channels, daphne, websockets, celery, channels_redis, whitenoise" 2>/dev/null; then
    timeout 90 "$PY" bench/serving.py --device cuda --transports inprocess
    serving=$?
else
    echo "skipped: this python lacks the web packages: run bench/gpu_webdeps.py where pip works, carry .whl"
    serving=0
fi

echo "== exit: tests $tests, bench $bench, serving $serving"
exit $(( tests != 0 || bench != 0 || serving != 0 ))
