"""The Triton paged decode attention kernel (engine/kernels/gpu/triton_paged_decode.py) against the torch decode
path it replaces on CUDA (engine/model/attention.py: gather the blocks, mask, attend), on the CPU under
Triton's interpreter.

Random paged caches: GQA, partial last blocks, block tables in shuffled order, sequences of different
lengths in one call, sliding windows, head dims that are not a power of two, contexts up to 8k (split over
many partitions and merged), in float32: within 2e-5 (the two sum in different orders). Also bit for bit:
a row's result alone equals its result beside longer and shorter rows. Skipped as a whole where Triton
is not installed.

bfloat16 runs on a GPU only (the gpu-marked test, within 2e-2: the kernel rounds the softmax weights to
bfloat16 before the weighted sum, as flash attention does): Triton 3.9's interpreter gets tl.dot of
bfloat16 operands wrong (a 16x16 product off by 1e10).
"""

from __future__ import annotations


import pytest
import torch

from engine.model.attention import Attention
from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ModelConfig
from tests.kernels import triton_interpreter

INTERPRETED = triton_interpreter.select()  # before triton is first imported

from engine.kernels.gpu import triton_paged_decode  # noqa: E402


@pytest.fixture
def kernel():
    if not INTERPRETED:
        pytest.skip("a CUDA device is here: the compiled kernel is tested on it (test_on_cuda_against_the_torch_path)")
    return triton_paged_decode


TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def torch_decode_path(q, cache, tables, positions, block_size, window):
    """The torch path's decode attention for these decodes, on the query's device: the float32-math variant on
    the CPU, SDPA over the gathered blocks on CUDA. Its metadata is built there too: index_select refuses a
    host block table into a CUDA cache."""
    heads, kv_heads, dim = q.shape[1], cache[0].shape[1], q.shape[2]
    config = ModelConfig(model_type="llama", vocab_size=16, hidden_size=heads * dim, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=dim,
                         max_position_embeddings=16384, sliding_window=window)
    attention = Attention(config)
    metadata = AttentionMetadata.build(block_size=block_size, block_tables=tables, cached_lens=positions,
                                       query_lens=[1] * len(tables), sliding_window=window, device=q.device,
                                       dtype=q.dtype)
    assert metadata.decodes is not None
    return attention._decode(q, cache, metadata.decodes, block_size)


def random_case(lengths, heads, kv_heads, dim, block_size, dtype, seed):
    """Caches with more blocks than the sequences hold (the rest random, never to be read), each
    sequence's blocks drawn from a shuffled pool, and one query per sequence at its last position."""
    g = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in lengths]
    num_blocks = sum(needed) + 3
    shape = (num_blocks * block_size, kv_heads, dim)
    cache = ((torch.randn(shape, generator=g) * 2).to(dtype), torch.randn(shape, generator=g).to(dtype))
    pool = torch.randperm(num_blocks, generator=g).tolist()
    tables = []
    for count in needed:
        tables.append(pool[:count])
        pool = pool[count:]
    q = torch.randn(len(lengths), heads, dim, generator=g).to(dtype)
    return q, cache, tables, [n - 1 for n in lengths]


def padded(tables):
    """[B, widest] as the decode metadata pads them: each row with its own last block."""
    width = max(len(t) for t in tables)
    return torch.tensor([t + t[-1:] * (width - len(t)) for t in tables])


def run_kernel(kernel, q, cache, tables, positions, block_size, window):
    return kernel.paged_decode_attention(q, *cache, padded(tables).to(q.device), torch.tensor(positions, device=q.device),
                                         block_size,
                                         scale=q.shape[2] ** -0.5, window=window)


def check(kernel, lengths, heads, kv_heads, dim, block_size=16, dtype=torch.float32, window=None, seed=0,
          device="cpu", tolerance=None):
    q, cache, tables, positions = random_case(lengths, heads, kv_heads, dim, block_size, dtype, seed)
    q, cache = q.to(device), tuple(c.to(device) for c in cache)
    ours = run_kernel(kernel, q, cache, tables, positions, block_size, window)
    reference = torch_decode_path(q, cache, tables, positions, block_size, window)
    assert ours.dtype == q.dtype and ours.shape == q.shape
    tolerance = tolerance or TOLERANCE[dtype]
    torch.testing.assert_close(ours.float(), reference.float(), atol=tolerance, rtol=tolerance)
    return q, cache, tables, positions, ours


@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (4, 4), (6, 1)])
def test_gqa_several_lengths_partial_blocks_shuffled_tables(kernel, heads, kv_heads):
    # 1 and 17 end inside a block; 300 spans three partitions, the others one.
    check(kernel, [1, 17, 100, 300, 128], heads, kv_heads, dim=32)


@pytest.mark.parametrize("dim", [40, 64])
@pytest.mark.parametrize("block_size", [4, 16, 32])
def test_head_dims_and_block_sizes(kernel, dim, block_size):
    check(kernel, [5, 77, 260], 8, 2, dim=dim, block_size=block_size, seed=block_size)


@pytest.mark.parametrize("window", [1, 50, 128, 200])
def test_sliding_window(kernel, window):
    # Windows that start inside a block, on a partition boundary, and past the first partition.
    check(kernel, [30, 200, 333, 129], 8, 2, dim=32, window=window, seed=window)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_against_the_torch_path(dtype):
    """The compiled kernel on a GPU against the torch path there (SDPA over the gathered blocks)."""
    # float32: SDPA's CUDA kernels sum in another order over up to 4k keys.
    tolerance = 1e-4 if dtype == torch.float32 else TOLERANCE[dtype]
    check(triton_paged_decode, [1, 17, 300, 4100, 129], 32, 8, dim=64, dtype=dtype, seed=11, device="cuda",
          tolerance=tolerance)
    check(triton_paged_decode, [30, 200, 333], 8, 2, dim=128, dtype=dtype, window=128, seed=12, device="cuda",
          tolerance=tolerance)


