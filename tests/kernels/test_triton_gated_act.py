"""The gated MLP's activation and multiply in one kernel (engine/kernels/gpu/triton_gated_act.py) against the
torch ops of engine/model/layers.py's GatedMLP (the fused gate/up output chunked, act(gate) * up), on the CPU
under Triton's interpreter in float32: SiLU and GELU's tanh approximation within 1e-5 absolute and relative
(the kernel's GELU is x * sigmoid(2y), torch's 0.5 x (1 + tanh(y)), which loses digits where tanh nears -1),
over values far into both tails. bfloat16 on a GPU only (the gpu-marked test):
the interpreter truncates where compiled code rounds to nearest.
"""

from __future__ import annotations

import pytest
import torch

from engine.model.layers import ACTIVATIONS
from tests.kernels import triton_interpreter

INTERPRETED = triton_interpreter.select()  # before triton is first imported

from engine.kernels.gpu import triton_gated_act  # noqa: E402


@pytest.fixture
def kernel():
    if not INTERPRETED:
        pytest.skip("a CUDA device is here: the compiled kernel is tested on it (the gpu-marked test)")
    return triton_gated_act


def torch_ops(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return ACTIVATIONS[activation](gate) * up


def check(kernel, rows, features, activation, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(rows, 2 * features, generator=g) * 6).to(dtype).to(device)  # far into both tails
    got = kernel.gated_act(gate_up, activation)
    assert got.shape == (rows, features) and got.dtype == dtype
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got, torch_ops(gate_up, activation), atol=tolerance, rtol=tolerance)


# GELU's exp(-2y) overflows to inf far into the negative tail, as it may: x / inf is the 0 GELU tends to
# there. numpy (the interpreter's arithmetic) warns of it; compiled code does not.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("rows, features", [(1, 96), (7, 1536), (3, 2500)])  # one block, several, a tail
def test_against_the_torch_ops(kernel, activation, rows, features):
    check(kernel, rows, features, activation, seed=rows + features)


def test_leading_dimensions_and_strided_rows(kernel):
    g = torch.Generator().manual_seed(1)
    gate_up = torch.randn(2, 3, 300, generator=g)[..., :200]  # rows strided by 300
    got = kernel.gated_act(gate_up, "silu")
    assert got.shape == (2, 3, 100)
    torch.testing.assert_close(got, torch_ops(gate_up, "silu"), atol=1e-5, rtol=1e-5)


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="activation must be one of"):
        triton_gated_act.gated_act(torch.zeros(2, 8), "relu")
    with pytest.raises(ValueError, match="do not split evenly"):
        triton_gated_act.gated_act(torch.zeros(2, 7), "silu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_on_cuda_against_the_torch_ops(dtype, activation):
    check(triton_gated_act, 33, 8192, activation, dtype=dtype, device="cuda")
