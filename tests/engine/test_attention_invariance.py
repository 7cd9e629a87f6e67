"""Request independence through the native CPU attention op (engine/kernels/cpu/paged_attention.py), end to end.

Several prompts alone, all in one batch, and beside a long prompt fed in chunks of a small step budget
(16 tokens), greedy with logprobs. The rows of a step meet in attention (the native op: each row over
its own keys, in an order fixed by them) and in the linears (the dense kernel, engine/kernels/cpu/dense.py,
each row in a fixed order too), so in bfloat16 and float32 alike the whole answer holds: tokens and
logprobs bitwise the same in every company. torch's F.linear would not promise it (MKL took different
kernels for one row and several on a 2-core AVX2 EPYC; oneDNN's AMX tiles follow the row count on a Xeon).
The op's own guarantee is also checked inside the running engine: every row of every attention call is
bitwise what the op gives that row alone, over the same cache.
"""

from __future__ import annotations

import pytest
import torch

from engine.kernels import cpu as cpu_kernels
from engine import Engine, EngineConfig, SamplingParams

# The native CPU kernels: the torch attention path promises no bit invariance.
pytestmark = pytest.mark.usefixtures("native_cpu_kernels")

PROMPTS = [[11, 12, 13], [(5 * i) % 4000 + 7 for i in range(9)], [300 + i for i in range(20)], [42]]
LONG = [(7 * i) % 3000 + 5 for i in range(70)]  # fed in chunks beside the others' decodes
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3)
MODES: dict[str, dict] = {"host-decode": {},
                          "graphs+device-loop+verify": {"graphs": True, "device_loop": True, "verify_always": True}}


def engine(checkpoint, dtype: str, **overrides) -> Engine:
    config = {"model": str(checkpoint), "block_size": 4, "num_kv_blocks": 200, "dtype": dtype, "device_loop": False,
              "graphs": False}
    return Engine(EngineConfig(**{**config, **overrides}))


def run_beside_chunked_prompt(chunked: Engine) -> dict[str, tuple]:
    """The short prompts first; once they decode, the long one, fed 16 tokens a step beside them."""
    outputs: dict[str, list] = {}

    def step() -> None:
        for out in chunked.step():
            outputs.setdefault(out.request_id, []).append(out)

    for i, prompt in enumerate(PROMPTS):
        chunked.add_request(str(i), prompt, GREEDY)
    step()
    chunked.add_request("long", LONG, GREEDY)
    chunk_steps = 0
    while chunked.has_unfinished_requests():
        chunk_steps += any(s.num_cached < len(LONG) for s in chunked.live_sequences() if s.request_id == "long")
        step()
    assert chunk_steps >= 4, "liveness: the long prompt really went in chunks"
    return {rid: (tuple(t for o in outs for t in o.token_ids), tuple(lp for o in outs for lp in o.logprobs))
            for rid, outs in outputs.items()}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("mode", MODES)
def test_tokens_and_logprobs_alone_batched_or_beside_a_chunked_prompt(tiny_checkpoint, mode, dtype):
    """An HF directory's float weights, served in either dtype: every projection on the dense kernel."""
    checkpoint = tiny_checkpoint("llama", seed=31)
    solo = engine(checkpoint, dtype, **MODES[mode])
    names = [str(i) for i in range(len(PROMPTS))] + ["long"]
    alone = {}
    for name, prompt in zip(names, PROMPTS + [LONG]):
        [result] = solo.generate([prompt], GREEDY)
        alone[name] = (tuple(result.token_ids), tuple(result.logprobs))
    batched = engine(checkpoint, dtype, **MODES[mode]).generate(PROMPTS + [LONG], GREEDY)
    for name, result in zip(names, batched):
        assert (tuple(result.token_ids), tuple(result.logprobs)) == alone[name], f"prompt {name} in one batch"
    chunked = engine(checkpoint, dtype, max_num_batched_tokens=16, max_prefill_beside_decodes=16, **MODES[mode])
    assert run_beside_chunked_prompt(chunked) == alone, "beside a chunked prompt"
    assert len({tokens for tokens, _ in alone.values()}) == len(alone), "liveness: the prompts' answers differ"
    if MODES[mode]:
        assert chunked.runner.graphs.replays > 0, "liveness: decode steps replayed graphs"
        assert all(r.max_abs_delta == 0.0 for r in chunked.runner.graphs.verify.records)


@pytest.mark.parametrize("mode", MODES)
def test_float32_every_attention_row_is_its_alone_result_in_a_running_engine(tiny_checkpoint, monkeypatch, mode):
    calls = {"rows": 0, "mixed": 0}
    op = cpu_kernels.paged_attention

    def checking(q, key_cache, value_cache, block_tables, token_sequence, positions, block_size, window, scale):
        out = op(q, key_cache, value_cache, block_tables, token_sequence, positions, block_size, window, scale)
        for t in range(q.shape[0]):
            row = token_sequence[t:t + 1]
            alone = op(q[t:t + 1], key_cache, value_cache, block_tables[row], torch.zeros_like(row),
                       positions[t:t + 1], block_size, window, scale)
            assert torch.equal(out[t:t + 1], alone), f"row {t} of {q.shape[0]} differs from its alone result"
        calls["rows"] += q.shape[0]
        calls["mixed"] += int(token_sequence.unique().numel() > 1 and q.shape[0] > token_sequence.unique().numel())
        return out

    monkeypatch.setattr(cpu_kernels, "paged_attention", checking)
    chunked = engine(tiny_checkpoint("llama", seed=31), "float32", max_num_batched_tokens=16,
                     max_prefill_beside_decodes=16, **MODES[mode])
    run_beside_chunked_prompt(chunked)
    assert calls["mixed"] > 0 and calls["rows"] > 100, f"liveness: decodes beside chunks were checked: {calls}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_kernel_path_this_cpu_runs_gives_the_same_bits_alone_and_batched(tiny_checkpoint, monkeypatch, dtype):
    """Each path forced in turn (WORKBENCH_CPU_KERNEL) for every native op of the step: the kernels write
    one arithmetic for all paths, so the answers agree across paths as well as across companies."""
    checkpoint = tiny_checkpoint("llama", seed=31)
    answers = {}
    for path in cpu_kernels.cpu_paths():
        monkeypatch.setenv("WORKBENCH_CPU_KERNEL", path)
        alone = [engine(checkpoint, dtype).generate([prompt], GREEDY)[0] for prompt in PROMPTS]
        batched = engine(checkpoint, dtype).generate(PROMPTS, GREEDY)
        answers[path] = [(tuple(r.token_ids), tuple(r.logprobs)) for r in alone]
        assert [(tuple(r.token_ids), tuple(r.logprobs)) for r in batched] == answers[path], f"{path}: batched"
    assert len(answers) >= 2, f"liveness: this CPU runs only {list(answers)}"
    first = next(iter(answers.values()))
    assert all(a == first for a in answers.values()), "the paths disagree"


def test_a_served_model_stays_on_the_dense_kernel_outside_inference_mode(tiny_checkpoint, monkeypatch):
    """A forward with autograd on (a script, a reference computed without no_grad) must not fall back to
    F.linear, whose rows change bits with the row count: serving freezes the parameters."""
    model = engine(tiny_checkpoint("llama", seed=31), "float32").runner.loaded.model
    calls = []
    real = cpu_kernels.dense_linear
    monkeypatch.setattr(cpu_kernels, "dense_linear", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    assert torch.is_grad_enabled(), "liveness: autograd is on"
    model.logits(model(torch.tensor([[5, 6, 7]]), torch.arange(3)[None]))
    assert calls, "the projections took F.linear"