def test_the_reference_is_built_on_the_querys_device():
    """The reference needs no kernel, so it runs here on any machine. The meta device stands in for CUDA:
    like it, it is not where AttentionMetadata.build puts its tensors by default, and the decode takes the
    SDPA branch there, not the CPU's float32-math one."""
    q, cache, tables, positions = random_case([5, 40], 8, 2, 32, 16, torch.float32, seed=1)
    q, cache = q.to("meta"), tuple(c.to("meta") for c in cache)
    out = torch_decode_path(q, cache, tables, positions, 16, None)
    assert out.device == q.device and out.shape == q.shape


def test_queries_as_a_strided_view(kernel):
    """The model passes its query heads as a view into the fused q/k/v projection's output."""
    q, cache, tables, positions = random_case([9, 140], 8, 2, 32, 16, torch.float32, seed=5)
    qkv = torch.cat([q, torch.randn(2, 4, 32)], dim=1)  # [B, H + 2 Hkv, D]
    view = qkv[:, :8]
    assert not view.is_contiguous()
    torch.testing.assert_close(run_kernel(kernel, view, cache, tables, positions, 16, None),
                               torch_decode_path(q, cache, tables, positions, 16, None), atol=2e-5, rtol=2e-5)


def test_long_contexts_up_to_8k(kernel):
    """64 partitions merged for the longest row; small heads and dims keep the interpreter quick."""
    check(kernel, [8192, 5000, 2], 4, 1, dim=16, seed=8)
    # A window far from the start: the merge's first chunks of partitions are all empty.
    check(kernel, [6000, 4100], 4, 1, dim=16, window=300, seed=9)


def test_a_rows_bits_do_not_depend_on_the_other_rows(kernel):
    q, cache, tables, positions, together = check(kernel, [700, 3, 260, 129], 8, 2, dim=32, seed=9)
    for row in range(len(tables)):
        alone = run_kernel(kernel, q[row: row + 1], cache, tables[row: row + 1], positions[row: row + 1], 16, None)
        assert torch.equal(alone[0], together[row]), f"row {row}"


@pytest.mark.parametrize("window", [None, 40])
def test_the_attention_layer_takes_the_kernel_with_either_metadata_builder(kernel, window):
    """Attention._decode with decode_backend "triton" against "torch", on the metadata a step builds from
    host lists and on the metadata a captured graph recomputes from its device buffers. The kernel reads
    each row's position, not the torch path's additive mask: its step builds none."""
    from engine.model.attention_metadata import decode_metadata

    q, cache, tables, positions = random_case([70, 5, 300], 8, 2, 32, 16, torch.float32, seed=21)
    config = ModelConfig(model_type="llama", vocab_size=16, hidden_size=256, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                         sliding_window=window)
    attention = Attention(config)
    built = AttentionMetadata.build(block_size=16, block_tables=tables, cached_lens=positions, query_lens=[1, 1, 1],
                                    sliding_window=window)
    replayed = decode_metadata(padded(tables), torch.tensor(positions), 16, window, torch.float32)
    for metadata in (built, replayed):
        decodes = metadata.decodes
        assert decodes is not None
        attention.decode_backend = "triton"
        got = attention._decode(q, cache, decodes, 16)
        assert "attn_mask" not in vars(decodes), "the Triton step built the torch path's mask"
        attention.decode_backend = "torch"
        torch.testing.assert_close(got, attention._decode(q, cache, decodes, 16), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("window", [None, 200])
def test_each_row_works_on_its_own_partitions_only(kernel, monkeypatch, window):
    """One long row beside very short ones: the grid spans the long row's 24 partitions for every row, but
    a row's programs past its position (or before its window) write nothing, and the merge reads only the
    row's own partitions. The workspace starts as NaN: whatever a row does not own stays NaN, and a merge
    that read any of it would turn the row's output NaN (NaN times a zero weight is NaN)."""
    workspaces = []
    allocate = triton_paged_decode._workspace

    def poisoned(*shape_and_device):
        part_out, part_lse = allocate(*shape_and_device)
        workspaces.append((part_out.fill_(float("nan")), part_lse.fill_(float("nan"))))
        return workspaces[-1]

    monkeypatch.setattr(triton_paged_decode, "_workspace", poisoned)
    lengths = [3000, 1, 2, 129, 700]
    check(kernel, lengths, 4, 1, dim=16, window=window, seed=31)
    (part_out, part_lse), = workspaces
    partition = triton_paged_decode.PARTITION
    assert part_lse.shape[2] == -(-max(lengths) // partition)
    for row, length in enumerate(lengths):
        first = max(length - window, 0) // partition if window else 0
        owned = torch.zeros(part_lse.shape[2], dtype=torch.bool)
        owned[first: -(-length // partition)] = True
        written = ~part_lse[row].isnan()                          # [H, parts]
        assert torch.equal(written, owned.expand_as(written)), f"row {row} (length {length})"
        assert not part_out[row][:, owned, :16].isnan().any()
        assert part_out[row][:, ~owned].isnan().all()
