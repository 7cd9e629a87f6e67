"""Load an HF-format model directory: config, weights (single or sharded safetensors), tokenizer, EOS ids.

    loaded = load_model("demo" | PATH, device="cpu", dtype="float32")

Every way a directory can be wrong (a missing file, an unsupported model_type, a tensor whose shape
disagrees with config.json, a tensor missing or left over) raises `ModelLoadError` naming the file and
the tensor, before any of it reaches a forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine.json_files import read_json_object
from engine.model import ConfigError, LlamaForCausalLM, ModelConfig
from engine.tokenizer import Tokenizer, TokenizerError

DEMO_MODEL_DIR = Path(__file__).parent / "assets" / "demo"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Non-parameter tensors that some checkpoints carry and that we recompute instead.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class ModelLoadError(RuntimeError):
    """A model directory that cannot be loaded, with the reason."""


@dataclass
class LoadedModel:
    path: Path
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    eos_token_ids: frozenset[int]
    device: torch.device
    dtype: torch.dtype


def resolve_model_path(name_or_path: str | Path) -> Path:
    if str(name_or_path) == "demo":
        return DEMO_MODEL_DIR
    path = Path(name_or_path)
    if not path.is_dir():
        raise ModelLoadError(f"model {str(name_or_path)!r} is neither 'demo' nor a directory")
    return path


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise ModelLoadError(f"{path.parent}: {path.name} is missing")
    try:
        return read_json_object(path)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc


def load_config(path: Path) -> ModelConfig:
    try:
        return ModelConfig.from_hf_dict(read_json(path / "config.json"))
    except ConfigError as exc:
        raise ModelLoadError(f"{path / 'config.json'}: {exc}") from exc


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


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: weight_map is missing or empty")
        files = [path / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise ModelLoadError(f"{index} names {file.name}, which is missing")
        return files
    single = path / "model.safetensors"
    if not single.is_file():
        raise ModelLoadError(f"{path}: neither model.safetensors nor model.safetensors.index.json is present")
    return [single]


def load_weights(model: LlamaForCausalLM, files: list[Path], dtype: torch.dtype) -> None:
    expected = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight")  # shares embed_tokens; checkpoints may or may not repeat it
    seen: set[str] = set()
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and model.config.tie_word_embeddings):
                        continue
                    if name not in expected:
                        raise ModelLoadError(f"{file.name}: unexpected tensor {name!r} for this architecture")
                    tensor = handle.get_tensor(name)
                    target = expected[name]
                    if tuple(tensor.shape) != tuple(target.shape):
                        raise ModelLoadError(
                            f"{file.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                            f"config.json implies {tuple(target.shape)}"
                        )
                    target.copy_(tensor.to(dtype))
                    seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(f"checkpoint lacks tensor(s): {shown}")


def load_model(name_or_path: str | Path, device: str | torch.device = "cpu", dtype: str = "float32") -> LoadedModel:
    if dtype not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    path = resolve_model_path(name_or_path)
    config = load_config(path)
    files = checkpoint_files(path)
    try:
        tokenizer = Tokenizer.from_dir(path)
    except TokenizerError as exc:
        raise ModelLoadError(str(exc)) from exc
    torch_dtype, device = DTYPES[dtype], torch.device(device)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Materialise on the target device in the target dtype, then fill from the checkpoint; the
    # meta-device build skips a random initialisation that would be overwritten anyway.
    model = model.to_empty(device=device).to(torch_dtype)
    model.tie_weights()
    load_weights(model, files, torch_dtype)
    model.fuse_for_inference()
    model.eval()
    return LoadedModel(path=path, config=config, model=model, tokenizer=tokenizer,
                       eos_token_ids=eos_token_ids(path, config, tokenizer), device=device, dtype=torch_dtype)

