"""The native CPU paged attention op (engine/kernels/cpu/paged_attention.cpp): one call for every query token of
a step, each attending its own sequence's keys through its block table.

Against a float64 reference of softmax attention over the same keys, and bit for bit against itself: a
row alone or among many rows of other sequences, a prompt whole or in chunks at any boundary, one thread
or two, the scalar path or AVX2. Skipped as a whole where the library cannot be built.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.kernels import cpu

pytestmark = pytest.mark.usefixtures("native_cpu_kernels", "path_on_this_cpu")

SIMD = ["avx2", "avx512"]  # by name: only the built library knows which this CPU runs (path_on_this_cpu)
BLOCK = 4
NUM_BLOCKS = 64


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def make_cache(kv_heads: int, dim: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS * BLOCK, kv_heads, dim)
    keys = torch.randn(shape, generator=g) * 2  # scores spread over a few units: a peaked softmax
    return keys.to(dtype), torch.randn(shape, generator=g).to(dtype)


def shuffled_tables(lengths: list[int], seed: int) -> list[list[int]]:
    """Each sequence's blocks, drawn from a shuffled pool: tables in no order, never shared."""
    pool = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed)).tolist()
    tables = []
    for length in lengths:
        count = -(-length // BLOCK)
        tables.append(pool[:count])
        pool = pool[count:]
    return tables


def as_tensor(tables: list[list[int]]) -> torch.Tensor:
    """[B, widest] int64, short rows padded with their last block (never read)."""
    width = max(len(t) for t in tables)
    return torch.tensor([t + t[-1:] * (width - len(t)) for t in tables])


def queries(count: int, heads: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(count, heads, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)


def reference(q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], tables: list[list[int]],
              sequence: list[int], positions: list[int], window: int | None) -> torch.Tensor:
    """float64 [N, H, D]: softmax(q . k * D^-0.5) @ v over keys lo .. p of each token's sequence."""
    keys, values = (c.double() for c in cache)
    heads, kv_heads, dim = q.shape[1], keys.shape[1], q.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64)
    for t, (b, p) in enumerate(zip(sequence, positions)):
        js = torch.arange(max(0, p - window + 1) if window else 0, p + 1)
        slots = torch.tensor(tables[b])[js // BLOCK] * BLOCK + js % BLOCK
        for h in range(heads):
            g = h // (heads // kv_heads)
            weights = torch.softmax(keys[slots, g] @ q[t, h].double() * dim**-0.5, dim=0)
            out[t, h] = weights @ values[slots, g]
    return out


def attend(q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], tables: list[list[int]], sequence: list[int],
           positions: list[int], window: int | None = None, path: str | None = None) -> torch.Tensor:
    return cpu.paged_attention(q, *cache, as_tensor(tables), torch.tensor(sequence), torch.tensor(positions), BLOCK,
                               window, path=path)


# Three sequences: lengths with partial last blocks (21, 6) and a full one (32), and tokens from each,
# early and late (a decode's last position, a prompt's first).
LENGTHS = [21, 6, 32]
TOKENS = [(0, 20), (1, 5), (2, 31), (0, 0), (2, 3), (1, 0), (0, 9), (2, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["scalar", *SIMD])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 64), (6, 2, 64), (8, 2, 256), (3, 1, 20)],
                         ids=["mha-64", "gqa3-64", "gqa4-256", "mqa-20"])
@pytest.mark.parametrize("window", [None, 5])
def test_matches_a_float64_reference(dtype: torch.dtype, path: str, heads: int, kv_heads: int, dim: int,
                                     window: int | None) -> None:
    """fp32 output within 2e-6 + 1e-5 relative of the float64 result (values ~ N(0, 1), a sum of fp32
    products and a softmax over <= 32 keys: observed errors are ~3e-7); bf16 within its rounding
    (2^-8 relative) of it, inputs being the same bf16 values."""
    cache = make_cache(kv_heads, dim, dtype)
    tables = shuffled_tables(LENGTHS, seed=dim)
    sequence, positions = [b for b, _ in TOKENS], [p for _, p in TOKENS]
    q = queries(len(TOKENS), heads, dim, dtype, seed=heads)
    out = attend(q, cache, tables, sequence, positions, window, path)
    want = reference(q, cache, tables, sequence, positions, window)
    assert out.dtype == dtype and out.shape == q.shape
    err = (out.double() - want).abs()
    rel = 2.0**-8 if dtype == torch.bfloat16 else 1e-5
    assert (err <= 2e-6 + rel * want.abs()).all(), f"worst error {err.max():.3g}"
    if window is not None:  # liveness: the window cuts the late tokens' keys
        assert not torch.allclose(out[0].double(), reference(q, cache, tables, sequence, positions, None)[0],
                                  atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["auto", "scalar"])
