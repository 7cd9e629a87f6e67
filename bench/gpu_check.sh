#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (an H200 here), in at most 300 s of its own (a device call
# of 6 minutes leaves room for the machine's start and a second try within 15 minutes): the kernels
# compiled by NVRTC for sm_90, pytest's collection of the GPU tests, the GPU-marked tests (each CuPy kernel
# against its torch reference, CUDA graphs against eager, the engine on CUDA, the batched sampler against
# the per-row one and its one wait; the Triton paged decode attention against the torch path; GGUF Q4
# weights on torch's int4 kernel; the invariant GEMM; the batch-invariance oracle on CUDA), which decode
# attention runs and which SDPA kernel the torch path takes, the invariant GEMM against cuBLAS by row
# count, the 1B decode benchmark (speeds and launches per step), the int4 kernel against dequantize +
# F.linear by row count and, where the python has the web packages (or .whl/ holds them: bench/gpu_webdeps.py),
# the serving benchmark on CUDA (in-process).
# Uses the machine's own python3 with its CUDA torch and CuPy; needs nothing from the network. The GPU
# tests call the CuPy wrappers directly, so without CuPy they fail; they do not fall back.
# Prints one line per step: passed, failed (with the tail of its log) or skipped and why; the benchmarks'
# tables follow their lines. Without a GPU (a dry run) the GPU steps say skipped, and it ends in seconds.
# Each step has a cap (CAPS) and the caps add up to at most the budget, so every step gets its whole cap.
# Step logs are written as the step runs (python unbuffered, pytest through tee), so a step stopped at its
# cap keeps what it printed. They go to $GPU_CHECK_LOGS, else /tmp/gpu_check; where $OUT is set (the
# device machine brings it back, at most 8 files), after every step $OUT holds two files: gpu_check.txt
# (what this script printed) and gpu_check.tar.gz (every step's log, the benchmarks' tables among them).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# Nothing here runs on the native CPU kernels: never spend the budget compiling them.
export WORKBENCH_CPU_KERNEL=off
PY=${PYTHON:-python3}
LOGS=${GPU_CHECK_LOGS:-/tmp/gpu_check}
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log "$LOGS/.pytest.out"  # an earlier run's, which the tarball would carry as this one's
SUMMARY=${OUT:+$OUT/gpu_check.txt}
[ -n "$SUMMARY" ] && : >"$SUMMARY"
BUDGET=300  # seconds for the whole script
# Each step's cap in seconds, in the order the steps run.
CAPS="machine:15 wheels:25 nvrtc:20 collect:25 gpu-tests:90 decode-attention:15 gemm-bench:15 decode-bench:60 int4-bench:15 serving-bench:20"
failed=0
last=skipped  # how the last step went: passed, failed or skipped

# say TEXT: printed, and kept in $OUT's summary where there is one.
say() {
    printf '%s\n' "$*"
    [ -n "$SUMMARY" ] && printf '%s\n' "$*" >>"$SUMMARY"
    return 0
}

# Every log into one tarball under $OUT (written beside it, then renamed: a stop midway leaves the last whole one).
pack() {
    [ -n "${OUT:-}" ] || return 0
    tar -czf "$OUT/gpu_check.tar.gz.part" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" \
        && mv -f "$OUT/gpu_check.tar.gz.part" "$OUT/gpu_check.tar.gz"
}

