"""Mutation check of the leak tests (GUIDE section 3): each mutant must make its named tests fail.

Each mutant is applied to a scratch copy of engine/ and tests/, and the named tests run there in a
fresh interpreter. A control run of the same tests on an unmutated copy must pass, so a failure under
a mutant means the mechanism was missed, not that the scratch setup is broken.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mutation.mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]


def scratch_copy(destination: Path) -> Path:
    for part in ("engine", "tests"):
        shutil.copytree(ROOT / part, destination / part,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "mutation"))
    (destination / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    return destination


def run_tests(copy: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    code = "import engine, sys; assert engine.__file__.startswith(sys.argv[1]), engine.__file__"
    subprocess.run([sys.executable, "-c", code, str(copy)], cwd=copy, env=env, check=True)  # the copy is imported
    # The named tests on the HF checkpoint only: their GGUF variants run the same mechanism on other
    # weights, and would double the time of every mutant for no other mechanism tested.
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not gguf", *tests],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=600)


def test_unmutated_copy_passes_every_named_test(tmp_path):
    tests = tuple(sorted({t for mutant in MUTANTS for t in mutant.tests}))
    done = run_tests(scratch_copy(tmp_path), tests)
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught_by_its_named_tests(tmp_path, mutant: Mutant):
    copy = scratch_copy(tmp_path)
    target = copy / mutant.path
    source = target.read_text()
    assert source.count(mutant.original) == 1, f"{mutant.path}: the text this mutant edits moved or changed"
    target.write_text(source.replace(mutant.original, mutant.replacement))
    done = run_tests(copy, mutant.tests)
    caught = re.findall(r"^FAILED (\S+)", done.stdout, flags=re.MULTILINE)
    print(f"\nmutant '{mutant.name}' caught by: {', '.join(caught) or 'NOTHING'}")
    assert done.returncode != 0 and caught, f"mutant '{mutant.name}' survived:\n{done.stdout[-3000:]}"
