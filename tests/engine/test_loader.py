"""load_model: what it loads (single and sharded safetensors, tied heads, dtypes, EOS ids) and how it
refuses a broken directory.

Good directories are checked against HF transformers (its state dict, its GenerationConfig). Broken ones
start from a fresh `tiny_checkpoint` that each test damages in one way; every refusal must be a
ModelLoadError whose message names what is wrong (the file, the tensor, the shapes, the model_type).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from engine.loading.loader import ModelLoadError, load_model
from engine.loading.model_files import DEMO_MODEL_DIR, resolve_model_path

WEIGHTS = "model.safetensors"


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data), encoding="utf-8")


def edit_weights(checkpoint: Path, edit) -> None:
    """Rewrite model.safetensors after `edit(tensors)` changes the name -> tensor dict in place."""
    tensors = load_file(checkpoint / WEIGHTS)
    edit(tensors)
    save_file(tensors, checkpoint / WEIGHTS, metadata={"format": "pt"})


def raises_load_error(path: Path | str, *fragments: str, **kwargs) -> str:
    """Load, expect ModelLoadError, and check the message contains every fragment; returns it."""
    with pytest.raises(ModelLoadError) as error:
        load_model(path, **kwargs)
    message = str(error.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def logits(loaded, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model.logits(loaded.model(ids[None], torch.arange(len(ids))[None]))


def assert_matches_hf_weights(loaded, checkpoint: Path, dtype: torch.dtype = torch.float32) -> None:
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).state_dict()
    ours = loaded.model.state_dict()
    assert set(ours) == set(reference)
    for name, tensor in ours.items():
        assert tensor.dtype == dtype, name
        assert torch.equal(tensor, reference[name].to(dtype)), name


# --- what loads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_weights_equal_hf(tiny_checkpoint, model_type):
    checkpoint = tiny_checkpoint(model_type)
    loaded = load_model(checkpoint)
    assert loaded.config.model_type == model_type
    assert_matches_hf_weights(loaded, checkpoint)


def test_sharded_checkpoint_matches_unsharded(tiny_checkpoint, tmp_path):
    single = tiny_checkpoint("llama", seed=3)
    sharded = tmp_path / "sharded"
    transformers.AutoModelForCausalLM.from_pretrained(single).save_pretrained(sharded, max_shard_size="200KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((single / name).read_bytes())
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / WEIGHTS).exists()
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 1

    from_shards, from_single = load_model(sharded), load_model(single)
    assert_matches_hf_weights(from_shards, single)
    ids = torch.tensor(from_single.tokenizer.encode("Sharded and single files hold the same weights."))
    assert torch.equal(logits(from_shards, ids), logits(from_single, ids))


def test_tied_checkpoint_without_lm_head_shares_embedding(tiny_checkpoint):
    checkpoint = tiny_checkpoint("qwen2", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(checkpoint / WEIGHTS)
    model = load_model(checkpoint).model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    reference = load_file(checkpoint / WEIGHTS)["model.embed_tokens.weight"]
    assert torch.equal(model.lm_head.weight, reference)


def test_untied_checkpoint_without_lm_head_is_refused(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama", tie_word_embeddings=False)
    edit_weights(checkpoint, lambda tensors: tensors.pop("lm_head.weight"))
    raises_load_error(checkpoint, "lm_head.weight")


def test_bfloat16_load(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    loaded = load_model(checkpoint, dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert_matches_hf_weights(loaded, checkpoint, torch.bfloat16)


def test_demo_eos_ids_match_hf_generation_config(demo_dir):
    loaded = load_model("demo")
    expected = transformers.GenerationConfig.from_pretrained(demo_dir).eos_token_id
    assert loaded.eos_token_ids == set(expected if isinstance(expected, list) else [expected])


def test_eos_ids_prefer_generation_config_then_config(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    edit_json(checkpoint / "config.json", eos_token_id=3)
    edit_json(checkpoint / "generation_config.json", eos_token_id=[5, 7])
    assert load_model(checkpoint).eos_token_ids == set(
        transformers.GenerationConfig.from_pretrained(checkpoint).eos_token_id)

    (checkpoint / "generation_config.json").unlink()
    assert load_model(checkpoint).eos_token_ids == {transformers.AutoConfig.from_pretrained(checkpoint).eos_token_id}


def test_load_demo_by_name(demo_dir):
    assert resolve_model_path("demo") == demo_dir == DEMO_MODEL_DIR
    loaded = load_model("demo")
    assert loaded.path == demo_dir and loaded.config.model_type == "llama"
    ids = torch.tensor(loaded.tokenizer.encode("Hello there"))
    out = logits(loaded, ids)
    assert out.shape == (1, len(ids), loaded.config.vocab_size)
    assert torch.isfinite(out).all()


def test_rotary_inv_freq_in_checkpoint_is_ignored(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    edit_weights(checkpoint, lambda tensors: tensors.update(
        {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}))
    load_model(checkpoint)


# --- what is refused -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_missing_file(tiny_checkpoint, name):
    checkpoint = tiny_checkpoint("llama")
    (checkpoint / name).unlink()
    raises_load_error(checkpoint, f"{name} is missing")


def test_missing_weights(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    (checkpoint / WEIGHTS).unlink()
    raises_load_error(checkpoint, WEIGHTS, "model.safetensors.index.json")


def test_index_names_missing_shard(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    names = load_file(checkpoint / WEIGHTS)
    weight_map = {name: ("model-00002-of-00002.safetensors" if "layers.2." in name else WEIGHTS) for name in names}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    raises_load_error(checkpoint, "model-00002-of-00002.safetensors", "missing")


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.safetensors.index.json"])
def test_malformed_json(tiny_checkpoint, name):
    checkpoint = tiny_checkpoint("llama")
    (checkpoint / name).write_text('{"model_type": "llama",', encoding="utf-8")
    raises_load_error(checkpoint, name, "not valid JSON")


def test_config_not_an_object(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    (checkpoint / "config.json").write_text("[1, 2]", encoding="utf-8")
    raises_load_error(checkpoint, "config.json", "JSON object")


def test_malformed_tokenizer_json(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    (checkpoint / "tokenizer.json").write_text('{"model": 1}', encoding="utf-8")
    raises_load_error(checkpoint, "tokenizer.json")


def test_unsupported_model_type(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    edit_json(checkpoint / "config.json", model_type="gpt2")
    raises_load_error(checkpoint, "'gpt2'", "llama", "mistral", "qwen2")


def test_tensor_shape_disagrees_with_config(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    name = "model.layers.1.mlp.up_proj.weight"
    edit_weights(checkpoint, lambda tensors: tensors.update({name: tensors[name][:-1]}))
    raises_load_error(checkpoint, WEIGHTS, name, "(95, 64)", "(96, 64)")


def test_config_disagrees_with_tensors(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    edit_json(checkpoint / "config.json", intermediate_size=128)
    message = raises_load_error(checkpoint, "mlp.")
    assert re.search(r"\((96, 64|64, 96)\).*\((128, 64|64, 128)\)", message), message


def test_missing_tensor(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    name = "model.layers.2.self_attn.k_proj.weight"
    edit_weights(checkpoint, lambda tensors: tensors.pop(name))
    raises_load_error(checkpoint, name)


def test_many_missing_tensors_are_summarised(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    dropped = [name for name in load_file(checkpoint / WEIGHTS) if name.startswith("model.layers.2.")]
    edit_weights(checkpoint, lambda tensors: [tensors.pop(name) for name in dropped])
    message = raises_load_error(checkpoint, f"and {len(dropped) - 5} more")
    assert sum(name in message for name in dropped) == 5


def test_unexpected_tensor(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama")
    name = "model.layers.0.self_attn.extra_proj.weight"
    edit_weights(checkpoint, lambda tensors: tensors.update({name: torch.zeros(4, 4)}))
    raises_load_error(checkpoint, WEIGHTS, name)


def test_bad_dtype(tiny_checkpoint):
    raises_load_error(tiny_checkpoint("llama"), "'float64'", "float32", "bfloat16", "float16", dtype="float64")


def test_not_a_directory(tmp_path):
    raises_load_error(tmp_path / "nowhere", "nowhere")
