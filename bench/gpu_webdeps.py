"""Fetch, here, the wheels the serving benchmark needs on the GPU machine, into .whl/.

The GPU machine's python (3.12, /opt/torch/.venv) has PyTorch but not the web packages, and it reaches
no registry; bench/gpu_check.sh installs whatever .whl/ holds into /tmp/site before the serving
benchmark when .whl is carried. Run with this checkout's venv, whose installed versions it copies:

    .venv/bin/python bench/gpu_webdeps.py      # then: run(carry=[".whl"], command="bash bench/gpu_check.sh")

What it fetches: the project's runtime dependencies (pyproject.toml), read there so that a package the
code starts to import cannot be forgotten here, and the websocket client the benchmark drives, each with
what it requires, less what the image has. tests/test_gpu_webdeps.py imports and migrates the web
application with only the image's packages and these.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# The serving benchmark's websocket client (the `test` extra), beside the runtime dependencies.
BENCHMARK_CLIENT = ["websockets"]
# PostgreSQL's driver: Django imports it only for a postgres DATABASE_URL, and the GPU check serves
# from SQLite; its binary wheel would be the largest thing carried.
LEFT_OUT = {"psycopg", "psycopg-binary"}
# The GPU machine image's packages (shared/gpu/image-packages.txt as read on 2026-11-17; torch 2.11
# for CUDA 13, cupy-cuda13x 14): its versions serve, with the dependencies it brings for them.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash
yarl zipp
""".split())
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_24_x86_64"]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def roots() -> list[Requirement]:
    """The project's runtime dependencies and the benchmark's client, as requirements (extras kept)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(line) for line in [*project["dependencies"], *BENCHMARK_CLIENT]]


def closure() -> dict[str, str]:
    """Every distribution the roots need beyond the image, name -> the version installed here. An image
    package is not walked into: the image's version comes with what it needs."""
    found: dict[str, str] = {}
    todo = [(requirement.name, set(requirement.extras)) for requirement in roots()]
    while todo:
        name, extras = todo.pop()
        key = normalized(name)
        if key in found or key in IMAGE_PACKAGES or key in LEFT_OUT:
            continue
        dist = metadata.distribution(key)
        found[key] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras or {""}):
                todo.append((requirement.name, set(requirement.extras)))
    return found


def main() -> int:
    wanted = closure()
    target = ROOT / ".whl"  # ignored by git (.gitignore): it travels only when carried
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "-d", str(target)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    result = subprocess.run(command + [f"{name}=={version}" for name, version in sorted(wanted.items())])
    size = sum(f.stat().st_size for f in target.glob("*.whl")) / 2**20 if target.exists() else 0
    print(f"{len(wanted)} packages wanted, {len(list(target.glob('*.whl')))} wheels in {target} ({size:.1f} MiB)")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
