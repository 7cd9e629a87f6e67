"""Prefix caching never crosses users, through the real paths: a real Daphne (in-process engine, and the
shared one over the session's two Celery workers), real websocket clients and the official openai
package, each user with an API token of their own.

Two users send the same long prompt: the second one's request reports 0 cached tokens, while the first
user's repeat reports its prefix cached (websocket `done.usage.cached_tokens`, OpenAI
`usage.prompt_tokens_details.cached_tokens` on both endpoints); /metrics counts the hits. Over Celery
the user must travel in the task to the worker's engine: a worker that lost it would scope every
request alike, and the second user would find the first one's prefix.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import openai
import pytest
import websockets

from tests.cluster import issue_tokens
from tests.workbench.test_daphne_e2e import ws_generate

# Long enough for several full KV blocks of 16 tokens in the demo tokenizer.
LONG = ("You are a careful assistant for a small team of Python developers. Answer briefly, cite the "
        "standard library where you can, and never invent an API. The question follows. ")
BLOCK = 16


def two_users(limited_daphne, api: str) -> tuple[str, str, str]:
    """(address, bob's token, carol's token) on the session's limited in-process Daphne: users of this
    test's own (no earlier request of theirs cached anything), within its limits (three requests each)."""
    address, tokens = limited_daphne
    return address, tokens[f"prefix-{api}-bob"], tokens[f"prefix-{api}-carol"]


def cached_over_websocket(address: str, token: str, request_id: str, prompt: str) -> tuple[int, int]:
    frames = ws_generate(address, token, [{"type": "generate", "request_id": request_id, "prompt": prompt,
                                           "params": {"max_tokens": 2, "temperature": 0}}])
    done = frames[-1]
    assert done["type"] == "done", done
    return done["usage"]["cached_tokens"], done["usage"]["prompt_tokens"]


def test_the_websocket_api_caches_per_user(limited_daphne):
    address, bob, carol = two_users(limited_daphne, "ws")
    prompt = LONG + "What does the list type do?"
    first, prompt_tokens = cached_over_websocket(address, bob, "a", prompt)
    other, _ = cached_over_websocket(address, carol, "b", prompt)
    again, _ = cached_over_websocket(address, bob, "c", prompt)
    assert prompt_tokens > 3 * BLOCK, "liveness: the prompt spans several blocks"
    assert first == 0 and again == (prompt_tokens - 1) // BLOCK * BLOCK, "the same user's repeat is cached"
    assert other == 0, "another user's request found bob's cached prefix"


def test_both_openai_endpoints_report_cached_tokens_per_user(limited_daphne):
    address, bob, carol = two_users(limited_daphne, "http")
    bob_client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=bob, max_retries=0)
    carol_client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=carol, max_retries=0)
    prompt = "Over HTTP now. " + LONG + "How do I read a file line by line?"  # not the websocket test's prefix

    def completion(client: openai.OpenAI) -> int:
        usage = client.completions.create(model="demo", prompt=prompt, max_tokens=2, temperature=0).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return usage.prompt_tokens_details.cached_tokens or 0

    assert completion(bob_client) == 0
    assert completion(carol_client) == 0, "another user's completion found bob's cached prefix"
    assert completion(bob_client) > 2 * BLOCK, "liveness: bob's repeat is cached"

    messages = [{"role": "system", "content": LONG}, {"role": "user", "content": "What is a generator?"}]
    first = carol_client.chat.completions.create(model="demo", messages=messages, max_tokens=2, temperature=0)
    other = bob_client.chat.completions.create(model="demo", messages=messages, max_tokens=2, temperature=0)
    chunks = list(carol_client.chat.completions.create(model="demo", messages=messages, max_tokens=2, temperature=0,
                                                       stream=True, stream_options={"include_usage": True}))
    streamed = chunks[-1].usage
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert other.usage is not None and other.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert other.usage.prompt_tokens_details.cached_tokens == 0, "bob's chat found carol's cached prefix"
    assert streamed is not None and streamed.prompt_tokens_details is not None
    assert streamed.prompt_tokens_details.cached_tokens == (streamed.prompt_tokens - 1) // BLOCK * BLOCK

    scrape = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    hits = [line for line in scrape.splitlines() if line.startswith("workbench_prefix_cache_hits_total{")]
    queries = [line for line in scrape.splitlines() if line.startswith("workbench_prefix_cache_queries_total{")]
    assert hits and float(hits[0].rsplit(" ", 1)[1]) > 0 and float(queries[0].rsplit(" ", 1)[1]) > 0


