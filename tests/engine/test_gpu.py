"""The engine on a CUDA device: HF parity, and captured CUDA graphs with the device loop checked by
replay verification and against eager decoding. Marked gpu: skipped without CUDA; bench/gpu_check.sh
runs them on a GPU machine."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from engine import Engine, EngineConfig, PromptError, SamplingParams
from engine.sampling_params import InvalidSamplingParams
from engine.decode.block_table import DeviceBlockTable
from engine.decode.graphs import DecodeGraphs, GraphMode
from engine.kernels.host_copy import padded_rows
from engine.loading.loader import load_model
from engine.model.attention import Attention
from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ModelConfig

pytestmark = pytest.mark.gpu
GREEDY = dict(temperature=0, ignore_eos=True)
# As many prompts as a graph bucket holds, so the graph replays with no padding rows: cuBLAS picks its
# kernels by the row count, and eager on 5 rows against a graph of 5 padded to 8 may flip a near-tie.
PROMPTS = ["class Node:", "import os", [5, 6, 7], "def f(x):\n    return", "The list type", "A dictionary is",
           "Return the number of", [9, 10, 11, 12]]


@torch.no_grad()
def test_cuda_logits_match_hf(checkpoint):
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).cuda().eval()
    ours = load_model(checkpoint, device="cuda").model
    ids = torch.randint(0, 4096, (2, 40), device="cuda")
    expected = reference(ids).logits
    got = ours.logits(ours(ids, torch.arange(40, device="cuda").expand(2, 40)))
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-3


def test_cuda_graphs_with_the_device_loop_replay_exactly_and_decode_like_eager(checkpoint):
    assert DecodeGraphs.bucket_for(len(PROMPTS)) == len(PROMPTS)
    params = SamplingParams(max_tokens=24, **GREEDY)
    eager = Engine(EngineConfig(model=str(checkpoint), device="cuda", graphs=False, device_loop=False))
    expected = [r.token_ids for r in eager.generate(PROMPTS, params)]
    engine = Engine(EngineConfig(model=str(checkpoint), device="cuda", graphs=True, capture_stream=True,
                                 device_loop=True, verify_always=True, layer_bisect=True))
    got = [r.token_ids for r in engine.generate(PROMPTS, params)]
    graphs = engine.runner.graphs
    assert graphs.mode is GraphMode.CUDA_GRAPHS, graphs.refusal
    records = list(graphs.verify.records)
    print(f"\n{len(records)} verified replays, max |delta| {max(r.max_abs_delta for r in records):.3e}")
    assert records and all(r.argmax_agrees for r in records)
    assert {(r.rows, r.bucket) for r in records} == {(len(PROMPTS), len(PROMPTS))}, "eager decodes as many rows"
    assert engine.device_loop.bursts > 0
    assert got == expected


def test_cuda_without_capture_stream_is_inert_and_still_exact(checkpoint):
    assert DecodeGraphs.bucket_for(2) == 2  # the inert static buffers hold no padding rows either
    params = SamplingParams(max_tokens=12, **GREEDY)
    engine = Engine(EngineConfig(model=str(checkpoint), device="cuda", graphs=True, capture_stream=False))
    assert engine.runner.graphs.mode is GraphMode.INERT
    got = engine.generate(PROMPTS[:2], params)
    eager = Engine(EngineConfig(model=str(checkpoint), device="cuda", graphs=False)).generate(PROMPTS[:2], params)
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]


def test_out_of_vocabulary_ids_never_reach_a_cuda_index(checkpoint):
    """On CUDA an index past a tensor's end is a device-side assert, and it is sticky: every later CUDA call
    of the process fails. So every token id a request brings (prompt ids, stop tokens the sampler masks
    under min_tokens) is refused at add_request, and the same engine then serves on."""
    engine = Engine(EngineConfig(model=str(checkpoint), device="cuda"))
    vocabulary = engine.runner.loaded.config.vocab_size
    with pytest.raises(PromptError, match="outside the vocabulary"):
        engine.add_request("prompt", [1, vocabulary], SamplingParams(max_tokens=2, **GREEDY))
    params = SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[vocabulary + 7], **GREEDY)
    with pytest.raises(InvalidSamplingParams, match="not a token id of this model"):
        engine.add_request("stop", "Hi", params)
    assert not engine.has_unfinished_requests()
    [served] = engine.generate(["Hi"], SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[vocabulary - 1],
                                                      **GREEDY))
    torch.cuda.synchronize()  # a device-side assert would surface here
    assert len(served.token_ids) >= 2, "liveness: the engine serves after the refusals"


@torch.no_grad()
def test_a_prefill_after_cached_keys_runs_on_the_flash_kernel():
    """A prompt chunk after cached keys (a prefix-cache hit, a chunked prefill) in bfloat16 with GQA at the 1B
    shape: with SDPA's math kernel turned off it still runs (a mask tensor would leave GQA nothing else),
    and gives the math kernel's result within bfloat16's tolerance."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config = ModelConfig(model_type="llama", vocab_size=16, hidden_size=2048, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         max_position_embeddings=4096)
    layer = Attention(config).cuda()
    block, cached, chunk = 16, 200, 56
    metadata = AttentionMetadata.build(block_size=block, block_tables=[list(range(1, 17))], cached_lens=[cached],
                                       query_lens=[chunk], device="cuda", dtype=torch.bfloat16)
    [prefill] = metadata.prefills
    assert prefill.attn_mask is None and prefill.key_len == cached + chunk
    gen = torch.Generator(device="cuda").manual_seed(7)
    cache = tuple(torch.randn(17 * block, 8, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in "kv")
    q, k, v = (torch.randn(chunk, h, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for h in (32, 8, 8))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        flash = layer._prefill(q, (k, v), cache, prefill, block)
    with sdpa_kernel([SDPBackend.MATH]):
        math = layer._prefill(q, (k, v), cache, prefill, block)
    torch.testing.assert_close(flash, math, atol=2e-2, rtol=2e-2)


@torch.no_grad()
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_cuda_every_request_gets_its_solo_tokens_in_a_mixed_batch_with_nothing_forgiven(tiny_checkpoint, dtype):
    """The CPU's oracle (tests/engine/test_batch_invariance.py) on CUDA, where the float projections take
    the invariant Triton GEMM and every serving step the Triton kernels: sixteen staggered requests (greedy
    and seeded sampling), two aborted, a pool small enough to swap sequences out, graphs padded to their
    buckets and the device loop; each request gets its solo run's tokens, no near-tie forgiven. Prefix
    caching off and preemption by swap, so that a prompt is prefilled whole in both runs: a chunk after
    cached keys or a re-prefill after a recompute takes SDPA at another shape, not claimed invariant."""
    from tests.engine.test_batch_invariance import run_mixed, workload

    rng = random.Random(7)
    requests = workload(rng)
    base = dict(model=str(tiny_checkpoint("llama", seed=21)), device="cuda", dtype=dtype, block_size=4,
                prefix_caching=False)
    alone = Engine(EngineConfig(**base, graphs=False, device_loop=False))
    solo = {rid: alone.generate([prompt], params)[0].token_ids for rid, prompt, params in requests}
    engine = Engine(EngineConfig(**base, num_kv_blocks=30, swap_blocks=64, device_loop=True, verify_always=True))
    model = engine.loaded.model
    assert model.invariant_gemm and model.decode_attention == "triton", "liveness: the invariant kernels serve"
    aborts = {"req-5": 3, "req-10": 9}
    deltas = run_mixed(engine, requests, aborts, rng)
    for rid, _, _ in requests:
        got = [token for delta in deltas[rid] for token in delta.token_ids]
        assert got == (solo[rid][: len(got)] if rid in aborts else solo[rid]), rid
    assert engine.scheduler.num_preemptions > 0, "liveness: the small pool swapped sequences out"
    assert engine.runner.graphs.replays > 0 and engine.device_loop.bursts > 0


def test_the_block_table_updated_in_place_on_cuda_is_each_steps_table():
    """The pinned host rows are rewritten while earlier copies may still be queued: every step's table,
    and every table handed out before it, equal the ones built afresh."""
    device = torch.device("cuda")
    table = DeviceBlockTable(rows=16, blocks=64, pad=999, device=device)
    rng = random.Random(0)
    live = [[rng.randrange(900) for _ in range(rng.randint(1, 40))] for _ in range(12)]
    handed_out = []
    for step in range(200):
        row = live[rng.randrange(len(live))]
        if step % 7 == 0:
            row[:] = [rng.randrange(900) for _ in range(rng.randint(1, 40))]
        elif len(row) < 64:
            row.append(rng.randrange(900))
        rng.shuffle(live)
        height, width = 16, max(len(t) for t in live)
        handed_out.append((table.table(live, height, width), padded_rows(live, width, pad=999, height=height)))
    torch.cuda.synchronize()
    for got, expected in handed_out:
        assert torch.equal(got.cpu(), expected)
