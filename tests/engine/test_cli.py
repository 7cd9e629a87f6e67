"""`python -m engine generate` as a user runs it: a real subprocess, JSON output, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from engine import Engine, EngineConfig, SamplingParams


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "generate", *args],
                          capture_output=True, text=True, timeout=120)


def test_json_output_matches_the_python_interface():
    done = run_cli("--model", "demo", "--prompt", "The list type", "--max-tokens", "12", "--temperature", "0", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"text", "token_ids", "finish_reason", "usage"}
    [expected] = Engine(EngineConfig(model="demo")).generate(["The list type"], SamplingParams(max_tokens=12, temperature=0))
    assert out["token_ids"] == expected.token_ids and out["text"] == expected.text
    assert out["finish_reason"] == expected.finish_reason in ("stop", "length")
    assert out["usage"] == expected.usage.as_dict()


def test_plain_output_is_prompt_then_completion():
    done = run_cli("--model", "demo", "--prompt", "A dictionary is", "--max-tokens", "8", "--temperature", "0")
    assert done.returncode == 0, done.stderr
    [expected] = Engine(EngineConfig(model="demo")).generate(["A dictionary is"], SamplingParams(max_tokens=8, temperature=0))
    assert done.stdout == "A dictionary is" + expected.text + "\n"


def test_chat_flag_applies_the_chat_template():
    done = run_cli("--prompt", "hello", "--chat", "--max-tokens", "4", "--json")
    assert done.returncode == 0, done.stderr
    engine = Engine(EngineConfig(model="demo"))
    prompt_ids = engine.tokenizer.encode_chat([{"role": "user", "content": "hello"}])
    [expected] = engine.generate([prompt_ids], SamplingParams(max_tokens=4, temperature=0))
    out = json.loads(done.stdout)
    assert out["usage"]["prompt_tokens"] == len(prompt_ids) > len(engine.tokenizer.encode("hello"))
    assert out["token_ids"] == expected.token_ids


def test_bad_input_exits_2_with_one_line_naming_the_problem(tmp_path):
    cases = [
        (("--prompt", "x", "--max-tokens", "0"), "max_tokens"),
        (("--prompt", "x", "--temperature", "-1"), "temperature"),
        (("--prompt", ""), "prompt is empty"),
        (("--model", str(tmp_path / "missing"), "--prompt", "x"), "is neither a known name"),
        (("--model", str(tmp_path), "--prompt", "x"), "config.json is missing"),
        (("--prompt", "x", "--max-num-batched-tokens", "0"), "max_num_batched_tokens must be >= 1"),
    ]
    # Side by side: each is a fresh interpreter that spends its two seconds importing torch.
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = list(pool.map(lambda case: run_cli(*case[0]), cases))
    for (args, message), done in zip(cases, runs):
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
