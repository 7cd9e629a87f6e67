"""Our Llama-family model against HF transformers on the same weights: logits and greedy decoding.

Random tiny configs cover each switch the architectures differ in: GQA, llama3 and linear RoPE
scaling, tied and untied embeddings, Qwen2's q/k/v bias, Mistral's sliding window (smaller than the
sequence, so the mask really cuts), Qwen3's q/k norms, Phi-3's fused projections, and Gemma 3's
norms, GeGLU, embedding and attention scales and mix of windowed and full layers.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from engine import Engine, EngineConfig, SamplingParams
from engine.loading.loader import load_model
from engine.model.attention_metadata import AttentionMetadata
from engine.scheduler.kv_cache import KVShape, PagedKVCache

RELATIVE_TOLERANCE = 1e-4

CASES = {
    "llama-llama3-rope-untied": ("llama", dict(tie_word_embeddings=False, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})),
    "llama-linear-rope-tied-mlp-bias": ("llama", dict(tie_word_embeddings=True, mlp_bias=True, attention_bias=True,
                                                      rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral-sliding-window": ("mistral", dict(sliding_window=16, rope_theta=1e6)),
    "qwen2-bias-tied": ("qwen2", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    "qwen3-qk-norm": ("qwen3", dict(head_dim=32, tie_word_embeddings=False)),
    "phi3-fused": ("phi3", dict(pad_token_id=0)),
    # Windowed and full layers, each RoPE base its own, an attention scale not head_dim's, the window
    # shorter than the sequences so it really cuts.
    "gemma3-sandwich-window": ("gemma3_text", dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=12, rope_local_base_freq=100.0,
        rope_theta=1e5, layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
}


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def hf_model(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # No EOS: HF then decodes every step like our ignore_eos (min_new_tokens would instead forbid the
    # EOS token, a different greedy path).
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(params=sorted(CASES))
def checkpoint(request, built_checkpoints):
    """Each case's checkpoint (read only here, so the session's build itself)."""
    model_type, overrides = CASES[request.param]
    # A fixed seed per case (str hashes change between processes): greedy runs must be reproducible.
    return built_checkpoints(model_type, seed=sorted(CASES).index(request.param), **overrides)


@torch.no_grad()
def test_full_sequence_logits_match_hf(checkpoint):
    reference = hf_model(checkpoint)
    ours = load_model(checkpoint).model
    ids = torch.randint(0, 4096, (2, 40), generator=torch.Generator().manual_seed(1))
    expected = reference(ids).logits
    got = ours.logits(ours(ids, torch.arange(40).expand(2, 40)))
    assert relative_error(got, expected) < RELATIVE_TOLERANCE


@torch.no_grad()
def test_paged_prefill_then_decode_logits_match_hf(checkpoint):
    """Prefill 25 tokens into scattered blocks, then decode 15 one at a time across block boundaries."""
    reference = hf_model(checkpoint)
    loaded = load_model(checkpoint)
    model, config = loaded.model, loaded.config
    ids = torch.randint(0, 4096, (40,), generator=torch.Generator().manual_seed(2))
    expected = reference(ids[None]).logits[0]
    cache = PagedKVCache(KVShape.of(config), num_blocks=16, block_size=4, dtype=torch.float32, device="cpu")
    table = [9, 2, 14, 0, 7, 3, 11, 5, 1, 12]  # deliberately not in order

    def step(start: int, count: int) -> torch.Tensor:
        md = AttentionMetadata.build(block_size=4, block_tables=[table], cached_lens=[start], query_lens=[count],
                                     sliding_window=config.sliding_window,
                                     some_layers_windowed=config.mixes_windows)
        return model.logits(model(ids[start:start + count], md.positions, md, cache))

    got = [step(0, 25)] + [step(t, 1) for t in range(25, 40)]
    assert relative_error(torch.cat(got), expected) < RELATIVE_TOLERANCE


def test_greedy_decoding_matches_hf_generate_for_64_steps(checkpoint):
    reference = hf_model(checkpoint)
    engine = Engine(EngineConfig(model=str(checkpoint), block_size=8))
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 4096, (n,), generator=generator).tolist() for n in (1, 7, 30)]
    results = engine.generate(prompts, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    for prompt, result in zip(prompts, results):
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False, pad_token_id=0)
        expected = out[0, len(prompt):].tolist()
        assert len(set(expected)) > 3, "liveness: the reference must not be a constant run"
        assert result.token_ids == expected
        assert result.finish_reason == "length"


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_track_hf_in_the_same_dtype(tiny_checkpoint, dtype):
    path = tiny_checkpoint("llama", seed=7)
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    ours = load_model(path, dtype=name).model
    assert ours.lm_head.weight.dtype == dtype
    ids = torch.randint(0, 4096, (1, 24), generator=torch.Generator().manual_seed(4))
    expected = reference(ids).logits.float()
    got = ours.logits(ours(ids, torch.arange(24)[None])).float()
    # Half precision rounds differently along the way; the two must still agree closely.
    assert relative_error(got, expected) < 2e-2
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9
