"""vLLM's endpoints beside /v1 (GET /health, GET /version, POST /tokenize, POST /detokenize) and the
OpenAI fields that were once silently ignored (logit_bias, echo, suffix), through Django's async client
against the real transports: the in-process engine, real Celery workers, and a Celery transport with
no worker at all."""

from __future__ import annotations

import asyncio
import json
from importlib.metadata import version

import pytest
from django.conf import settings
from django.test import AsyncClient
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.processors import TemplateProcessing

from engine.loading.model_files import DEMO_MODEL_DIR, load_model_config
from engine.loading.tokenizer import Tokenizer
from tests.cluster import Cluster
from tests.workbench.test_celery_cluster import served_by
from workbench.api.tokenize_views import tokenize_body
from workbench.serving import bridge
from workbench.serving.inprocess import InProcessTransport

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a tuple?"}]
PROMPTS = ["The list type", "héllo wörld ✓", "  spaces\n\ttabs"]


async def get(path: str) -> tuple[int, dict]:
    response = await AsyncClient().get(path)
    return response.status_code, json.loads(response.content)


async def post(path: str, body: dict | bytes, token: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, bytes) else json.dumps(body)
    response = await AsyncClient().post(path, data=data, content_type="application/json", headers=headers)
    return response.status_code, json.loads(response.content)


async def until_healthy(timeout: float = 60) -> tuple[int, dict]:
    deadline = asyncio.get_running_loop().time() + timeout
    while (answer := await get("/health"))[0] != 200 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return answer


# -- /health and /version ---------------------------------------------------------------------------

@pytest.mark.asyncio
@pytest.mark.usefixtures("serving_transport")
async def test_health_is_200_without_a_token_while_an_engine_answers():
    await bridge.transport_from_loop()
    assert await get("/health") == (200, {"status": "ok"})


@pytest.mark.asyncio
async def test_the_first_probe_starts_the_engine_and_health_is_503_until_it_serves():
    bridge.shutdown()  # a server nothing has used yet
    assert await get("/health") == (503, {"status": "starting"})
    assert await until_healthy() == (200, {"status": "ok"}), "the probe itself started the engine"
    assert isinstance(bridge.running(), InProcessTransport)


@pytest.mark.asyncio
async def test_health_is_503_once_the_engine_host_has_stopped():
    transport = await bridge.transport_from_loop()
    try:
        assert await get("/health") == (200, {"status": "ok"})  # the control: it answered before
        await asyncio.to_thread(transport.stop)
        assert await get("/health") == (503, {"status": "unavailable"})
    finally:
        bridge.shutdown()  # the next use starts a fresh engine


@pytest.mark.asyncio
async def test_health_is_503_with_a_celery_transport_and_no_live_worker(tmp_path):
    """A real Celery transport on the machine's Redis, under a queue prefix no worker serves."""
    cluster = Cluster(settings.REDIS_URL, tmp_path)
    try:
        with served_by(cluster) as transport:
            assert transport.workers() == {}
            assert await get("/health") == (503, {"status": "unavailable"})
    finally:
        cluster.stop()


@pytest.mark.asyncio
async def test_version_is_the_installed_package_version_without_a_token():
    assert await get("/version") == (200, {"version": version("workbench")})
    status, answer = await post("/version", {}, None)
    assert status == 405 and answer["error"]["message"] == "use GET"


# -- /tokenize and /detokenize ----------------------------------------------------------------------

