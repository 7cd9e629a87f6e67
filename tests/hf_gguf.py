"""HF transformers reading a GGUF file with its own reader (the gguf package's GGUFReader), the reference
for our loading of the packaged models, with that reader's parse done once per file.

transformers opens the file anew for the config, for the weights and for the tokenizer, and gguf's reader
parses the metadata element by element each time: Gemma 3's 262,144-piece vocabulary took it 14 s a
parse here, SmolLM2's 3.6 s. While transformers loads, its reader of the file is one reader, parsed once
over a plain view of the file's memory map (a memmap's views cost several times a plain one's: 3 s for
Gemma 3). Two more of its costs are the same work repeated, and done once here: it builds gguf's
tensor-name table (a pure function of the architecture and the layer count) once per module of the model,
397 times for SmolLM2 at 12 ms each; and it reads the file's metadata alone (`return_tensors=False`) for
the config of both the model and the tokenizer, about a second each time for Gemma 3. transformers' own
reading all the same: its mapping, dequantizers and tokenizer conversion.

The model transformers read from a file is kept once per machine, as the llama.cpp converter is
(tests/llama_cpp_converter.py): a checkpoint of it (config.json and safetensors) under
`~/.cache/workbench/hf-gguf-readings/` (XDG_CACHE_HOME is honoured), named by the file's digest and the
versions of transformers, gguf and torch, which transformers' own `from_pretrained` loads afterwards:
0.7 s against 9.7 s for Gemma 3 on an AMD EPYC, where the slowest machine we have took 63-98 s to read
it. The loaded model is the read one to the bit (weights, buffers and logits compared when this was
written); a reading that cannot be kept (a full disk) is only not kept. The tokenizer is read from the
file every time (5 s for Gemma 3 here, where a kept one would load in 2.6 s): hf_tokenizer also reads
files the tests write, which are not worth keeping.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy
from functools import cache, lru_cache
from importlib import metadata
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_model
from transformers import modeling_gguf_pytorch_utils


class PlainViewReader(gguf.GGUFReader):
    @property  # type: ignore[override]  # a plain view where gguf declares its memmap
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain = value.view(np.ndarray)


@lru_cache(maxsize=1)  # one file's parse held at a time: Gemma 3's is hundreds of MB
def _parsed(path: Path) -> PlainViewReader:
    return PlainViewReader(path)


_real_load_gguf_checkpoint = modeling_gguf_pytorch_utils.load_gguf_checkpoint


@lru_cache(maxsize=1)
def _metadata(path: Path) -> dict:
    """The file's metadata as transformers reads it (asked for under parsed_once: its reader is the shared one)."""
    return _real_load_gguf_checkpoint(str(path), return_tensors=False)


@contextmanager
def parsed_once(path: Path) -> Iterator[None]:
    real_reader = gguf.GGUFReader

    def reader(opened, *args, **kwargs):
        if Path(opened) == path and not args and not kwargs:
            return _parsed(path)
        return real_reader(opened, *args, **kwargs)

    def checkpoint(opened, return_tensors=False, **kwargs):
        if Path(opened) == path and not return_tensors and not kwargs:
            return deepcopy(_metadata(path))  # its callers edit what they get
        return _real_load_gguf_checkpoint(opened, return_tensors, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", reader)
        patch.setattr(gguf, "get_tensor_name_map", cache(gguf.get_tensor_name_map))
        patch.setattr(modeling_gguf_pytorch_utils, "load_gguf_checkpoint", checkpoint)
        yield


def hf_model(path: Path) -> transformers.PreTrainedModel:
    """The file's model in float32, in eval mode, decoding every step (no EOS: as our ignore_eos)."""
    kept = kept_reading(path)
    if (kept / "model.safetensors").is_file():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(kept), dtype=torch.float32)
    else:
        with parsed_once(path):
            model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                      dtype=torch.float32)
        _keep(model, kept)
    model.eval()
    model.generation_config.eos_token_id = None
    return model


def kept_reading(path: Path) -> Path:
    """Where what transformers read from this file is kept: by the file's contents and the readers' versions."""
    with path.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()[:24]
    versions = f"transformers-{transformers.__version__}-gguf-{metadata.version('gguf')}-torch-{torch.__version__}"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "workbench" / "hf-gguf-readings" / f"{digest}-{versions}"


def _keep(model: transformers.PreTrainedModel, kept: Path) -> None:
    """The model as a checkpoint at `kept`, written beside it and renamed, so no reader sees half of one."""
    scratch = None
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=kept.parent, prefix=".writing-"))
        model.config.save_pretrained(scratch)
        save_model(model, str(scratch / "model.safetensors"))  # a tied head is written once
        os.replace(scratch, kept)
    except Exception:  # no room (safetensors raises its own error), no cache folder, or another process kept it first
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def hf_tokenizer(path: Path):
    with parsed_once(path):
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