@pytest.mark.parametrize("window", [None, 7])
def test_a_row_is_the_same_bits_alone_or_among_other_sequences_rows(dtype: torch.dtype, path: str,
                                                                    window: int | None) -> None:
    lengths = [1, 3, 9, 16, 17, 40, 64, 70]
    cache = make_cache(3, 64, dtype, seed=1)
    tables = shuffled_tables(lengths, seed=2)
    # Every sequence's every position: decodes of any length and prompt rows at any depth.
    tokens = [(b, p) for b, n in enumerate(lengths) for p in range(n)]
    q = queries(len(tokens), 9, 64, dtype, seed=3)
    alone = torch.cat([attend(q[i:i + 1], cache, [tables[b]], [0], [p], window, path)
                       for i, (b, p) in enumerate(tokens)])
    g = torch.Generator().manual_seed(4)
    for count in (2, 8, len(tokens)):
        rows = torch.randperm(len(tokens), generator=g)[:count].tolist()
        batch = attend(q[rows], cache, tables, [tokens[i][0] for i in rows], [tokens[i][1] for i in rows], window,
                       path)
        assert torch.equal(batch, alone[rows]), f"rows differ among {count}"
    assert not torch.equal(alone[0], alone[1])  # liveness: rows differ from each other


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 10])
def test_a_prompt_whole_or_in_chunks_gives_the_same_bits(dtype: torch.dtype, window: int | None) -> None:
    """Chunks of 1, 7, 16 and 33 tokens (boundaries inside and at block edges), each over a cache whose
    slots past the chunk hold NaN, as they would hold nothing yet: no row reads a later key."""
    length, kv_heads, dim = 70, 2, 64
    keys, values = make_cache(kv_heads, dim, dtype, seed=5)
    [table] = shuffled_tables([length], seed=6)
    slots = torch.tensor(table).repeat_interleave(BLOCK) * BLOCK + torch.arange(BLOCK).repeat(len(table))
    q = queries(length, 4, dim, dtype, seed=7)
    whole = attend(q, (keys, values), [table], [0] * length, list(range(length)), window)
    for size in (1, 7, 16, 33):
        rows = []
        for start in range(0, length, size):
            stop = min(start + size, length)
            k, v = keys.clone(), values.clone()
            k[slots[stop:]] = float("nan")
            v[slots[stop:]] = float("nan")
            rows.append(attend(q[start:stop], (k, v), [table], [0] * (stop - start), list(range(start, stop)), window))
        assert torch.equal(torch.cat(rows), whole), f"chunks of {size}"
    assert not whole.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bfloat16: the prompt's keys widened
@pytest.mark.parametrize("path", ["auto", "scalar"])
def test_one_two_or_three_threads_give_the_same_bits(dtype: torch.dtype, path: str, threads: None) -> None:
    # Decodes of two sequences beside a whole 60-token prompt of a third (the prompt's tokens cost 1 to 60
    # keys each, the decodes 5 and 33): the threads' runs of items are cut by cost, unevenly in count.
    lengths = [5, 33, 60]
    cache = make_cache(2, 64, dtype, seed=8)
    tables = shuffled_tables(lengths, seed=9)
    tokens = [(0, 4), (1, 32), *((2, p) for p in range(60))]
    q = queries(len(tokens), 6, 64, dtype, seed=10)
    out = {}
    for count in (1, 2, 3):
        torch.set_num_threads(count)
        out[count] = [attend(q, cache, tables, [b for b, _ in tokens], [p for _, p in tokens], path=path),
                      attend(q[:1], cache, tables, [tokens[0][0]], [tokens[0][1]], path=path)]
    for count in (2, 3):
        assert torch.equal(out[1][0], out[count][0]) and torch.equal(out[1][1], out[count][1]), f"{count} threads"
    assert torch.equal(out[1][0][:1], out[1][1])  # the decode alone as among the prompt's tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("dim", [8, 64, 80, 136, 256])  # AVX-512: 80 and 256 take two and four output passes
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("heads", [4, 10])  # KV groups of 2, and of 5 (AVX-512 takes 3 heads at a time)
def test_simd_path_is_the_same_bits_as_the_scalar_path(dtype: torch.dtype, path: str, dim: int,
                                                       window: int | None, heads: int) -> None:
    lengths = [1, 7, 8, 9, 63]  # key counts at, below and past a multiple of the 8 lanes
    cache = make_cache(2, dim, dtype, seed=dim)
    cache[0][:16] *= 40  # scores far apart: weights underflow to 0 in the exponential
    tables = shuffled_tables(lengths, seed=11)
    tokens = [(b, p) for b, n in enumerate(lengths) for p in range(n)]
    q = queries(len(tokens), heads, dim, dtype, seed=12)
    args = (q, cache, tables, [b for b, _ in tokens], [p for _, p in tokens], window)
    assert torch.equal(attend(*args, path=path), attend(*args, path="scalar"))


