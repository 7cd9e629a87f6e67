"""One seeded, sampled request through each of the five APIs a client may speak (chat completions, completions,
Responses, Messages, Ollama's chat), each through its own official SDK against the shared Daphnes (in-process,
and over the Celery workers): every one gets the same reply, and the two that return logprobs (chat
completions, and completions given the chat template's token ids) the same tokens with the same logprobs, to
the bit. One serving path under five dialects: a translation that dropped or changed a sampling field (a
default of the dialect's own, a name mapped wrong) gives another reply here."""

from __future__ import annotations

import json
import urllib.request

import anthropic
import ollama
import openai

from tests.users import unique_name
from tests.workbench.daphne_session import Session

SYSTEM, QUESTION = "You answer briefly.", "What does the list type do?"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
MAX_TOKENS, SEED, TOP_K = 24, 4, 40  # sampled at temperature 1.0 and top_p 1.0, seeded


def chat_template_ids(address: str, token: str) -> list[int]:
    request = urllib.request.Request(f"http://{address}/tokenize", method="POST",
                                     data=json.dumps({"model": "demo", "messages": MESSAGES}).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)["tokens"]


def test_one_seeded_request_gets_the_same_tokens_through_every_api(daphne_server):
    address, _ = daphne_server
    _, token = Session(address).sign_up(unique_name("five-apis")).new_token("sdk")
    sampling = {"temperature": 1.0, "top_p": 1.0}
    extra = {"seed": SEED, "top_k": TOP_K}
    openai_sdk = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)

    chat = openai_sdk.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=MAX_TOKENS, logprobs=True,
                                              extra_body=extra, **sampling).choices[0]
    completion = openai_sdk.completions.create(model="demo", prompt=chat_template_ids(address, token),
                                               max_tokens=MAX_TOKENS, logprobs=0, extra_body=extra,
                                               **sampling).choices[0]
    response = openai_sdk.responses.create(model="demo", instructions=SYSTEM, input=QUESTION, store=False,
                                           max_output_tokens=MAX_TOKENS, extra_body=extra, **sampling)
    message = anthropic.Anthropic(base_url=f"http://{address}", default_headers={"x-api-key": token},
                                  max_retries=0).messages.create(
        model="demo", system=SYSTEM, messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS,
        extra_body={**sampling, "top_k": TOP_K, "seed": SEED})
    ollama_chat = ollama.Client(host=f"http://{address}", headers={"Authorization": f"Bearer {token}"}).chat(
        model="demo", messages=MESSAGES, stream=False,
        options={"num_predict": MAX_TOKENS, "seed": SEED, "top_k": TOP_K, **sampling})

    reply = chat.message.content
    assert reply and chat.finish_reason in ("stop", "length"), "liveness: the chat route answered"
    assert {"completions": completion.text, "responses": response.output_text, "messages": message.content[0].text,
            "ollama": ollama_chat.message.content} == dict.fromkeys(
        ["completions", "responses", "messages", "ollama"], reply)
    chat_tokens = [(t.token, t.logprob) for t in chat.logprobs.content]
    assert chat_tokens == list(zip(completion.logprobs.tokens, completion.logprobs.token_logprobs)), \
        "the same tokens with the same logprobs, bit for bit"
