"""A site-packages folder that holds what the GPU machine's python would: the image's packages (as far
as this venv has them) and, on request, more distributions, such as the web packages' wheels
bench/gpu_webdeps.py fetches. A python started with `-S` and this folder on PYTHONPATH sees that
machine's package set: imports, importlib.metadata and pytest's plugin entry points alike.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterable
from pathlib import Path

from bench.gpu_webdeps import IMAGE_PACKAGES, normalized


def with_requirements(names: Iterable[str]) -> set[str]:
    """`names` and what they require here, transitively: this venv's versions of the image's packages
    may need a dependency the image's versions do not (they bring their own)."""
    dists = {normalized(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    wanted: set[str] = set()
    todo = [n for n in names if n in dists]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        for requirement in dists[name].requires or ():
            if "extra ==" not in requirement:
                dep = normalized(re.split(r"[ ;<>=!~\[(]", requirement.strip(), maxsplit=1)[0])
                if dep in dists:
                    todo.append(dep)
    return wanted


def image_site(folder: Path, beyond: Iterable[str] = ()) -> list[str]:
    """Link into `folder` every top-level entry of the distributions the image also has, and of those
    named in `beyond` (taken as they are, without their requirements); returns the distributions left out."""
    left_out, wanted = [], with_requirements(IMAGE_PACKAGES) | {normalized(name) for name in beyond}
    for dist in importlib.metadata.distributions():
        name = normalized(dist.metadata["Name"])
        if name not in wanted:
            left_out.append(name)
            continue
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or ()} | {Path(dist._path).name}  # type: ignore[attr-defined]
        for top in tops:
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            source, link = base / top, folder / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    return left_out
