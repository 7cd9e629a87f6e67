"""lm-evaluation-harness, unchanged, against a real Daphne: its `local-completions` model runs a small
multiple-choice task (tests/workbench/lm_eval_tiny_mc.jsonl, four questions) through /v1/completions with
`echo` and `logprobs`, and each of its loglikelihoods is the sum of the engine's own prompt logprobs of
the continuation's tokens, for the same token ids (an engine in this process over the same model).

lm-eval tokenizes on its side (the demo model's tokenizer.json through transformers) and sends token
ids; the datasets library reads the local JSONL file, offline. lm-eval[api] is a test dependency
(pyproject.toml); skipped where it is not installed.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.users import unique_name
from tests.workbench.daphne_session import Session

TASK_FILE = Path(__file__).with_name("lm_eval_tiny_mc.jsonl")


def task_config() -> dict:
    return {"task": "workbench_tiny_mc", "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(TASK_FILE)}}, "test_split": "test",
            "output_type": "multiple_choice", "doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}]}


def test_local_completions_loglikelihoods_are_the_engines_prompt_logprobs(inprocess_daphne, demo_dir, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm_eval = pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity")  # lm-eval[api], what its API models need
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    _, token = Session(inprocess_daphne.address).sign_up(unique_name("lmeval")).new_token("lm-eval")
    lm = LocalCompletionsAPI(base_url=f"http://{inprocess_daphne.address}/v1/completions", model="demo",
                             tokenizer_backend="huggingface", tokenizer=str(demo_dir), max_retries=1,
                             header={"Authorization": f"Bearer {token}"})
    # Without lm-eval's own task library: indexing its thousands of task files is most of the run.
    results = lm_eval.simple_evaluate(model=lm, tasks=[task_config()], log_samples=True,
                                      task_manager=TaskManager(include_defaults=False))
    samples = results["samples"]["workbench_tiny_mc"]
    assert len(samples) == 4 and sum(len(s["arguments"]) for s in samples) == 12, "liveness: every choice scored"

    engine = Engine(EngineConfig(model="demo"))
    for sample in samples:
        for (context, continuation), [(loglikelihood, _)] in zip(sample["arguments"], sample["resps"]):
            context_ids, continuation_ids = lm._encode_pair(context, continuation)
            [result] = engine.generate([context_ids + continuation_ids],
                                       SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
            ours = [r.logprob for r in result.prompt_logprobs[len(context_ids):]]
            assert len(ours) == len(continuation_ids)
            assert math.fsum(ours) == pytest.approx(loglikelihood, abs=1e-9)
            assert loglikelihood == sum(ours), "lm-eval's own sum of the values the server sent"
    assert 0 <= results["results"]["workbench_tiny_mc"]["acc,none"] <= 1
