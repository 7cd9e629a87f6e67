"""`echo` and prompt logprobs on /v1/completions (and vLLM's `prompt_logprobs` on chat) through the official
`openai` SDK against a real Daphne, on each transport for the echo itself.

What must hold: an echoed reply is the prompt's text and tokens followed by the completion's, the
prompt's logprobs first (the first null), and the completion part is what the same seeded request
without echo gets; `max_tokens: 0` with echo scores the prompt alone (no generated token, whole or
streamed); the prompt's values are the engine's own prompt logprobs (an engine in this process over
the same model, run alone), exactly; vLLM's `prompt_logprobs` carries the same values in its shape.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.users import unique_name
from tests.workbench.daphne_session import Session

PROMPT = "The list type in Python holds"
SEEDED = dict(temperature=1.0, seed=3)  # every sampled request here is seeded


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig(model="demo"))


def prompt_records(engine: Engine, prompt: str | list[int], top: int) -> list:
    """The engine's prompt logprobs for `prompt`, alone: (token id, logprob, top) per token, the first None."""
    [result] = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=top))
    return result.prompt_logprobs


def sdk_for(address: str) -> openai.OpenAI:
    _, token = Session(address).sign_up(unique_name("echo")).new_token("sdk")
    return openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)


def test_echo_with_logprobs_is_the_prompt_then_the_completion(daphne_server, engine):
    sdk = sdk_for(daphne_server[0])
    plain = sdk.completions.create(model="demo", prompt=PROMPT, max_tokens=5, logprobs=2, **SEEDED)
    echoed = sdk.completions.create(model="demo", prompt=PROMPT, max_tokens=5, logprobs=2, echo=True, **SEEDED)
    [choice], [plain_choice] = echoed.choices, plain.choices
    assert choice.text == PROMPT + plain_choice.text
    records = prompt_records(engine, PROMPT, 2)
    n = len(records)
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == n + len(plain_choice.logprobs.tokens)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:n] == [r.logprob for r in records[1:]], "the engine's own values, exactly"
    assert [sorted(top.values(), reverse=True) for top in logprobs.top_logprobs[1:n]] == \
        [[value for _, value in r.top] for r in records[1:]]
    assert logprobs.tokens[n:] == plain_choice.logprobs.tokens
    assert logprobs.token_logprobs[n:] == plain_choice.logprobs.token_logprobs
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    assert echoed.usage.prompt_tokens == n and echoed.usage.completion_tokens == plain.usage.completion_tokens

    streamed = list(sdk.completions.create(model="demo", prompt=PROMPT, max_tokens=5, logprobs=2, echo=True,
                                           stream=True, **SEEDED))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    values = [v for c in streamed if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert tokens == logprobs.tokens and values == logprobs.token_logprobs


def test_max_tokens_0_with_echo_scores_the_prompt_alone(inprocess_daphne, engine):
    sdk = sdk_for(inprocess_daphne.address)
    ids = engine.tokenizer.encode(PROMPT)
    scored = sdk.completions.create(model="demo", prompt=[ids], max_tokens=0, logprobs=1, echo=True, temperature=0)
    [choice] = scored.choices
    assert choice.text == engine.tokenizer.decode(ids) and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(ids), "the one token generated is left out"
    assert choice.logprobs.token_logprobs == [None] + [r.logprob for r in prompt_records(engine, ids, 1)[1:]]
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == len(ids)
    streamed = list(sdk.completions.create(model="demo", prompt=ids, max_tokens=0, logprobs=1, echo=True,
                                           temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == choice.text
    assert [v for c in streamed if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs] == \
        choice.logprobs.token_logprobs
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        sdk.completions.create(model="demo", prompt=PROMPT, max_tokens=0)  # scoring alone needs echo


def test_vllms_prompt_logprobs_on_completions_and_chat(inprocess_daphne, engine):
    sdk = sdk_for(inprocess_daphne.address)
    reply = sdk.completions.create(model="demo", prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 3},
                                   **SEEDED)
    shaped = reply.model_dump()["choices"][0]["prompt_logprobs"]
    records = prompt_records(engine, PROMPT, 3)
    assert shaped[0] is None and len(shaped) == len(records)
    for entry, record in zip(shaped[1:], records[1:]):
        expected = {record.token_id: record.logprob, **dict(record.top)}
        assert {int(k): v["logprob"] for k, v in entry.items()} == expected
        assert all(isinstance(v["decoded_token"], str) for v in entry.values())
    assert reply.choices[0].logprobs is None, "prompt_logprobs alone asks nothing of the completion's tokens"

    messages = [{"role": "user", "content": "Name a list method."}]
    chat = sdk.chat.completions.create(model="demo", messages=messages, max_tokens=2, extra_body={"prompt_logprobs": 0},
                                       **SEEDED)
    chat_prompt = engine.tokenizer.encode_chat(messages)
    chat_records = prompt_records(engine, chat_prompt, 0)
    assert chat.model_dump()["prompt_logprobs"] == [None] + [
        {str(r.token_id): {"logprob": r.logprob, "decoded_token": engine.tokenizer.decode([r.token_id],
                                                                                          skip_special_tokens=False)}}
        for r in chat_records[1:]]


@pytest.mark.parametrize("path, body, param", [
    ("completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("completions", {"prompt": PROMPT, "prompt_logprobs": 21}, "prompt_logprobs"),
    ("completions", {"prompt": PROMPT, "echo": "yes"}, "echo"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo"),
])
def test_refusals_name_their_field(inprocess_daphne, path, body, param):
    _, token = Session(inprocess_daphne.address).sign_up(unique_name("echo")).new_token("raw")
    response = httpx.post(f"http://{inprocess_daphne.address}/v1/{path}", headers={"Authorization": f"Bearer {token}"},
                          content=json.dumps({"model": "demo", "max_tokens": 2, **body}), timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
