"""Tiny GGUF files for tests, written by the `gguf` package the way llama.cpp's converter writes them.

`write_gguf(hf_dir, path, qtype)` turns an HF checkpoint directory (tests/conftest.py's tiny random
ones, or the demo) into a GGUF file: metadata under llama.cpp's keys, the tokenizer's vocabulary,
merges and token types, the chat template, and the tensors under llama.cpp's names, with the Llama Q/K
rows permuted as its converter permutes them. That permutation is written out here independently of
engine/loading/gguf_model.py's inverse, so a wrong inverse shows as a model that disagrees with its HF twin.
Linear weights are quantized to `qtype` (F32, F16, Q8_0, Q4_0, Q4_1); the embedding to `embedding_qtype`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

_LAYER_PARTS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `permute`: per head, rows (i, i + D/2) become rows (2i, 2i + 1)."""
    shape = weights.shape
    return weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER_PARTS[part]}.{kind}"


def tokenizer_metadata(hf_dir: Path) -> dict:
    """The byte-level BPE tokenizer of an HF directory as llama.cpp stores it."""
    spec = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict(spec["model"]["vocab"])
    for added in spec["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "ids must be dense"
    special = {added["content"] for added in spec["added_tokens"] if added["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    config = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    return {"tokens": tokens, "types": [3 if t in special else 1 for t in tokens], "merges": merges,
            "eos": vocab[config["eos_token"]], "chat_template": config.get("chat_template")}


def write_gguf(hf_dir: Path, path: Path, qtype: str = "F32", embedding_qtype: str = "F32",
               architecture: str | None = None, pre: str = "default", file_type: str | None = None) -> Path:
    """`file_type`: the general.file_type to declare (a gguf.LlamaFileType name), whatever the tensors are."""
    import gguf

    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    architecture = architecture or config["model_type"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    writer = gguf.GGUFWriter(str(path), arch=architecture)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config["hidden_size"] // heads)
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(config.get("rope_theta") or rope.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    if file_type is not None:
        writer.add_file_type(gguf.LlamaFileType[file_type])
    tokenizer = tokenizer_metadata(hf_dir)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokenizer["tokens"])
    writer.add_token_types(tokenizer["types"])
    writer.add_token_merges(tokenizer["merges"])
    writer.add_eos_token_id(tokenizer["eos"])
    writer.add_add_bos_token(False)
    if tokenizer["chat_template"]:
        writer.add_chat_template(tokenizer["chat_template"])
    tensors = load_file(str(hf_dir / "model.safetensors"))
    for name, values in tensors.items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        values = values.astype(np.float32)
        if architecture in ("llama", "mistral") and ".q_proj." in name:
            values = llama_cpp_permute(values, heads)
        elif architecture in ("llama", "mistral") and ".k_proj." in name:
            values = llama_cpp_permute(values, kv_heads)
        kind = embedding_qtype if name == "model.embed_tokens.weight" else qtype if values.ndim == 2 else "F32"
        _add(writer, gguf_name(name), values, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add(writer, name: str, values: np.ndarray, kind: str) -> None:
    import gguf

    if kind == "F32":
        writer.add_tensor(name, values)
    elif kind == "F16":
        writer.add_tensor(name, values.astype(np.float16))
    else:
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)


def copy_gguf(source, target, *, drop_keys=(), set_values=None, drop_tensors=(), rename=None, reshape=None):
    """Copy a GGUF file of architecture llama with some metadata or tensors changed."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), arch="llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        value = (set_values or {}).get(key, field.contents())
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, kind)
    for tensor in reader.tensors:
        if tensor.name in drop_tensors:
            continue
        data = np.array(tensor.data)
        if reshape and tensor.name in reshape:
            data = data[: reshape[tensor.name]]
        name = (rename or {}).get(tensor.name, tensor.name)
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