@pytest.mark.asyncio
async def test_tokenize_and_detokenize_round_trip_with_the_served_tokenizer(serving_transport, api_user):
    _, token = api_user
    transport = await bridge.transport_from_loop()
    tokenizer, length = transport.tokenizer, load_model_config(settings.WORKBENCH_MODEL).max_position_embeddings
    if isinstance(transport, InProcessTransport):
        assert transport.host.engine.max_model_len == length, "max_model_len is what the engine serves"
    for prompt in PROMPTS:
        status, answer = await post("/tokenize", {"prompt": prompt}, token)
        ids = tokenizer.encode(prompt)
        assert status == 200 and answer == {"tokens": ids, "count": len(ids), "max_model_len": length}, prompt
        status, bare = await post("/tokenize", {"prompt": prompt, "add_special_tokens": False}, token)
        assert status == 200 and bare["tokens"] == tokenizer.encode(prompt, add_special_tokens=False)
        assert await post("/detokenize", {"tokens": ids}, token) == (200, {"prompt": prompt})
        status, completion = await post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "seed": 0}, token)
        assert status == 200 and completion["usage"]["prompt_tokens"] == len(ids), "the engine counts the same"
    assert await post("/detokenize", {"tokens": []}, token) == (200, {"prompt": ""})


@pytest.mark.asyncio
async def test_tokenize_messages_is_the_chat_template_as_the_engine_is_given_it(api_user):
    _, token = api_user
    tokenizer = (await bridge.transport_from_loop()).tokenizer
    status, answer = await post("/tokenize", {"messages": MESSAGES}, token)
    assert status == 200 and answer["tokens"] == tokenizer.encode_chat(MESSAGES)
    status, chat = await post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "seed": 0}, token)
    assert status == 200 and chat["usage"]["prompt_tokens"] == answer["count"]
    status, without = await post("/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}, token)
    assert status == 200 and without["tokens"] == tokenizer.encode_chat(MESSAGES, add_generation_prompt=False)
    assert without["tokens"] != answer["tokens"], "the demo template's generation prompt is tokens of its own"
    # Special tokens kept, as vLLM's detokenize keeps them: the template's text comes back whole.
    assert await post("/detokenize", {"tokens": answer["tokens"]}, token) == (
        200, {"prompt": tokenizer.apply_chat_template(MESSAGES)})


@pytest.fixture(scope="module")
def bos_tokenizer() -> Tokenizer:
    """The demo tokenizer made to add a BOS of its own (the demo's adds none), so that
    add_special_tokens has something to add."""
    backend = BackendTokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    bos = backend.token_to_id("<|endoftext|>")
    backend.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    demo = Tokenizer.from_dir(DEMO_MODEL_DIR)
    return Tokenizer(backend, json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text()), demo.chat_template)


def test_add_special_tokens_follows_vllm_defaults(bos_tokenizer):
    bos = bos_tokenizer.token_id("<|endoftext|>")
    plain = bos_tokenizer.encode("hi", add_special_tokens=False)
    assert tokenize_body(bos_tokenizer, {"prompt": "hi"}) == [bos, *plain], "a prompt: on by default"
    assert tokenize_body(bos_tokenizer, {"prompt": "hi", "add_special_tokens": False}) == plain
    chat = bos_tokenizer.encode_chat(MESSAGES)
    assert chat[0] != bos
    assert tokenize_body(bos_tokenizer, {"messages": MESSAGES}) == chat, "messages: off by default"
    assert tokenize_body(bos_tokenizer, {"messages": MESSAGES, "add_special_tokens": True}) == [bos, *chat]


@pytest.mark.asyncio
async def test_tokenize_and_detokenize_need_an_api_token(api_user):
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        for token in (None, "wb_not-a-token", "not-even-the-prefix"):
            status, answer = await post(path, body, token)
            assert status == 401 and answer["error"]["code"] == "invalid_api_key", (path, token)
        assert (await post(path, body, api_user[1]))[0] == 200, "the control: with the token it answers"