# On the shared Celery Daphne (docs/TESTING.md): users no other test there uses.
CELERY_USERS = ["celery-prefix-ws-bob", "celery-prefix-ws-carol", "celery-prefix-http-bob", "celery-prefix-http-carol"]
# Bob's first request runs as this many choices, submitted together, so that his prefix is cached on both
# workers and carol's request meets it wherever it is routed (and bob's repeat finds it). The least
# loaded worker takes each choice; a request that ended a moment ago still counts on its worker until
# the web process polls that worker's next heartbeat (under a second): with up to two such, four choices
# still reach both workers.
WARM_CHOICES = 4


@pytest.fixture(scope="module")
def celery_users(celery_daphne) -> dict[str, str]:
    """{username: API token} for CELERY_USERS on the shared Celery Daphne, issued in one process."""
    return issue_tokens(celery_daphne.env, celery_daphne.db_path, CELERY_USERS)


def workers_that_admitted(celery_cluster, engine_id: str) -> set[str]:
    """The workers whose logs admitted `engine_id` or one of its choices (`engine_id`-i); a wire id is the
    engine id, a dot and a suffix."""
    pattern = re.compile(rf"(^|-){re.escape(engine_id)}(-\d+)?\.")
    return {w for rid, workers in celery_cluster.admissions().items() if pattern.search(rid) for w in workers}


def ws_done(address: str, token: str, frame: dict, dones: int = 1) -> dict:
    """Sends one generate frame and reads until its `dones`-th done; returns that last done (the one
    with the usage: with `n` the earlier choices' dones carry none)."""
    async def run() -> dict:
        async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                      additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send(json.dumps(frame))
            for _ in range(dones):
                while (received := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] not in ("done", "error"):
                    pass
                assert received["type"] == "done", received
            return received

    return asyncio.run(run())


def test_over_celery_the_websocket_api_caches_per_user(celery_daphne, celery_cluster, celery_users):
    address = celery_daphne.address
    bob, carol = celery_users["celery-prefix-ws-bob"], celery_users["celery-prefix-ws-carol"]
    prompt = "Through the Celery workers. " + LONG + "What does the dict type do?"
    params = {"max_tokens": 2, "temperature": 0}
    ws_done(address, bob, {"type": "generate", "request_id": "celery-iso-bob-warm", "prompt": prompt,
                           "params": {**params, "n": WARM_CHOICES}}, dones=WARM_CHOICES)
    other = ws_done(address, carol, {"type": "generate", "request_id": "celery-iso-carol", "prompt": prompt,
                                     "params": params})["usage"]
    again = ws_done(address, bob, {"type": "generate", "request_id": "celery-iso-bob-again", "prompt": prompt,
                                   "params": params})["usage"]
    warmed = workers_that_admitted(celery_cluster, "celery-iso-bob-warm")
    assert len(warmed) == 2, f"liveness: bob's prefix is on both workers, not only {warmed}"
    assert again["prompt_tokens"] > 3 * BLOCK, "liveness: the prompt spans several blocks"
    assert again["cached_tokens"] == (again["prompt_tokens"] - 1) // BLOCK * BLOCK, "the same user's repeat is cached"
    assert other["cached_tokens"] == 0, "carol's request found bob's cached prefix on a Celery worker"


def test_over_celery_the_openai_api_caches_per_user(celery_daphne, celery_cluster, celery_users):
    def client(username: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://{celery_daphne.address}/v1", api_key=celery_users[username],
                             max_retries=0)

    bob, carol = client("celery-prefix-http-bob"), client("celery-prefix-http-carol")
    prompt = "Over HTTP through the Celery workers. " + LONG + "How do I sort a list of tuples?"

    def cached(openai_client: openai.OpenAI, n: int = 1) -> tuple[int, str]:
        response = openai_client.completions.create(model="demo", prompt=prompt, max_tokens=2, temperature=0, n=n)
        assert response.usage is not None and response.usage.prompt_tokens_details is not None
        return response.usage.prompt_tokens_details.cached_tokens or 0, response.id

    _, warm_id = cached(bob, n=WARM_CHOICES)  # on both workers, as in the websocket test
    other, _ = cached(carol)
    again, _ = cached(bob)
    warmed = workers_that_admitted(celery_cluster, warm_id)
    assert len(warmed) == 2, f"liveness: bob's prefix is on both workers, not only {warmed}"
    assert again > 2 * BLOCK, "liveness: bob's repeat is cached"
    assert other == 0, "carol's completion found bob's cached prefix on a Celery worker"
