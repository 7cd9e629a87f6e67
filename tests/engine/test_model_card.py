"""A model's card (engine/loading/model_card.py), read from its files' headers: a GGUF file and its HF
twin (the same weights) count the same parameters, the elements of every weight the HF files hold; the
quantization is the file type the GGUF metadata declares, or else the type that holds most of its
weights; a sharded checkpoint counts the shards its index names and nothing else beside them."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine.loading.model_card import model_card
from tests.gguf_files import write_gguf


def elements(hf_dir) -> int:
    return sum(values.size for values in load_file(hf_dir / "model.safetensors").values())


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_gguf_file_and_its_hf_twin_count_the_same_weights(tiny_gguf, model_type):
    gguf_path, hf_dir = tiny_gguf(model_type, "Q8_0", embedding_qtype="Q8_0")
    gguf_card, hf_card = model_card(gguf_path), model_card(hf_dir)
    assert gguf_card.parameter_count == hf_card.parameter_count == elements(hf_dir) > 0
    assert (gguf_card.architecture, gguf_card.file_format, gguf_card.quantization, gguf_card.file_bytes) == (
        model_type, "gguf", "Q8_0", gguf_path.stat().st_size)
    assert (hf_card.architecture, hf_card.file_format, hf_card.quantization, hf_card.file_bytes) == (
        model_type, "safetensors", "F32", (hf_dir / "model.safetensors").stat().st_size)


def test_the_declared_file_type_names_the_quantization(tiny_gguf, tmp_path):
    _, hf_dir = tiny_gguf("llama")
    declared = write_gguf(hf_dir, tmp_path / "declared.gguf", "Q8_0", embedding_qtype="Q8_0", file_type="MOSTLY_Q4_K_M")
    assert model_card(declared).quantization == "Q4_K_M", "what the file says, not what its tensors suggest"
    assert model_card(write_gguf(hf_dir, tmp_path / "f32.gguf", file_type="ALL_F32")).quantization == "F32"


def test_a_sharded_checkpoint_counts_its_indexed_shards_in_their_dtype(tiny_gguf, tmp_path):
    _, hf_dir = tiny_gguf("llama")
    sharded = tmp_path / "sharded"
    shutil.copytree(hf_dir, sharded)
    weights = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():  # bfloat16's bits as uint16: numpy has no bfloat16
        save_file({name: (weights[name].view(np.uint32) >> 16).astype(np.uint16) for name in part}, sharded / file)
        _as_bfloat16(sharded / file)
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {name: file for file, part in halves.items() for name in part}}))
    save_file({"stray": np.zeros((1000, 1000), np.float32)}, sharded / "consolidated.safetensors")
    card = model_card(sharded)
    assert (card.parameter_count, card.quantization) == (elements(hf_dir), "BF16")
    assert card.file_bytes == sum((sharded / file).stat().st_size for file in halves), "the stray file is not counted"


def _as_bfloat16(path) -> None:
    """Relabel a safetensors file's U16 tensors BF16 (the same width): its header is JSON after its length,
    and the data's offsets count from the header's end."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = data[8:8 + size].decode().strip().replace('"U16"', '"BF16"').encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data[8 + size:])
