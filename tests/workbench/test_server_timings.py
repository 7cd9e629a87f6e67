"""llama.cpp's `timings` object on the OpenAI routes (workbench/api/openai/server_timings.py): at the top of a
whole reply and of each choice's last streamed chunk only, its counts equal to the usage's, its rates
consistent with its counts and times."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.users import unique_name
from tests.workbench.daphne_session import Session
from workbench.api.openai.server_timings import llama_timings

FIELDS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
          "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 6,
        "temperature": 1.0, "seed": 5, "ignore_eos": True}  # seeded


def test_the_arithmetic():
    usage = {"prompt_tokens": 30, "completion_tokens": 5, "cached_tokens": 10}
    timings = {"queue_time": 0.5, "time_to_first_token": 0.7, "total_time": 1.2, "decode_tokens_per_s": 8.0}
    shaped = llama_timings(usage, timings)
    assert shaped == pytest.approx({"cache_n": 10, "prompt_n": 20, "prompt_ms": 200.0, "prompt_per_token_ms": 10.0,
                                    "prompt_per_second": 100.0, "predicted_n": 5, "predicted_ms": 500.0,
                                    "predicted_per_token_ms": 100.0, "predicted_per_second": 10.0})
    assert llama_timings(usage, {**timings, "time_to_first_token": None}) is None, "no token: no rates"
    assert llama_timings(None, timings) is None


@pytest.fixture(scope="module")
def token(inprocess_daphne) -> str:
    return Session(inprocess_daphne.address).sign_up(unique_name("timings")).new_token("raw")[1]


def post(address: str, token: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"http://{address}/v1/{path}", headers={"Authorization": f"Bearer {token}"}, json=body,
                      timeout=60)


def test_a_whole_chat_reply_carries_timings_that_agree_with_its_usage(inprocess_daphne, token):
    reply = post(inprocess_daphne.address, token, "chat/completions", CHAT).json()
    timings, usage = reply["timings"], reply["usage"]
    assert set(timings) == FIELDS
    assert timings["predicted_n"] == usage["completion_tokens"] == 6
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    assert timings["cache_n"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert timings["prompt_ms"] > 0 and timings["predicted_ms"] > 0
    assert timings["predicted_per_second"] == pytest.approx(6 / timings["predicted_ms"] * 1000)


def test_only_the_last_streamed_chunk_carries_timings(inprocess_daphne, token):
    completion = {**{k: v for k, v in CHAT.items() if k != "messages"}, "prompt": "Once upon a time"}
    for path, body in (("chat/completions", CHAT), ("completions", completion)):
        with httpx.stream("POST", f"http://{inprocess_daphne.address}/v1/{path}", timeout=60,
                          headers={"Authorization": f"Bearer {token}"}, json={**body, "stream": True}) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: {")]
        timed = [n for n, c in enumerate(chunks) if "timings" in c]
        assert timed == [len(chunks) - 1], (path, timed, len(chunks))
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["timings"]["predicted_n"] == 6 and set(chunks[-1]["timings"]) == FIELDS
