"""Prefix caching never crosses users, through the real paths: a real Daphne (in-process engine), real
websocket clients and the official openai package, each user with an API token of their own.

Two users send the same long prompt: the second one's request reports 0 cached tokens, while the first
user's repeat reports its prefix cached (websocket `done.usage.cached_tokens`, OpenAI
`usage.prompt_tokens_details.cached_tokens` on both endpoints); /metrics counts the hits.
"""

from __future__ import annotations

import urllib.request

import openai

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
