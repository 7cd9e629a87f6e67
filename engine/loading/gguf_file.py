"""A GGUF file's header parsed, and its tensors as views of one read-only memory map.

    gguf_file = GGUFFile(path)
    gguf_file.metadata["general.architecture"]    # plain Python values; arrays as lists
    for tensor in gguf_file.tensors: tensor.name, tensor.qtype, tensor.dims, tensor.data

Ours rather than the gguf package's reader, whose parse makes numpy views per metadata element: a
vocabulary of 262,144 pieces (Gemma 3) took it about 3 s of a 14 s load, where reading each array in one
pass takes a tenth of that. The format is small (llama.cpp's docs/gguf.md): a header, typed key-value
metadata, tensor descriptions, then the aligned tensor data. The gguf package still supplies the
quantization types, their block sizes and the dequantizers. A file that breaks the format (truncated,
a length or type that cannot be, a big-endian or version 1 file) raises GGUFFormatError naming where.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
# GGUF value types: their numbers in the file -> the numpy dtype of one element (little-endian).
_NUMBERS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
            11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
# Tensor types stored as plain numbers; every other type is ggml blocks, read as bytes.
_PLAIN_TENSORS = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                  "I32": np.int32, "I64": np.int64}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class GGUFFormatError(ValueError):
    """The file breaks the GGUF format; the message says where."""


@dataclass(frozen=True)
class GGUFTensorData:
    name: str
    qtype: Any                   # gguf.GGMLQuantizationType
    dims: tuple[int, ...]        # ggml's order: the fastest-varying dimension first
    data: np.ndarray             # numbers in numpy's order, or uint8 blocks [..., bytes per row]


class GGUFFile:
    def __init__(self, path: Path | str) -> None:
        with open(path, "rb") as file:
            if not Path(path).stat().st_size:
                raise GGUFFormatError("the file is empty")
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self._offset = 0
        self.metadata: dict[str, Any] = {}
        self.tensors: list[GGUFTensorData] = []
        try:
            self._parse()
        except struct.error:
            raise GGUFFormatError(f"the file ends inside its header (at byte {self._offset})") from None

    def release_pages(self) -> None:
        """Drops this process's resident pages of the file; they fault in again if read."""
        self._map.madvise(mmap.MADV_DONTNEED)

    def _parse(self) -> None:
        if self._map[:4] != MAGIC:
            raise GGUFFormatError(f"it does not start with {MAGIC!r}")
        self._offset = 4
        version = self._u32()
        if version & 0xFFFF == 0:
            raise GGUFFormatError("big-endian GGUF files are not supported")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} is not supported (2 and 3 are)")
        tensor_count, key_count = self._u64(), self._u64()
        for _ in range(key_count):
            key = self._string()
            if key in self.metadata:
                raise GGUFFormatError(f"metadata key {key!r} appears twice")
            self.metadata[key] = self._value(self._u32(), key)
        described = [self._tensor_description() for _ in range(tensor_count)]
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFFormatError(f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-self._offset // alignment) * alignment
        names: set[str] = set()
        for name, dims, qtype, offset in described:
            if name in names:
                raise GGUFFormatError(f"tensor {name!r} appears twice")
            names.add(name)
            self.tensors.append(self._tensor(name, dims, qtype, data_start + offset))

    def _tensor_description(self) -> tuple[str, tuple[int, ...], Any, int]:
        from gguf import GGMLQuantizationType  # imported here: only GGUF models need it

        name = self._string()
        n_dims = self._u32()
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} can be)")
        dims = tuple(self._u64() for _ in range(n_dims))
        raw_type = self._u32()
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise GGUFFormatError(f"tensor {name!r} has type {raw_type}, which ggml does not define") from None
        return name, dims, qtype, self._u64()

    def _tensor(self, name: str, dims: tuple[int, ...], qtype: Any, start: int) -> GGUFTensorData:
        from gguf import GGML_QUANT_SIZES

        shape = tuple(reversed(dims))
        elements = int(np.prod(dims, dtype=np.int64))
        plain = _PLAIN_TENSORS.get(qtype.name)
        if plain is not None:
            dtype: Any = plain
            count = elements
        else:
            block, block_bytes = GGML_QUANT_SIZES[qtype]
            if dims[0] % block:
                raise GGUFFormatError(f"tensor {name!r}: rows of {dims[0]} values do not fill {qtype.name} "
                                      f"blocks of {block}")
            shape = (*shape[:-1], dims[0] // block * block_bytes)
            dtype, count = np.uint8, elements // block * block_bytes
        end = start + count * np.dtype(dtype).itemsize
        if end > len(self._map):
            raise GGUFFormatError(f"tensor {name!r} ends at byte {end}, past the file's end ({len(self._map)}): "
                                  "is the file truncated?")
        return GGUFTensorData(name, qtype, dims, np.frombuffer(self._map, dtype, count, start).reshape(shape))

    def _value(self, kind: int, key: str) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind, count = self._u32(), self._u64()
            if item_kind == _STRING:
                return [self._string() for _ in range(count)]
            if item_kind == _ARRAY:
                return [self._value(_ARRAY, key) for _ in range(count)]
            return self._numbers(item_kind, count, key).tolist()
        return self._numbers(kind, 1, key)[0].item()

    def _numbers(self, kind: int, count: int, key: str) -> np.ndarray:
        if kind not in _NUMBERS:
            raise GGUFFormatError(f"metadata key {key!r} has value type {kind}, which GGUF does not define")
        dtype = np.dtype(_NUMBERS[kind])
        if self._offset + count * dtype.itemsize > len(self._map):
            raise GGUFFormatError(f"metadata key {key!r}: {count} values run past the file's end")
        values = np.frombuffer(self._map, dtype, count, self._offset)
        self._offset += count * dtype.itemsize
        return values

    def _string(self) -> str:
        length = self._u64()
        start, self._offset = self._offset, self._offset + length
        if self._offset > len(self._map):
            raise GGUFFormatError(f"a string of {length} bytes at byte {start} runs past the file's end")
        try:
            return self._map[start:self._offset].decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"the string at byte {start} is not UTF-8") from None

    def _u32(self) -> int:
        (value,) = _U32.unpack_from(self._map, self._offset)
        self._offset += 4
        return value

    def _u64(self) -> int:
        (value,) = _U64.unpack_from(self._map, self._offset)
        self._offset += 8
        return value
