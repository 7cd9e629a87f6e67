"""Our GGUF header parse (engine/loading/gguf_file.py) reads what the gguf package's reader reads, from
files the gguf package writes, and refuses a broken file by saying what is wrong with it."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile, GGUFFormatError

ARCH = "llama"


def write(path: Path, alignment: int | None = None) -> Path:
    """Every metadata value type (arrays of each, nested arrays, an empty string), plain and quantized
    tensors of one to three dimensions."""
    writer = gguf.GGUFWriter(path, ARCH)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 1 / 3)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "Ünïcödé ▁piece 日本 🤖")
    writer.add_string("t.empty", "")
    writer.add_array("t.strings", ["a", "", "▁b", "<0x0A>", "日本"] * 50)
    writer.add_array("t.ints", list(range(-5, 300)))
    writer.add_array("t.floats", [0.5, -1.25, 3.0])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.nested", [[1, 2], [3, 4, 5]])
    rng = np.random.default_rng(0)
    writer.add_tensor("f32.weight", rng.standard_normal((3, 5, 7)).astype(np.float32))
    writer.add_tensor("f16.weight", rng.standard_normal((4, 64)).astype(np.float16))
    writer.add_tensor("i32.weight", np.arange(9, dtype=np.int32))
    values = rng.standard_normal((6, 64)).astype(np.float32)
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        writer.add_tensor(f"{qtype.name}.weight", gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def their_metadata(reader: gguf.GGUFReader) -> dict:
    values = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    return {key: value.item() if isinstance(value, np.generic) else value for key, value in values.items()}


@pytest.mark.parametrize("alignment", [None, 1024])
def test_metadata_and_tensors_equal_the_gguf_readers(tmp_path, alignment):
    path = write(tmp_path / "all.gguf", alignment)
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    # gguf's reader flattens an array of arrays; ours keeps the nesting the file has.
    assert ours.metadata.pop("t.nested") == [[1, 2], [3, 4, 5]]
    expected = their_metadata(theirs)
    del expected["t.nested"]
    assert ours.metadata == expected and ours.metadata["t.u64"] == 2**63 + 5
    assert {key: type(value) for key, value in ours.metadata.items()} == \
        {key: type(value) for key, value in expected.items()}
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.qtype == reference.tensor_type and mine.dims == tuple(reference.shape.tolist())
        assert mine.data.dtype == reference.data.dtype and mine.data.shape == reference.data.shape, mine.name
        assert np.array_equal(mine.data, reference.data), mine.name
        assert not mine.data.flags.writeable, "a view of the read-only map, as the loader expects"


def header(version: int = 3, tensors: int = 0, keys: int = 1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, keys)


def key(name: str, kind: int, payload: bytes) -> bytes:
    encoded = name.encode()
    return struct.pack("<Q", len(encoded)) + encoded + struct.pack("<I", kind) + payload


def tensor_description(name: str, dims: tuple[int, ...], kind: int, offset: int) -> bytes:
    encoded = name.encode()
    return (struct.pack("<Q", len(encoded)) + encoded + struct.pack("<I", len(dims))
            + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset))


ALIGNED_DATA = b"\0" * 64  # padding to the data section and more
BROKEN = {
    "empty": (b"", "the file is empty"),
    "magic": (b"GGML" + b"\0" * 40, "does not start with b'GGUF'"),
    "version-1": (header(version=1) + key("k", 4, b"\1\0\0\0"), "GGUF version 1 is not supported"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 1), "big-endian GGUF files are not supported"),
    "truncated-header": (header()[:12], "ends inside its header"),
    "string-past-end": (header() + struct.pack("<Q", 1000) + b"abc", "a string of 1000 bytes at byte 32"),
    "unknown-value-type": (header() + key("k", 77, b"\0" * 8), "metadata key 'k' has value type 77"),
    "array-past-end": (header() + key("k", 9, struct.pack("<IQ", 6, 2**40)), "values run past the file's end"),
    "duplicate-key": (header(keys=2) + key("k", 4, b"\1\0\0\0") * 2, "metadata key 'k' appears twice"),
    "not-utf8": (header() + key("k", 8, struct.pack("<Q", 2) + b"\xff\xfe"), "is not UTF-8"),
    "alignment": (header() + key("general.alignment", 4, struct.pack("<I", 48)), "48 is not a power of two"),
    "too-many-dims": (header(tensors=1, keys=0) + tensor_description("w", (1,) * 5, 0, 0),
                      "tensor 'w' has 5 dimensions"),
    "unknown-tensor-type": (header(tensors=1, keys=0) + tensor_description("w", (4,), 99, 0),
                            "tensor 'w' has type 99"),
    "tensor-past-end": (header(tensors=1, keys=0) + tensor_description("w", (1000,), 0, 0) + ALIGNED_DATA,
                        "tensor 'w' ends at byte"),
    "partial-block": (header(tensors=1, keys=0) + tensor_description("w", (40,), 8, 0) + ALIGNED_DATA,
                      "rows of 40 values do not fill Q8_0 blocks of 32"),
    "duplicate-tensor": (header(tensors=2, keys=0) + tensor_description("w", (1,), 0, 0) * 2 + ALIGNED_DATA,
                         "tensor 'w' appears twice"),
}


@pytest.mark.parametrize("content, message", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_file_is_refused_saying_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GGUFFile(path)


def test_a_well_formed_minimal_file_reads(tmp_path):
    """Liveness of the byte builders above: the same pieces, put together correctly, read."""
    path = tmp_path / "minimal.gguf"
    path.write_bytes(header(tensors=1) + key("k", 4, struct.pack("<I", 7)) + tensor_description("w", (4,), 0, 0)
                     + ALIGNED_DATA)
    parsed = GGUFFile(path)
    assert parsed.metadata == {"k": 7} and parsed.tensors[0].data.tolist() == [0.0] * 4