@pytest.mark.asyncio
async def test_bad_tokenize_and_detokenize_bodies_are_structured_errors_naming_the_field(api_user):
    _, token = api_user
    vocab = (await bridge.transport_from_loop()).tokenizer.vocab_size
    bad = [
        ("/tokenize", {}, 400, "prompt", "invalid_request"),
        ("/tokenize", {"prompt": 5}, 400, "prompt", "invalid_request"),
        ("/tokenize", {"prompt": [1, 2]}, 400, "prompt", "invalid_request"),
        ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, 400, "messages", "invalid_request"),
        ("/tokenize", {"messages": "hi"}, 400, "messages", "invalid_request"),
        ("/tokenize", {"messages": []}, 400, "messages", "invalid_request"),
        ("/tokenize", {"messages": [{"role": "user"}]}, 400, "messages", "invalid_request"),
        ("/tokenize", {"prompt": "hi", "add_special_tokens": 1}, 400, "add_special_tokens", "invalid_request"),
        ("/tokenize", {"messages": MESSAGES, "add_generation_prompt": "yes"}, 400, "add_generation_prompt",
         "invalid_request"),
        ("/tokenize", {"prompt": "hi", "add_generation_prompt": True}, 400, "add_generation_prompt",
         "unsupported_parameter"),
        ("/tokenize", {"prompt": "hi", "return_token_strs": True}, 400, "return_token_strs", "unsupported_parameter"),
        ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, 400, "continue_final_message",
         "unsupported_parameter"),
        ("/tokenize", {"prompt": "hi", "chat_template": "{{ x }}"}, 400, "chat_template", "unsupported_parameter"),
        ("/tokenize", {"prompt": "hi", "model": "gpt-4"}, 404, "model", "model_not_found"),
        ("/detokenize", {}, 400, "tokens", "invalid_request"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens", "invalid_request"),
        ("/detokenize", {"tokens": [1, vocab]}, 400, "tokens", "invalid_request"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens", "invalid_request"),
        ("/detokenize", {"tokens": [True]}, 400, "tokens", "invalid_request"),
        ("/detokenize", {"tokens": [1.0]}, 400, "tokens", "invalid_request"),
        ("/detokenize", {"tokens": [1], "prompt": "hi"}, 400, "prompt", "unsupported_parameter"),
    ]
    for path, body, status, param, code in bad:
        got, answer = await post(path, body, token)
        assert (got, answer["error"]["param"], answer["error"]["code"]) == (status, param, code), (path, body, answer)
        assert answer["error"]["message"] and answer["error"]["type"] == "invalid_request_error"
    status, answer = await post("/detokenize", {"tokens": [1, vocab]}, token)
    assert f"tokens[1]: {vocab} is not a token id" in answer["error"]["message"]
    status, answer = await post("/tokenize", b'{"prompt": ', token)
    assert status == 400 and "not valid JSON" in answer["error"]["message"]
    assert (await AsyncClient().get("/tokenize", headers={"Authorization": f"Bearer {token}"})).status_code == 405
    accepted = {"prompt": "hi", "model": settings.WORKBENCH_MODEL, "return_token_strs": False,
                "add_special_tokens": None}
    assert (await post("/tokenize", accepted, token))[0] == 200, "the control: off values and the served model pass"


# -- fields /v1 does not serve ----------------------------------------------------------------------

REFUSED = [{"logit_bias": {"50256": -100}}, {"logit_bias": []}, {"suffix": "!"}, {"suffix": 0}]
CHAT_REFUSED = [{"echo": True}, {"echo": 1}]  # echo is served on /v1/completions (test_completions_echo.py)
ACCEPTED = [{"logit_bias": {}}, {"echo": False}, {"suffix": ""}, {"logit_bias": None, "echo": None, "suffix": None}]


@pytest.mark.asyncio
async def test_logit_bias_echo_and_suffix_are_refused_by_name_unless_off(api_user):
    _, token = api_user
    for path, prompt, refused in (("/v1/completions", {"prompt": "hi"}, REFUSED),
                                  ("/v1/chat/completions", {"messages": MESSAGES}, REFUSED + CHAT_REFUSED)):
        for fields in refused:
            [name] = fields
            status, answer = await post(path, {**prompt, "max_tokens": 1, **fields}, token)
            assert status == 400, (path, fields, answer)
            assert (answer["error"]["param"], answer["error"]["code"]) == (name, "unsupported_parameter")
            assert name in answer["error"]["message"]
        for fields in ACCEPTED:  # {} as LangChain sends it
            status, answer = await post(path, {**prompt, "max_tokens": 1, "seed": 0, **fields}, token)
            assert status == 200 and answer["usage"]["completion_tokens"] == 1, (path, fields, answer)

