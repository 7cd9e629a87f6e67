"""Workers hosting different models, through the real stack: two Celery workers, one started with the demo
model and one with a tiny random checkpoint (another WORKBENCH_MODEL), and a Daphne over them. /v1/models
lists both; the OpenAI `model` field picks one, and only the worker that has it loaded runs the request
(its log's admissions); the chat page offers a selector (several models served), the chosen model runs
the reply, the reply names and stores it, and the page starts at it again after a reload.

A cluster of its own (docs/TESTING.md): the session's shared workers all serve the demo model, and every
other Celery test expects that.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.cluster import Cluster
from tests.conftest import build_tiny_checkpoint
from tests.e2e.conftest import signed_up_in_a_new_conversation
from tests.e2e.test_chat_render import serious_violations

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """(Daphne address, bob's API token, the cluster, {model: worker id}) over a demo worker and a tiny one."""
    from django.conf import settings

    tiny = str(build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model") / "tiny-llama", "llama"))
    cluster = Cluster(settings.REDIS_URL, tmp_path_factory.mktemp("two-models"), WORKBENCH_MODEL="demo")
    try:
        demo_worker, tiny_worker = cluster.start_workers(2, each=[{}, {"WORKBENCH_MODEL": tiny}])
        address, token = cluster.start_daphne(tmp_path_factory.mktemp("two-models-db") / "db.sqlite3")
        yield address, token, cluster, {"demo": cluster.worker_id(demo_worker), tiny: cluster.worker_id(tiny_worker)}
    finally:
        cluster.stop()


def admitted_by(cluster: Cluster, request_prefix: str) -> list[str]:
    """The workers that admitted the requests whose wire id starts with `request_prefix`."""
    return [worker for wire_id, workers in cluster.admissions().items() if wire_id.startswith(request_prefix)
            for worker in workers]


def test_the_openai_api_lists_both_models_and_each_request_runs_on_a_worker_that_has_its_model(two_models):
    address, token, cluster, workers = two_models
    tiny = next(name for name in workers if name != "demo")
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    assert sorted(model.id for model in client.models.list()) == sorted(workers)

    messages = [{"role": "user", "content": "Hello"}]
    for name in (tiny, "demo", tiny):
        reply = client.chat.completions.create(model=name, messages=messages, max_tokens=3, temperature=0)
        assert reply.model == name
        assert admitted_by(cluster, f"{reply.id}.") == [workers[name]], (name, cluster.admissions())
    unnamed = client.completions.create(model=None, prompt="The list type", max_tokens=2,  # type: ignore[arg-type]
                                        seed=0)
    assert unnamed.model == "demo" and admitted_by(cluster, f"{unnamed.id}.") == [workers["demo"]]

    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=2)
    assert caught.value.body["code"] == "model_not_found"
    assert "'demo'" in caught.value.body["message"] and repr(tiny) in caught.value.body["message"]


def test_the_chat_page_offers_the_models_and_the_one_chosen_answers_and_is_stored(browser, two_models):
    address, _, cluster, workers = two_models
    tiny = next(name for name in workers if name != "demo")
    base = f"http://{address}"
    page = signed_up_in_a_new_conversation(browser, base, "picker")
    conversation = int(page.url.rsplit("/", 1)[1])
    select = page.get_by_label("Model", exact=True)
    assert page.locator("#model-name").count() == 0
    assert sorted(select.locator("option").all_inner_texts()) == sorted(workers)
    assert select.input_value() == "demo", "the default model is chosen at first"
    assert serious_violations(page) == []

    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.click("details summary")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "4")
    select.select_option(tiny)
    page.fill("#input", "Hello")
    page.click("#send")
    meta = page.locator("article.assistant .meta")
    meta.wait_for()
    assert tiny in meta.inner_text()
    assert admitted_by(cluster, f"chat-{conversation}-") == [workers[tiny]], cluster.admissions()

    page.reload()
    assert select.input_value() == tiny, "the page goes on with the model of the last reply"
    assert tiny in meta.inner_text()
    select.select_option("demo")
    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.click("#regenerate")
    page.wait_for_function("document.querySelector('article.assistant .version-count')?.textContent === '2/2'")
    assert sorted(admitted_by(cluster, f"chat-{conversation}-")) == sorted([workers[tiny], workers["demo"]])

    with page.expect_download() as info:
        page.click("#export-json")
    exported = json.loads(open(info.value.path(), encoding="utf-8").read())
    assert exported["model"] == "demo" and exported["messages"][1]["model"] == "demo"
    with page.expect_navigation():
        page.get_by_role("button", name="Previous version").click()
    assert re.search(re.escape(tiny), page.locator("article.assistant .meta").inner_text())
