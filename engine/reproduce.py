"""Reproducibility records: what re-deriving a finished request needs, and the comparison of two runs.

A record names the model (its name, a SHA-256 of its weight files, and the engine's arithmetic route),
the prompt's token ids, the sampling parameters as the engine resolved them (the seed always set: the
engine draws one for a request that gave none), the output token ids, each sampled token's logprob as
exact float bits (hex) when the request asked for logprobs, and a digest over the output and every
logprob bit (the top-N included). Running the same prompt ids with the same parameters on the same
model and route must give the same digest where the route is bit-invariant (docs/ARCHITECTURE.md,
"Which paths are bit-invariant"); elsewhere the two runs are compared by their distance instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # annotations only: the web side compares records without torch
    from engine.sampler import TokenLogprob

# The weight files a model directory's identity hashes (with its config); a GGUF is one file.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
SEED_BITS = 63  # a non-negative int64: every torch.Generator and JSON reader takes it as it is


def drawn_seed() -> int:
    """The seed recorded for a request that gave none: its draws are then reproducible from the record."""
    return secrets.randbits(SEED_BITS)


@dataclass(frozen=True)
class ModelIdentity:
    model: str           # the name or path it was loaded by
    weights_sha256: str  # of the weight files (and a directory's config.json), in name order
    route: str           # device/weights/dtype/kernels: the arithmetic that produced the bits
    invariant: bool      # whether that route promises bit-identical rows whatever the batch

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def weights_sha256(path: Path) -> str:
    """The content hash of a model's weights, computed once per file version (path, size, mtime) in a
    process: a load pays for reading the files once more, never a request."""
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name == "config.json"))
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(file.name.encode() + b"\0" + _file_sha256(str(file.resolve()), stat.st_size,
                                                                stat.st_mtime_ns).encode())
    return digest.hexdigest()


@lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:  # size and mtime key the cache only
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def identity_of(model: str, path: Path, device_type: str, weights: str, dtype: str,
                own_kernels: bool) -> ModelIdentity:
    """The loaded model's identity, for the engine to stamp on every record (`weights`: the config's
    weight_format; `device_type`: "cpu", "cuda"; `dtype`: its name; `own_kernels`: our native kernels
    serve on the CPU, the invariant Triton GEMM on CUDA)."""
    route, invariant = route_of(device_type, weights, dtype, own_kernels)
    return ModelIdentity(model, weights_sha256(path), route, invariant)


def route_of(device: str, weights: str, dtype: str, own_kernels: bool) -> tuple[str, bool]:
    """The arithmetic route's name and whether it is bit-invariant, as docs/ARCHITECTURE.md states it:
    on the CPU with the native kernels every route is, but quantized fp32 (torch's int4 route switches
    with the row count); without the kernels none is. On a GPU none is claimed yet: with the Triton GEMM
    a decode keeps its bits, but no GPU has shown it, and prefills still take SDPA at any shape."""
    kernels = ("native" if device == "cpu" else "triton") if own_kernels else "torch"
    name = f"{device}/{weights}/{dtype}/{kernels}"
    invariant = device == "cpu" and own_kernels and not (weights == "quantized" and dtype == "float32")
    return name, invariant


@dataclass(frozen=True)
class ReproRecord:
    identity: ModelIdentity
    prompt_ids: list[int]
    params: dict[str, Any]        # SamplingParams' fields, resolved (seed and max_tokens set)
    output_ids: list[int]
    logprobs: list[str] | None    # each sampled token's logprob, float.hex(); None: not asked for
    digest: str
    finish_reason: str

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "identity": self.identity.as_dict()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ReproRecord":
        return cls(**{**values, "identity": ModelIdentity(**values["identity"])})

    def sampling_params(self) -> SamplingParams:
        return SamplingParams.from_dict(self.params)


def record_of(identity: ModelIdentity, prompt_ids: list[int], params: SamplingParams, output_ids: list[int],
              logprobs: list[TokenLogprob | None] | None, finish_reason: str) -> ReproRecord:
    values = dataclasses.asdict(params)
    values["stop"], values["stop_token_ids"] = list(params.stop), list(params.stop_token_ids)
    hexes = None if logprobs is None else [lp.logprob.hex() if lp else "" for lp in logprobs]
    return ReproRecord(identity, list(prompt_ids), values, list(output_ids), hexes,
                       output_digest(output_ids, logprobs), finish_reason)


def output_digest(output_ids: list[int], logprobs: list[TokenLogprob | None] | None) -> str:
    """SHA-256 over the output token ids and every logprob's bits (sampled and top-N), in order."""
    payload: list[Any] = [list(output_ids)]
    if logprobs is not None:
        payload.append([None if lp is None else [lp.token_id, lp.logprob.hex(),
                                                 [[t, v.hex()] for t, v in lp.top]] for lp in logprobs])
    return hashlib.sha256(json.dumps(payload, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Comparison:
    """Two runs of one record: `identical` when every token and logprob bit agrees; else where they
    first part (`index` into the output) and what each has there (None: that run had ended)."""
    identical: bool
    index: int | None = None
    recorded_token: int | None = None
    rerun_token: int | None = None
    # The largest |difference| of the sampled tokens' logprobs over the positions both runs share, where
    # both kept logprobs: what a route that is not bit-invariant reports instead of a mismatch.
    distance: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare(recorded: ReproRecord, rerun: ReproRecord) -> Comparison:
    distance = _distance(recorded, rerun)
    if recorded.digest == rerun.digest and recorded.output_ids == rerun.output_ids:
        return Comparison(True, distance=distance)
    a, b = recorded.output_ids, rerun.output_ids
    index = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    if index is None and recorded.logprobs is not None and rerun.logprobs is not None:
        index = next((i for i, (x, y) in enumerate(zip(recorded.logprobs, rerun.logprobs)) if x != y), None)
    if index is None:  # one is a prefix of the other, or only the top-N bits differ: the shorter's end
        index = min(len(a), len(b))
    return Comparison(False, index, a[index] if index < len(a) else None, b[index] if index < len(b) else None,
                      distance)


def _distance(recorded: ReproRecord, rerun: ReproRecord) -> float | None:
    if recorded.logprobs is None or rerun.logprobs is None:
        return None
    pairs = [(float.fromhex(x), float.fromhex(y)) for x, y in zip(recorded.logprobs, rerun.logprobs) if x and y]
    return max((abs(x - y) for x, y in pairs), default=0.0)
