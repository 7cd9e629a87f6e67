"""The request limits through a real Daphne (tests/workbench/conftest.py's, with low limits): a user's
concurrent requests and requests a minute (`rate_limited`, HTTP 429 with Retry-After), the process's
bound on requests in flight (`overloaded`, HTTP 503), each counted across the websocket API, the
OpenAI API and the Messages, Responses and Ollama routes, each refusal's shape asserted, and other users
served meanwhile. Each test has users of its
own (the counts are per user) and ends what it started (the bound is the process's)."""

from __future__ import annotations

import asyncio
import json

import anthropic
import ollama
import openai
import pytest
import websockets

from tests.workbench.conftest import LIMITS
from tests.workbench.test_hostile_input import until_done

pytestmark = pytest.mark.slow  # a real Daphne (shared by the session) and real clients

SHORT = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
LONG = {"max_tokens": None, "temperature": 0, "ignore_eos": True}  # to the model's length: runs until canceled


def connect(address: str, token: str):
    return websockets.connect(f"ws://{address}/ws/v1/generate", additional_headers={"Authorization": f"Bearer {token}"})


async def generate(ws, request_id: str, params: dict) -> None:
    await ws.send(json.dumps({"type": "generate", "request_id": request_id, "prompt": "The list type", "params": params}))


async def answer(ws, request_id: str) -> dict:
    """The request's first answer: accepted, or the error that refused it."""
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if frame.get("request_id") == request_id and frame["type"] in ("accepted", "error"):
            return frame


async def cancel(ws, request_id: str) -> dict:
    await ws.send(json.dumps({"type": "cancel", "request_id": request_id}))
    return (await until_done(ws, request_id))[-1]


def client(address: str, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)


async def complete(address: str, token: str):
    return await client(address, token).completions.create(model="demo", prompt="The list type", max_tokens=1,
                                                           seed=0)


def test_a_users_concurrent_requests_are_limited_and_other_users_are_not(limited_daphne):
    address, tokens = limited_daphne

    async def run():
        async with connect(address, tokens["alice"]) as ws, connect(address, tokens["carol"]) as other:
            for request_id in ("a", "b"):
                await generate(ws, request_id, LONG)
                assert (await answer(ws, request_id))["type"] == "accepted"
            await generate(ws, "c", SHORT)
            refused = await answer(ws, "c")
            with pytest.raises(openai.RateLimitError) as over_http:  # the same count on the other API
                await complete(address, tokens["alice"])
            await generate(other, "o", SHORT)
            others = (await until_done(other, "o"))[-1]
            canceled = await cancel(ws, "a")
            await generate(ws, "d", SHORT)  # the slot the cancel freed
            after = (await until_done(ws, "d"))[-1]
            await cancel(ws, "b")
            return refused, over_http.value, others, canceled, after

    refused, over_http, others, canceled, after = asyncio.run(run())
    assert refused == {"type": "error", "request_id": "c", "code": "rate_limited", "retry_after": 1,
                       "message": refused["message"]}
    assert "WORKBENCH_USER_CONCURRENT_REQUESTS" in refused["message"] and "2 requests" in refused["message"]
    assert over_http.status_code == 429 and over_http.response.headers["Retry-After"] == "1"
    assert over_http.body["code"] == "rate_limited"
    assert others["type"] == "done" and others["finish_reason"] == "length", "another user is served meanwhile"
    assert canceled["type"] == "done" and canceled["finish_reason"] == "canceled"
    assert after["type"] == "done" and after["usage"]["completion_tokens"] == 2, "the freed slot takes a request"


def test_a_users_requests_a_minute_are_limited_across_both_apis_with_retry_after(limited_daphne):
    address, tokens = limited_daphne
    per_minute = LIMITS["WORKBENCH_USER_REQUESTS_PER_MINUTE"]

    async def run():
        served = [await complete(address, tokens["dave"]) for _ in range(per_minute - 1)]
        async with connect(address, tokens["dave"]) as ws:
            await generate(ws, "last", SHORT)
            last = (await until_done(ws, "last"))[-1]
            with pytest.raises(openai.RateLimitError) as over_http:
                await complete(address, tokens["dave"])
            await generate(ws, "over", SHORT)
            over_ws = await answer(ws, "over")
        other = await complete(address, tokens["erin"])
        return served, last, over_http.value, over_ws, other

    served, last, over_http, over_ws, other = asyncio.run(run())
    assert all(c.choices[0].finish_reason == "length" for c in served) and last["type"] == "done"
    assert over_http.status_code == 429 and over_http.body["code"] == "rate_limited"
    assert f"at most {per_minute} requests a minute" in over_http.body["message"]
    retry_after = int(over_http.response.headers["Retry-After"])
    assert 1 <= retry_after <= 60
    assert over_ws["type"] == "error" and over_ws["code"] == "rate_limited" and 1 <= over_ws["retry_after"] <= 60
    assert "WORKBENCH_USER_REQUESTS_PER_MINUTE" in over_ws["message"]
    assert other.choices[0].finish_reason == "length", "another user is not limited by this one's rate"


