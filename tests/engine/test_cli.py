"""`python -m engine generate` as a user runs it: a real subprocess for each output mode, and clear errors.

The bad inputs go through the same `main` in this process (a subprocess would spend its two seconds
importing torch to print one line); that `python -m engine` returns `main`'s status is the good runs'.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "generate", *args],
                          capture_output=True, text=True, timeout=120)


RUNS = {
    "json": ("--model", "demo", "--prompt", "The list type", "--max-tokens", "12", "--temperature", "0", "--json"),
    "plain": ("--model", "demo", "--prompt", "A dictionary is", "--max-tokens", "8", "--temperature", "0"),
    "chat": ("--prompt", "hello", "--chat", "--max-tokens", "4", "--json"),
}
# (arguments, what the one line of the error must say)
BAD_INPUT = [
    (("--prompt", "x", "--max-tokens", "0"), "max_tokens"),
    (("--prompt", "x", "--temperature", "-1"), "temperature"),
    (("--prompt", ""), "prompt is empty"),
    (("--model", "{tmp}/missing", "--prompt", "x"), "is neither a known name"),
    (("--model", "{tmp}", "--prompt", "x"), "config.json is missing"),
    (("--prompt", "x", "--max-num-batched-tokens", "0"), "max_num_batched_tokens must be >= 1"),
]


@pytest.fixture(scope="module")
def cli() -> Iterator[dict[str, Future[subprocess.CompletedProcess]]]:
    """RUNS started side by side when the first test asks, by name: each is a fresh interpreter that
    spends about two seconds importing torch."""
    with ThreadPoolExecutor(len(RUNS)) as pool:
        yield {name: pool.submit(run_cli, *args) for name, args in RUNS.items()}


def test_json_output_matches_the_python_interface(cli):
    done = cli["json"].result()
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"text", "token_ids", "finish_reason", "usage"}
    [expected] = Engine(EngineConfig(model="demo")).generate(["The list type"], SamplingParams(max_tokens=12, temperature=0))
    assert out["token_ids"] == expected.token_ids and out["text"] == expected.text
    assert out["finish_reason"] == expected.finish_reason in ("stop", "length")
    assert out["usage"] == expected.usage.as_dict()


def test_plain_output_is_prompt_then_completion(cli):
    done = cli["plain"].result()
    assert done.returncode == 0, done.stderr
    [expected] = Engine(EngineConfig(model="demo")).generate(["A dictionary is"], SamplingParams(max_tokens=8, temperature=0))
    assert done.stdout == "A dictionary is" + expected.text + "\n"


def test_chat_flag_applies_the_chat_template(cli):
    done = cli["chat"].result()
    assert done.returncode == 0, done.stderr
    engine = Engine(EngineConfig(model="demo"))
    prompt_ids = engine.tokenizer.encode_chat([{"role": "user", "content": "hello"}])
    [expected] = engine.generate([prompt_ids], SamplingParams(max_tokens=4, temperature=0))
    out = json.loads(done.stdout)
    assert out["usage"]["prompt_tokens"] == len(prompt_ids) > len(engine.tokenizer.encode("hello"))
    assert out["token_ids"] == expected.token_ids


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_exits_2_with_one_line_naming_the_problem(args, message, tmp_path, capsys):
    assert main(["generate", *(arg.format(tmp=tmp_path) for arg in args)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and message in err, err
