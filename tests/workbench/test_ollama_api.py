"""Ollama's native API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version) through the
official `ollama` client against the shared in-process Daphne, and one seeded request through chat
completions, Messages and Ollama's chat giving the same tokens; a route no API serves, under /api or
/v1, is a 404 in that API's error shape, and /v1/models/{id} names one model, in OpenAI's shape or, to
Anthropic's SDK, Anthropic's."""

from __future__ import annotations

import time

import anthropic
import ollama
import openai
import pytest

from tests.cluster import ROOT
from tests.users import unique_name
from tests.workbench.daphne_session import Session

ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What does the list type do?"}]
OPTIONS = {"num_predict": 20, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 11}  # seeded


@pytest.fixture(scope="module")
def served(inprocess_daphne):
    """(address, an API token of a user of this module's own) on the shared in-process Daphne."""
    _, token = Session(inprocess_daphne.address).sign_up(unique_name("ollama")).new_token("sdk")
    return inprocess_daphne.address, token


def client(served, token: str | None = None) -> ollama.Client:
    address, own = served
    return ollama.Client(host=f"http://{address}", headers={"Authorization": f"Bearer {token or own}"})


def test_chat_whole_and_streamed_with_the_done_records_counts(served):
    sdk = client(served)
    began = time.monotonic_ns()
    whole = sdk.chat(model="demo:latest", messages=ASK, options=OPTIONS, stream=False)
    wall = time.monotonic_ns() - began
    assert whole.done and whole.message.role == "assistant" and whole.message.content
    assert whole.done_reason in ("stop", "length") and 1 < whole.eval_count <= 20 and whole.prompt_eval_count > 0
    # Nanoseconds: within the call's own time, and no decode of several tokens takes under a microsecond.
    assert wall >= whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration
    assert whole.eval_duration > 1000 and whole.prompt_eval_duration > 1000
    parts = list(sdk.chat(model="demo", messages=ASK, options=OPTIONS, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content
    last = parts[-1]
    assert (last.done_reason, last.eval_count, last.prompt_eval_count) == (whole.done_reason, whole.eval_count,
                                                                          whole.prompt_eval_count)
    assert last.total_duration > 0 and last.load_duration == 0
    stopped = sdk.chat(model="demo", messages=ASK, options={**OPTIONS, "num_predict": 3}, stream=False)
    assert (stopped.done_reason, stopped.eval_count) == ("length", 3)


def test_generate_list_show_and_version(served):
    sdk = client(served)
    made = sdk.generate(model="demo", prompt="The list type", raw=True, options=OPTIONS, stream=False)
    assert made.done and made.response and made.eval_count > 0
    streamed = "".join(p.response for p in sdk.generate(model="demo", prompt="The list type", raw=True,
                                                        options=OPTIONS, stream=True))
    assert streamed == made.response
    # What the listings show of the demo model (6,557,952 float32 weights in one safetensors file), and the
    # context length where clients look it up: under the family's name, as a GGUF file's key is.
    [listed] = sdk.list().models
    [running] = sdk.ps().models
    weights = (ROOT / "engine/assets/demo/model.safetensors").stat().st_size
    for model in (listed, running):
        assert (model.model, model.size) == ("demo:latest", weights)
        assert (model.details.format, model.details.family, model.details.families, model.details.parameter_size,
                model.details.quantization_level) == ("safetensors", "llama", ["llama"], "6.56M", "F32")
    assert running.size_vram == 0, "served on the CPU: none of it in GPU memory"
    shown = sdk.show("demo:latest")
    assert shown.details == listed.details and "completion" in shown.capabilities
    assert shown.modelinfo[f"{shown.details.family}.context_length"] == 512
    assert (shown.modelinfo["general.architecture"], shown.modelinfo["general.parameter_count"],
            shown.modelinfo["llama.embedding_length"]) == ("llama", 6_557_952, 256)
    with pytest.raises(ollama.ResponseError) as missing:
        sdk.show("llama3")
    assert missing.value.status_code == 404 and "'demo'" in missing.value.error
    templated = sdk.generate(model="demo", prompt="What does the list type do?", system="Be brief.", stream=False,
                             options=OPTIONS)
    chat = sdk.chat(model="demo", messages=ASK, options=OPTIONS, stream=False)
    assert templated.response == chat.message.content, "a generate without raw goes through the chat template"


def test_a_load_request_is_answered_at_once_and_nothing_is_generated(served):
    """What `ollama run` and chat front ends send before the first turn: no prompt, or no messages."""
    sdk = client(served)
    loaded = sdk.generate(model="demo")
    assert (loaded.done, loaded.done_reason, loaded.response, loaded.eval_count) == (True, "load", "", None)
    assert sdk.generate(model="demo", keep_alive=0).done_reason == "unload"
    chat = sdk.chat(model="demo", messages=[])
    assert (chat.done, chat.done_reason, chat.message.content) == (True, "load", "")
    with pytest.raises(ollama.ResponseError) as missing:
        sdk.generate(model="llama3")
    assert missing.value.status_code == 404, "the model is still checked"


def test_refusals_are_ollamas_error_shape(served):
    with pytest.raises(ollama.ResponseError) as caught:
        client(served).chat(model="demo", messages=ASK, options={"num_ctx": 4096}, stream=False)
    assert caught.value.status_code == 400 and "num_ctx" in caught.value.error
    with pytest.raises(ollama.ResponseError) as bad_value:
        client(served).chat(model="demo", messages=ASK, options={"temperature": -1, "seed": 1}, stream=False)
    assert bad_value.value.status_code == 400 and "temperature" in bad_value.value.error
    with pytest.raises(ollama.ResponseError) as unknown:
        client(served, token="wb_wrong").list()
    assert unknown.value.status_code == 401


def test_one_seeded_request_is_the_same_tokens_on_every_route(served):
    """Chat completions (with logprobs), Messages and Ollama's chat: one serving path, one prompt, one draw."""
    address, token = served
    chat = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0).chat.completions.create(
        model="demo", messages=ASK, max_tokens=20, temperature=0.9, top_p=0.95, seed=11, logprobs=True,
        extra_body={"top_k": 40})
    text = chat.choices[0].message.content
    assert text and len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens
    message = anthropic.Anthropic(base_url=f"http://{address}", auth_token=token, max_retries=0).messages.create(
        model="demo", system=ASK[0]["content"], messages=ASK[1:], max_tokens=20,
        extra_body={"temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 11})
    local = client(served).chat(model="demo", messages=ASK, options=OPTIONS, stream=False)
    assert message.content[0].text == local.message.content == text
    assert message.usage.output_tokens == local.eval_count == chat.usage.completion_tokens
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == local.prompt_eval_count \
        == chat.usage.prompt_tokens


def test_the_running_models_are_the_served_ones_and_unserved_routes_say_so_in_each_apis_shape(served):
    sdk = client(served)
    [running] = sdk.ps().models
    assert running.model == "demo:latest" and running.expires_at.year == 9999
    with pytest.raises(ollama.ResponseError) as embed:
        sdk.embed(model="demo", input="hi")  # Ollama clients ask; nothing here embeds
    assert embed.value.status_code == 404 and "POST /api/embed is not served here" in embed.value.error
    assert "/api/chat" in embed.value.error, "the message names what is served"

    address, token = served
    openai_sdk = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    assert openai_sdk.models.retrieve("demo").id == "demo"
    with pytest.raises(openai.NotFoundError) as unknown_model:
        openai_sdk.models.retrieve("gpt-4o")
    assert "'demo'" in unknown_model.value.body["message"]
    with pytest.raises(openai.NotFoundError) as embeddings:
        openai_sdk.embeddings.create(model="demo", input="hi")
    assert embeddings.value.body["code"] == "not_found" and "POST /v1/embeddings" in embeddings.value.body["message"]

    # The same path in Anthropic's shape to Anthropic's SDK (its anthropic-version header), with its key.
    anthropic_sdk = anthropic.Anthropic(base_url=f"http://{address}", api_key=token, max_retries=0)
    page = anthropic_sdk.models.list()
    assert [(m.type, m.id, m.display_name, m.created_at.year) for m in page.data] == [("model", "demo", "demo", 1970)]
    assert (page.has_more, page.first_id, page.last_id) == (False, "demo", "demo")
    assert anthropic_sdk.models.retrieve("demo").display_name == "demo"
    with pytest.raises(anthropic.NotFoundError) as unknown_claude:
        anthropic_sdk.models.retrieve("claude-sonnet-4-5")
    assert unknown_claude.value.body["error"]["type"] == "not_found_error" and "'demo'" in unknown_claude.value.message
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=f"http://{address}", api_key="wb_wrong", max_retries=0).models.list()
