"""A model's files without its weights: which directory or GGUF file a name stands for, its config and its
tokenizer. Torch-free, so the web side (which tokenizes, checks lengths and lists models) and the
management commands load no model code; engine/loading/loader.py loads the weights on top of this.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from engine.loading.json_files import read_json_object
from engine.loading.model_errors import ModelLoadError
from engine.loading.packaged_models import PACKAGED_MODELS
from engine.loading.packaged_models import fetch as fetch_packaged_model
from engine.loading.tokenizer import Tokenizer, TokenizerError
from engine.model.config import ConfigError, ModelConfig

if TYPE_CHECKING:  # imported where used: only GGUF models need the gguf package
    from engine.loading.gguf_model import GGUFCheckpoint

DEMO_MODEL_DIR = Path(__file__).parents[1] / "assets" / "demo"


def resolve_model_path(name_or_path: str | Path) -> Path:
    """The directory or GGUF file a model name stands for (fetching a packaged model if needed)."""
    name = str(name_or_path)
    if name == "demo":
        return DEMO_MODEL_DIR
    if name in PACKAGED_MODELS:
        return fetch_packaged_model(name)
    path = Path(name_or_path)
    if path.is_dir() or (path.is_file() and is_gguf(path)):
        return path
    known = ", ".join(repr(n) for n in ("demo", *PACKAGED_MODELS))
    raise ModelLoadError(f"model {name!r} is neither a known name ({known}), an HF-format directory nor a "
                         ".gguf file")


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == ".gguf"


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """The architecture of a model, without loading its weights."""
    path = resolve_model_path(name_or_path)
    return gguf_checkpoint(path).config if is_gguf(path) else load_config(path)


def load_tokenizer(name_or_path: str | Path) -> Tokenizer:
    """The tokenizer of a model, without loading its weights (the web side needs only this)."""
    path = resolve_model_path(name_or_path)
    if is_gguf(path):
        return gguf_checkpoint(path).tokenizer
    try:
        return Tokenizer.from_dir(path)
    except TokenizerError as exc:
        raise ModelLoadError(str(exc)) from exc


def gguf_checkpoint(path: Path) -> GGUFCheckpoint:
    stat = path.stat()
    return _opened_gguf(path.resolve(), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _opened_gguf(path: Path, mtime_ns: int, size: int) -> GGUFCheckpoint:
    """One parse per file per process: the file is mapped once and its vocabulary read into lists once,
    and the web side asks for the tokenizer and the config separately. A changed file is read anew."""
    from engine.loading.gguf_model import GGUFCheckpoint  # only GGUF models need the gguf package

    return GGUFCheckpoint(path)


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise ModelLoadError(f"{path.parent}: {path.name} is missing")
    try:
        return read_json_object(path)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files that hold an HF-format directory's weights: its index's, or model.safetensors."""
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


def load_config(path: Path) -> ModelConfig:
    try:
        return ModelConfig.from_hf_dict(read_json(path / "config.json"))
    except ConfigError as exc:
        raise ModelLoadError(f"{path / 'config.json'}: {exc}") from exc
