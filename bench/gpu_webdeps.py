"""Fetch, here, the wheels the serving benchmark needs on the GPU machine, into .whl/.

The GPU machine's python (3.12, /opt/torch/.venv) has PyTorch but not the web packages, and it reaches
no registry; bench/gpu_check.sh installs whatever .whl/ holds into /tmp/site before the serving
benchmark when .whl is carried. Run with this checkout's venv, whose installed versions it copies:

    .venv/bin/python bench/gpu_webdeps.py      # then: run(carry=[".whl"], command="bash bench/gpu_check.sh")
"""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# What the web side imports, and the extras we install them with (pyproject.toml).
ROOTS = {"django": set(), "channels": set(), "daphne": set(), "whitenoise": set(), "celery": {"redis"},
         "channels-redis": set(), "websockets": set()}
# Already in the GPU machine's image (/work/.library/device/KINDS.md, 2026-11): its versions serve.
ON_THE_GPU_MACHINE = {"attrs", "click", "idna", "msgpack", "packaging", "python-dateutil", "six", "typing-extensions"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_24_x86_64"]


def closure() -> dict[str, str]:
    """Every distribution the roots need in this environment, name -> installed version."""
    found: dict[str, str] = {}
    todo = list(ROOTS.items())
    while todo:
        name, extras = todo.pop()
        key = name.lower().replace("_", "-")
        if key in found:
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
    wanted = {name: version for name, version in closure().items() if name not in ON_THE_GPU_MACHINE}
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