def test_bad_input_raises_a_clear_error() -> None:
    keys, values = make_cache(2, 64, torch.float32)
    table, seq, pos = torch.tensor([[3, 4, 5]]), torch.tensor([0, 0]), torch.tensor([2, 9])
    q = torch.randn(2, 4, 64)
    call = cpu.paged_attention
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        call(q.double(), keys, values, table, seq, pos, BLOCK)
    with pytest.raises(TypeError, match="q's dtype"):
        call(q, keys.bfloat16(), values.bfloat16(), table, seq, pos, BLOCK)
    with pytest.raises(ValueError, match="3-D"):
        call(q[0], keys, values, table, seq[:1], pos[:1], BLOCK)
    with pytest.raises(ValueError, match="head_dim"):
        call(torch.randn(2, 4, 32), keys, values, table, seq, pos, BLOCK)
    with pytest.raises(ValueError, match="multiple of 2 KV heads"):
        call(torch.randn(2, 3, 64), keys, values, table, seq, pos, BLOCK)
    with pytest.raises(ValueError, match="contiguous"):
        call(q, keys.transpose(0, 1).contiguous().transpose(0, 1), values, table, seq, pos, BLOCK)
    with pytest.raises(TypeError, match="block_tables must be int64"):
        call(q, keys, values, table.int(), seq, pos, BLOCK)
    with pytest.raises(ValueError, match="one entry per query token"):
        call(q, keys, values, table, seq, pos[:1], BLOCK)
    with pytest.raises(ValueError, match="not a row of the 1 block tables"):
        call(q, keys, values, table, torch.tensor([0, 1]), pos, BLOCK)
    with pytest.raises(ValueError, match="past its block table"):
        call(q, keys, values, table, seq, torch.tensor([2, 12]), BLOCK)
    with pytest.raises(ValueError, match="past its block table"):
        call(q, keys, values, table, seq, torch.tensor([-1, 2]), BLOCK)
    with pytest.raises(ValueError, match="not one of the cache's 64 blocks"):
        call(q, keys, values, torch.tensor([[3, 64, 5]]), seq, pos, BLOCK)
    with pytest.raises(ValueError, match="block_size"):
        call(q, keys, values, table, seq, pos, 0)
    with pytest.raises(ValueError, match="sliding_window"):
        call(q, keys, values, table, seq, pos, BLOCK, sliding_window=0)
    with pytest.raises(ValueError, match="unknown CPU kernel path"):
        call(q, keys, values, table, seq, pos, BLOCK, path="sse9")
    if "avx512" not in cpu.cpu_paths():
        with pytest.raises(ValueError, match="no AVX-512"):
            call(q, keys, values, table, seq, pos, BLOCK, path="avx512")
    # A sliding window needs only the blocks it reads: block 0 may be anything then.
    out = call(q, keys, values, torch.tensor([[-7, 4, 5]]), seq, torch.tensor([5, 9]), BLOCK, sliding_window=2)
    assert out.shape == q.shape  # and the library still works


def test_fake_kernel_gives_shape_and_dtype() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    keys, values = make_cache(2, 64, torch.bfloat16)
    q = torch.randn(3, 4, 64).bfloat16()
    args = (q, keys, values, torch.tensor([[3, 4, 5], [6, 7, 7]]), torch.tensor([0, 1, 0]), torch.tensor([10, 5, 2]),
            BLOCK, None, 0.125, -1)
    torch.library.opcheck(torch.ops.workbench.paged_attention.default, args)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = torch.ops.workbench.paged_attention(*fake)
        assert (out.shape, out.dtype) == ((3, 4, 64), torch.bfloat16)
