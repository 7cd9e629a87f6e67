"""A thinking model's reasoning given apart on the routes: the demo model served with a Qwen3-style chat
template (one that knows `<think>` blocks), its reply forced into `<think>...</think>` and an answer by
a regex response_format (a tiny model would not think on its own). Chat completions put the reasoning
in `message.reasoning_content`, and a stream sends it as `reasoning_content` deltas that join to the
whole reply's; the model without such a template keeps its text whole (test_completions_echo.py's
server)."""

from __future__ import annotations

import json
import os
import shutil

import httpx
import pytest

from tests.conftest import serve

TEMPLATE = ("{%- for message in messages %}{%- set content = message['content'] %}"
            "{%- if message['role'] == 'assistant' and '</think>' in content %}"
            "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
            "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
            "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
            "{%- endif %}{%- endif %}")
FORCED = {"type": "regex", "regex": "<think>[a-z ]{3,12}</think>\n\n[a-z ]{3,12}"}
CHAT = {"messages": [{"role": "user", "content": "Where is Paris?"}], "max_tokens": 40, "temperature": 1.0,
        "seed": 8, "response_format": FORCED}  # seeded


@pytest.fixture(scope="module")
def thinking_daphne(demo_dir, tmp_path_factory):
    model = tmp_path_factory.mktemp("thinking") / "model"
    shutil.copytree(demo_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    env = {**os.environ, "WORKBENCH_TRANSPORT": "inprocess", "WORKBENCH_MODEL": str(model)}
    yield from serve(env, tmp_path_factory.mktemp("daphne-thinking") / "db.sqlite3")


def post(served, path: str, body: dict) -> dict:
    response = httpx.post(f"http://{served.address}/v1/{path}", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {served.token}"})
    assert response.status_code == 200, response.text
    return response.json()


def streamed(served, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"http://{served.address}/v1/{path}", json={**body, "stream": True}, timeout=60,
                      headers={"Authorization": f"Bearer {served.token}"}) as response:
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def test_chat_completions_give_the_reasoning_apart_whole_and_streamed(thinking_daphne):
    message = post(thinking_daphne, "chat/completions", CHAT)["choices"][0]["message"]
    reasoning, content = message["reasoning_content"], message["content"]
    assert 3 <= len(reasoning) <= 12 and 3 <= len(content) <= 12 and "<think>" not in content + reasoning
    deltas = [c["choices"][0]["delta"] for c in streamed(thinking_daphne, "chat/completions", CHAT) if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
    assert "".join(d.get("content") or "" for d in deltas) == content
    first_answer = next(n for n, d in enumerate(deltas) if d.get("content"))
    assert all("reasoning_content" not in d for d in deltas[first_answer:]), "the reasoning comes first"


def test_a_plain_completion_keeps_the_text_whole(thinking_daphne):
    text = post(thinking_daphne, "completions", {"prompt": "Hi", "max_tokens": 40, "temperature": 1.0, "seed": 8,
                                                 "response_format": FORCED})["choices"][0]["text"]
    assert text.startswith("<think>") and "</think>\n\n" in text
