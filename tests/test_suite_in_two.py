"""`make test` splits the suite into two pytest processes (scripts/suite_in_two.py): every test module
must be in exactly one of them, with the arguments given to both, and only the non-server half niced."""

from __future__ import annotations

from pathlib import Path

from scripts.suite_in_two import OTHERS_NICENESS, SERVER_TESTS, commands

ROOT = Path(__file__).resolve().parents[1]


def selected(command: list[str]) -> set[Path]:
    """The test modules a pytest command line collects: its paths, less its --ignore'd ones."""
    paths = [ROOT / arg for arg in command if arg.startswith("tests")]
    ignored = [ROOT / arg.split("=", 1)[1] for arg in command if arg.startswith("--ignore=")]
    return {module for path in paths for module in path.rglob("test_*.py")
            if not any(module.is_relative_to(folder) for folder in ignored)}


def test_every_test_module_runs_in_exactly_one_of_the_two_processes_with_the_arguments_given():
    servers, others = commands(["-p", "randomly", "--randomly-seed=3"])
    everything = set((ROOT / "tests").rglob("test_*.py"))
    assert selected(servers) | selected(others) == everything
    assert selected(servers) & selected(others) == set()
    assert ROOT / "tests" / "e2e" / "test_browser.py" in selected(servers), "liveness: the page tests are the servers'"
    assert ROOT / "tests" / "engine" / "test_batch_invariance.py" in selected(others)
    for command in (servers, others):
        assert command[command.index("pytest") + 1:][:3] == ["-p", "randomly", "--randomly-seed=3"]
    assert others[:3] == ["nice", "-n", str(OTHERS_NICENESS)] and "nice" not in servers
    assert set(SERVER_TESTS) <= set(servers)