def test_the_process_bound_on_requests_in_flight_answers_overloaded(limited_daphne):
    address, tokens = limited_daphne
    bound = LIMITS["WORKBENCH_MAX_IN_FLIGHT"]

    async def run():
        async with (connect(address, tokens["gina"]) as g, connect(address, tokens["hank"]) as h,
                    connect(address, tokens["ivan"]) as i):
            held = [(g, "g1"), (g, "g2"), (h, "h1"), (h, "h2"), (i, "i1")]
            assert len(held) == bound
            for ws, request_id in held:
                await generate(ws, request_id, LONG)
                assert (await answer(ws, request_id))["type"] == "accepted"
            await generate(i, "i2", SHORT)
            over_ws = await answer(i, "i2")
            with pytest.raises(openai.InternalServerError) as over_http:
                await complete(address, tokens["ivan"])
            for ws, request_id in held:
                await cancel(ws, request_id)
        return over_ws, over_http.value, await complete(address, tokens["ivan"])

    over_ws, over_http, after = asyncio.run(run())
    assert over_ws["type"] == "error" and over_ws["code"] == "overloaded" and over_ws["retry_after"] == 1
    assert "WORKBENCH_MAX_IN_FLIGHT" in over_ws["message"]
    assert over_http.status_code == 503 and over_http.body["code"] == "overloaded"
    assert over_http.response.headers["Retry-After"] == "1"
    assert after.choices[0].finish_reason == "length", "the bound frees as requests end"


def test_the_messages_responses_and_ollama_routes_count_toward_the_same_limits(limited_daphne):
    """At the concurrency limit each route refuses in its own shape; then each route's request counts
    toward the requests a minute, which the next request, over the websocket, finds spent."""
    address, tokens = limited_daphne
    token = tokens["jane"]
    messages = anthropic.AsyncAnthropic(base_url=f"http://{address}", auth_token=token, max_retries=0).messages
    responses = client(address, token).responses
    local = ollama.AsyncClient(host=f"http://{address}", headers={"Authorization": f"Bearer {token}"})
    asks = {"messages": lambda: messages.create(model="demo", max_tokens=2, messages=[{"role": "user", "content": "Hi"}],
                                                extra_body={"seed": 1}),
            "responses": lambda: responses.create(model="demo", input="Hi", max_output_tokens=2, store=False,
                                                  extra_body={"seed": 1}),
            "ollama chat": lambda: local.chat(model="demo", messages=[{"role": "user", "content": "Hi"}], stream=False,
                                              options={"num_predict": 2, "seed": 1}),
            "ollama generate": lambda: local.generate(model="demo", prompt="Hi", stream=False,
                                                      options={"num_predict": 2, "seed": 1})}

    async def run():
        refusals = {}
        async with connect(address, token) as ws:
            for request_id in ("a", "b"):
                await generate(ws, request_id, LONG)
                assert (await answer(ws, request_id))["type"] == "accepted"
            for name, ask in asks.items():
                try:
                    await ask()
                except (anthropic.RateLimitError, openai.RateLimitError, ollama.ResponseError) as exc:
                    refusals[name] = exc
            for request_id in ("a", "b"):
                await cancel(ws, request_id)
            served = [await ask() for ask in asks.values()]  # 2 + 4: the requests a minute are spent
            await generate(ws, "over", SHORT)
            return refusals, served, await answer(ws, "over")

    refusals, served, over = asyncio.run(run())
    assert sorted(refusals) == sorted(asks), refusals
    assert refusals["messages"].body == {"type": "error", "error": {"type": "rate_limit_error",
                                                                    "message": refusals["messages"].body["error"]["message"]}}
    assert "2 requests" in refusals["messages"].body["error"]["message"]
    assert refusals["responses"].status_code == 429 and refusals["responses"].body["code"] == "rate_limited"
    for name in ("ollama chat", "ollama generate"):
        assert refusals[name].status_code == 429 and "WORKBENCH_USER_CONCURRENT_REQUESTS" in refusals[name].error
    assert len(served) == 4, "liveness: with the slots free, every route serves"
    assert over["type"] == "error" and over["code"] == "rate_limited" and "a minute" in over["message"]
