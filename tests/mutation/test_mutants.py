"""Mutation check of the leak tests (docs/DEVICE_LOOP.md, "The mechanisms"): each mutant must make its named tests fail, or
the type check report its error.

A test mutant is applied to a scratch copy of engine/ and tests/, and the named tests run there in a
child forked from a Python that has imported the heavy third-party modules but none of the project's
(tests/mutation/preloaded.py). In that copy every file a mutant edits is first reformatted (rewritten
from its syntax tree by ast.unparse: other line breaks, quotes and parentheses, no comments), so each run
shows that the mutants find their code by its syntax, not its layout. A control run of the same tests on an
unmutated copy, reformatted alike, must pass, so a failure under a mutant means the mechanism was
missed, not that the scratch setup is broken. A type mutant is
applied to a copy of what `make typecheck` reads, where mypy runs as that target runs it; it must
report the mutant's error and nothing outside the mutant's file.
"""

from __future__ import annotations

import ast
import os
import queue
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.mutation import anchors
from tests.mutation.mutants import MUTANTS, TEST_MUTANTS, TYPE_MUTANTS, Mutant
from tests.mutation.preloaded import NOT_THE_COPY, PreloadedPython

ROOT = Path(__file__).resolve().parents[2]
# [tool.mypy]'s files; workbench/ is also where the django-stubs plugin finds the settings it loads.
TYPE_CHECKED = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])


def reformatted(source: str) -> str:
    return ast.unparse(ast.parse(source)) + "\n"


# The native CPU kernels' folder is linked into each copy, not copied: their build is cached per source
# path (engine/kernels/cpu/build.py), so a copy of them would be compiled afresh for every run, about 20 s
# on two cores. No mutant edits them (test_no_mutant_edits_the_linked_kernels).
LINKED = Path("engine/kernels/cpu")


