"""Device-loop kernels: the torch references against plain torch on the CPU, and each CuPy kernel
against its reference on a GPU (marked gpu: skipped without one, run by bench/gpu_check.sh)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.gpu.commit_token import commit_token, commit_token_cupy, commit_token_ref
from engine.kernels.gpu.fault_word import fault_word, fault_word_cupy, fault_word_ref
from engine.kernels.gpu.ring_argmax import ring_argmax, ring_argmax_cupy, ring_argmax_ref


def logits_with_ties(device="cpu", rows=5, vocab=50_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g)
    logits[1, [7, 9_000, 49_999]] = 50.0  # a tie: the lowest id wins
    logits[2, -1] = 60.0                   # the maximum at the very end
    return logits.to(device)


def test_ring_argmax_ref_writes_the_first_maximum_into_its_ring_row():
    logits = logits_with_ties()
    ring = torch.full((4, 8), -1, dtype=torch.long)
    ring_argmax_ref(logits, ring, 2)
    assert ring[2, :5].tolist() == logits.argmax(-1).tolist() and ring[2, 1] == 7 and ring[2, 2] == 49_999
    assert (ring[[0, 1, 3]] == -1).all() and (ring[2, 5:] == -1).all(), "only ring[step, :B] is written"


def test_commit_token_ref_feeds_the_sample_one_position_on():
    ids, positions = torch.tensor([1, 2, 3]), torch.tensor([10, 20, 30])
    commit_token_ref(torch.tensor([7, 8, 9]), ids, positions)
    assert ids.tolist() == [7, 8, 9] and positions.tolist() == [11, 21, 31]


def test_fault_word_ref_is_set_by_nan_or_inf_and_never_cleared():
    fault = torch.zeros(1, dtype=torch.int32)
    fault_word_ref(torch.randn(2, 9), fault)
    assert fault.item() == 0
    bad = torch.randn(2, 9)
    bad[1, 4] = float("inf")
    fault_word_ref(bad, fault)
    assert fault.item() == 1
    fault_word_ref(torch.randn(2, 9), fault)
    assert fault.item() == 1


def test_dispatchers_use_the_reference_on_the_cpu():
    logits, ring = logits_with_ties(), torch.zeros(2, 5, dtype=torch.long)
    ring_argmax(logits, ring, 0)
    ids, positions, fault = torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long), torch.zeros(1, dtype=torch.int32)
    commit_token(ring[0], ids, positions)
    fault_word(logits, fault)
    assert ids.tolist() == logits.argmax(-1).tolist() and positions.tolist() == [1] * 5 and fault.item() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ring_argmax_cupy_matches_the_reference(dtype):
    logits = logits_with_ties("cuda").to(dtype)
    expected, got = (torch.zeros(3, 8, dtype=torch.long, device="cuda") for _ in range(2))
    ring_argmax_ref(logits.float(), expected, 1)
    ring_argmax_cupy(logits, got, 1)
    torch.cuda.synchronize()
    assert torch.equal(got, expected)


@pytest.mark.gpu
def test_commit_token_cupy_matches_the_reference():
    sampled = torch.randint(0, 1000, (37,), device="cuda")
    ids_a, ids_b = (torch.zeros(37, dtype=torch.long, device="cuda") for _ in range(2))
    pos_a, pos_b = (torch.arange(37, device="cuda") for _ in range(2))
    commit_token_ref(sampled, ids_a, pos_a)
    commit_token_cupy(sampled, ids_b, pos_b)
    torch.cuda.synchronize()
    assert torch.equal(ids_a, ids_b) and torch.equal(pos_a, pos_b)


@pytest.mark.gpu
@pytest.mark.parametrize("poison", [None, float("nan"), float("-inf")])
def test_fault_word_cupy_matches_the_reference(poison):
    logits = torch.randn(4, 70_000, device="cuda")
    if poison is not None:
        logits[3, 69_999] = poison
    expected, got = (torch.zeros(1, dtype=torch.int32, device="cuda") for _ in range(2))
    fault_word_ref(logits, expected)
    fault_word_cupy(logits, got)
    torch.cuda.synchronize()
    assert got.item() == expected.item() == (0 if poison is None else 1)