cap() { local pair; for pair in $CAPS; do [ "${pair%%:*}" = "$1" ] && echo "${pair#*:}"; done; }
total=0
for pair in $CAPS; do total=$(( total + ${pair#*:} )); done
if (( total > BUDGET )); then
    say "gpu_check: the steps' caps add up to ${total}s, over the ${BUDGET}s budget"
    exit 2
fi
say "gpu_check: $(wc -w <<<"$CAPS") steps, caps adding up to ${total}s of a ${BUDGET}s budget; logs in $LOGS"

# step NAME COMMAND...: runs COMMAND with at most the step's cap (less if the budget is nearly spent).
step() {
    local name=$1 limit start=$SECONDS rc left
    shift
    limit=$(cap "$name")
    left=$(( BUDGET - SECONDS ))
    if (( left < 10 )); then
        say "step $name: skipped: ${left}s left of the ${BUDGET}s budget"; last=skipped; return 0
    fi
    (( limit > left )) && limit=$left
    # bash -c: steps may be functions. The log is written as the step prints.
    timeout --kill-after=5 "$limit" bash -c '"$@"' "$name" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    local took=$(( SECONDS - start ))
    if (( rc == 0 )) && grep -q "^SKIPPED_ALL" "$LOGS/$name.log"; then
        say "step $name: skipped: $(grep -m1 '^SKIPPED_ALL' "$LOGS/$name.log" | cut -d' ' -f2-)"; last=skipped
    elif (( rc == 0 )); then
        say "step $name: passed (${took}s)${DETAIL:+: $(paste -sd';' "$LOGS/$name.log" | sed 's/;/; /g')}"; last=passed
    else
        last=failed
        (( rc == 124 || rc == 137 )) && why="timed out after ${limit}s" || why="exit $rc"
        say "step $name: failed ($why, ${took}s; log $name.log in gpu_check.tar.gz)"
        say "$(tail -n 15 "$LOGS/$name.log" | sed 's/^/    /')"
        failed=1
    fi
    pack
}

skip() { say "step $1: skipped: $2"; }

# A passed step's whole log (the benchmarks' tables), indented under its line; a failed one showed its tail.
show() { [ "$last" = passed ] && say "$(sed 's/^/    /' "$LOGS/$1.log")"; return 0; }

# pytest that says SKIPPED_ALL <reason> when it ran nothing but skips (exit 0 either way).
# Its output reaches the step's log as it runs, through tee.
pytest_step() {
    "$PY" -m pytest -q -p no:cacheprovider -rs "$@" 2>&1 | tee "$LOGS/.pytest.out"
    local rc=${PIPESTATUS[0]}
    if (( rc == 0 )) && ! grep -qE "[0-9]+ passed" "$LOGS/.pytest.out"; then
        echo "SKIPPED_ALL $(grep -m1 -oE 'SKIPPED \[[0-9]+\] [^:]+:[0-9]+: .*' "$LOGS/.pytest.out" | sed -E 's/^SKIPPED \[[0-9]+\] [^:]+:[0-9]+: //')"
    fi
    return $rc
}

machine() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    "$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
    "$PY" -c "import cupy; print('cupy', cupy.__version__)" 2>/dev/null || echo "no cupy: the CuPy kernel tests will fail"
}
export PY LOGS
export -f machine pytest_step
DETAIL=1 step machine machine

# The web packages first: the serving benchmark needs them, and they must be in place before pytest runs.
if [ -d .whl ]; then
    step wheels "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
else
    skip wheels "no .whl/ carried (bench/gpu_webdeps.py fetches the web packages' wheels)"
fi

# Where the GPU-marked tests are (tests/test_gpu_check_script.py holds every one of them to this list): collected
# first, then run, so a module or conftest that cannot import here fails the cheap step, not the long one.
GPU_TESTS="tests/kernels tests/engine/test_gpu.py tests/engine/test_sampler_batched.py tests/engine/test_cuda_int4_gpu.py"
step nvrtc pytest_step tests/kernels/test_nvrtc.py
# shellcheck disable=SC2086  # GPU_TESTS is a list of paths
step collect "$PY" -m pytest -q -p no:cacheprovider --collect-only -m gpu $GPU_TESTS

if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    # shellcheck disable=SC2086
    step gpu-tests pytest_step -m gpu -s $GPU_TESTS
    # Which decode attention runs (the Triton paged kernel or the torch path), which SDPA kernel the torch
    # path takes, and both timed at the 1B shape.
    step decode-attention "$PY" bench/decode_attention.py --repeats 20
    show decode-attention
    # The float projections' GEMM: the invariant Triton kernel against cuBLAS at the 1B shapes, by row count.
    step gemm-bench "$PY" bench/gpu_gemm.py --rows 1,8,64,2048 --repeats 10
    show gemm-bench
    step decode-bench "$PY" bench/gpu_decode.py --repeats 1
    show decode-bench
    # GGUF Q4_0/Q4_1 weights kept 4-bit: the int4 kernel against dequantize + F.linear by row count (MAX_ROWS).
    if "$PY" -c "import gguf" 2>/dev/null; then
        step int4-bench "$PY" bench/cuda_int4.py --repeats 20
        show int4-bench
    else
        skip int4-bench "this python lacks the gguf package (carry .whl/ from bench/gpu_webdeps.py)"
    fi
    if "$PY" -c "import workbench.settings, django, channels, daphne, websockets, celery, channels_redis, whitenoise" 2>/dev/null; then
        step serving-bench "$PY" bench/serving.py --device cuda --transports inprocess
        show serving-bench
    else
        skip serving-bench "this python lacks the web packages (carry .whl/ from bench/gpu_webdeps.py)"
    fi
else
    why=$("$PY" -c "import torch" 2>/dev/null && echo "torch sees no CUDA device" || echo "$PY has no torch")
    skip gpu-tests "$why"
    skip decode-attention "$why"
    skip gemm-bench "$why"
    skip decode-bench "$why"
    skip int4-bench "$why"
    skip serving-bench "$why"
fi

say "gpu_check: $( ((failed)) && echo FAILED || echo ok ) in ${SECONDS}s"
pack
exit $failed