def scratch_copy(destination: Path, sources: dict[str, str]) -> Path:
    """engine/ and tests/ copied, with `sources` ({path: text}: the reformatted files) written over theirs."""
    skipped = shutil.ignore_patterns("__pycache__", ".pytest_cache", "mutation")

    def ignore(folder: str, names: list[str]) -> set[str]:
        linked = {LINKED.name} if Path(folder) == ROOT / LINKED.parent else set()
        return set(skipped(folder, names)) | linked

    for part in ("engine", "tests"):
        shutil.copytree(ROOT / part, destination / part, ignore=ignore)
    (destination / LINKED).symlink_to(ROOT / LINKED, target_is_directory=True)
    (destination / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for path, text in sources.items():
        (destination / path).write_text(text)
    return destination


def type_check_copy(destination: Path) -> Path:
    """The type check's inputs, and its cache where one exists (`make test` runs `make typecheck`
    first): mypy then re-analyses only what a mutant touched, not torch and Django's stubs again."""
    for part in TYPE_CHECKED:
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, destination / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (destination / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / part, destination / part)
    (destination / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", destination / ".mypy_cache")
    return destination


def mutate(copy: Path, mutant: Mutant) -> None:
    target = copy / mutant.path
    target.write_text(anchors.replace(target.read_text(), mutant.scope, mutant.original, mutant.replacement))


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_a_mutant_edits_the_same_code_however_its_file_is_formatted(mutant: Mutant):
    """Fast, before the runs: the mutant's code is found once, the edit changes the syntax tree, and the
    reformatted file's edit is the same tree as the original file's."""
    source = (ROOT / mutant.path).read_text()
    edited = anchors.replace(source, mutant.scope, mutant.original, mutant.replacement)
    edited_reformatted = anchors.replace(reformatted(source), mutant.scope, mutant.original, mutant.replacement)
    assert ast.dump(ast.parse(edited)) != ast.dump(ast.parse(source)), "the edit changes nothing"
    assert ast.dump(ast.parse(edited_reformatted)) == ast.dump(ast.parse(edited))


def test_no_mutant_edits_the_linked_kernels():
    assert not [m.name for m in MUTANTS if Path(m.path).is_relative_to(LINKED)]


def test_an_anchor_that_is_not_unique_or_is_gone_is_refused():
    source = "def f(x):\n    y = x + 1\n    return x + 1\n"
    with pytest.raises(anchors.AnchorError, match="2 occurrences"):
        anchors.replace(source, "f", "x + 1", "x")
    with pytest.raises(anchors.AnchorError, match="0 occurrences"):
        anchors.replace(source, "f", "x + 2", "x")
    with pytest.raises(anchors.AnchorError, match="definitions named 'g'"):
        anchors.replace(source, "g", "x + 1", "x")
    assert anchors.replace(source, "f", "return x + 1", "return x") == "def f(x):\n    y = x + 1\n    return x\n"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """The module's runs share the tiny checkpoints they build (tests/conftest.py, CHECKPOINT_CACHE)."""
    return tmp_path_factory.mktemp("checkpoints")


# Two runs at once, on one thread each: the named tests are small, and two cores serve two such runs in
# about half the time that they serve them one after another on two threads.
RUNS_AT_ONCE = 2
CONTROL = "unmutated"


@pytest.fixture(scope="module")
def test_runs(request, tmp_path_factory, checkpoints) -> Iterator[dict[str, Future[subprocess.CompletedProcess]]]:
    """Every run the session selected from this module (the control run, then each mutant's), all started
    at once and RUNS_AT_ONCE at a time, each forked by one of RUNS_AT_ONCE Pythons that imported torch,
    Django and pytest once (tests/mutation/preloaded.py). Each test waits for its own run's result."""
    wanted = [item.callspec.params["mutant"].name if hasattr(item, "callspec") else CONTROL
              for item in request.session.items if item.path == request.path and "test_runs" in item.fixturenames]
    folders = {name: tmp_path_factory.mktemp("copy") for name in wanted}
    # Every syntax tree is built here, on this thread: CPython 3.11 keeps the AST constructor's recursion
    # depth per interpreter, not per thread, so trees built on two threads at once can fail with
    # "SystemError: AST constructor recursion depth mismatch", and so can pytest reading source to report
    # that failure while another thread parses. The runs' threads only copy files and write these texts.
    reformats = {path: reformatted((ROOT / path).read_text()) for path in {m.path for m in TEST_MUTANTS}}
    edited = {m.name: (m.path, anchors.replace(reformats[m.path], m.scope, m.original, m.replacement))
              for m in TEST_MUTANTS if m.name in wanted}
    idle: queue.Queue[PreloadedPython] = queue.Queue()
    with ThreadPoolExecutor(RUNS_AT_ONCE) as starting:
        servers = list(starting.map(lambda _: PreloadedPython(tmp_path_factory.mktemp("preloaded"), threads=1),
                                    range(RUNS_AT_ONCE)))
    for server in servers:
        idle.put(server)

    def run(name: str) -> subprocess.CompletedProcess:
        copy = scratch_copy(folders[name], reformats)
        if name == CONTROL:
            tests, first_failure = tuple(sorted({t for mutant in TEST_MUTANTS for t in mutant.tests})), False
        else:
            mutant = next(m for m in TEST_MUTANTS if m.name == name)
            path, text = edited[name]
            (copy / path).write_text(text)
            tests, first_failure = mutant.tests, True
        server = idle.get()
        try:
            return run_tests(server, copy, tests, checkpoints, first_failure=first_failure)
        finally:
            idle.put(server)

    pool = ThreadPoolExecutor(RUNS_AT_ONCE)
    try:
        yield {name: pool.submit(run, name) for name in wanted}
    finally:
        pool.shutdown(cancel_futures=True)
        for server in servers:
            server.close()


def run_tests(preloaded: PreloadedPython, copy: Path, tests: tuple[str, ...], checkpoints: Path, *,
              first_failure: bool = False) -> subprocess.CompletedProcess:
    """`first_failure`: stop at the first failing test (a mutant is caught by one; its named test's other
    variants would only repeat the verdict at several seconds each)."""
    # Without the outer run's PYTEST_ADDOPTS: its options (a --junitxml report, --durations, -x) are for
    # the suite, and would make every mutant's run overwrite its report or stop it early.
    env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "PYTHONPATH": str(copy),
           "WORKBENCH_TEST_CHECKPOINT_CACHE": str(checkpoints)}
    # The named tests on the HF checkpoint only: their GGUF variants run the same mechanism on other
    # weights, and would double the time of every mutant for no other mechanism tested.
    done = preloaded.run(copy, ["-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                                *(["-x"] if first_failure else []), "-k", "not gguf", *tests], env, timeout=600)
    assert NOT_THE_COPY not in done.stderr, done.stderr[-3000:]
    return done


def run_type_check(copy: Path) -> subprocess.CompletedProcess:
    """`make typecheck` in the copy: mypy with the copy's pyproject.toml, over its files."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    return subprocess.run([sys.executable, "-m", "mypy"], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=900)


def test_unmutated_copy_passes_every_named_test(test_runs):
    done = test_runs[CONTROL].result()
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.parametrize("mutant", TEST_MUTANTS, ids=[m.name for m in TEST_MUTANTS])
def test_mutant_is_caught_by_its_named_tests(test_runs, mutant: Mutant):
    done = test_runs[mutant.name].result()
    caught = re.findall(r"^FAILED (\S+)", done.stdout, flags=re.MULTILINE)
    print(f"\nmutant '{mutant.name}' caught by: {', '.join(caught) or 'NOTHING'}")
    assert done.returncode != 0 and caught, f"mutant '{mutant.name}' survived:\n{done.stdout[-3000:]}"


@pytest.mark.parametrize("mutant", TYPE_MUTANTS, ids=[m.name for m in TYPE_MUTANTS])
def test_mutant_is_caught_by_the_type_check(tmp_path, mutant: Mutant):
    """One mypy run, on the mutated copy: it must report the mutant's error, and no error anywhere else
    (which stands for a control run: a copy broken otherwise would show errors outside the mutant's
    file, and the unmutated tree passed `make typecheck` before the tests ran)."""
    copy = type_check_copy(tmp_path)
    mutate(copy, mutant)
    done = run_type_check(copy)
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    caught = [line for line in errors if line.startswith(f"{mutant.path}:") and mutant.type_error in line]
    print(f"\nmutant '{mutant.name}' caught by: {' | '.join(caught) or 'NOTHING'}")
    assert done.returncode != 0 and caught, f"mutant '{mutant.name}' passed the type check:\n{done.stdout[-3000:]}"
    elsewhere = [line for line in errors if not line.startswith(f"{mutant.path}:")]
    assert not elsewhere, "the copy has errors the mutant does not explain:\n" + "\n".join(elsewhere[:20])
