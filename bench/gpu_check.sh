#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (an H200 here): the GPU-marked tests (kernels against
# their references, CUDA graphs against eager, the engine on CUDA) and the 1B decode benchmark.
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

echo "== exit: tests $tests, bench $bench"
exit $(( tests != 0 || bench != 0 ))
