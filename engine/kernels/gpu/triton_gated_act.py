"""The gated MLP's middle in one Triton kernel: `act(gate) * up` from the fused gate/up projection's output.

As torch ops (engine/model/layers.py's GatedMLP) it is a chunk into views, the activation (one kernel, a
pass writing act(gate)) and the multiply (another, reading it back): two launches a layer where one does,
and one round trip of the intermediate through memory. One program per (row, block of BLOCK features):

    out[i] = round(round(act(gate[i])) * up[i])     (act in float32; each round to the activations' dtype,
                                                     as torch's two ops round)

with act SiLU (`x / (1 + exp(-x))`: Llama, Qwen, Mistral, Phi-3) or GELU's tanh approximation
(`0.5 x (1 + tanh(y))`, y = sqrt(2 / pi) (x + 0.044715 x^3): Gemma), computed as `x / (1 + exp(-2y))`, the
same function without torch's cancellation where tanh(y) nears -1. Element by element, so a row's bits never
depend on the other rows. Runs on CUDA, and on the CPU under TRITON_INTERPRET=1 (tests only).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch ops serve where Triton is missing
    triton = None

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # HF's hidden_act names, as GatedMLP.activation holds them
BLOCK = 1024  # features per program


if triton is not None:

    @triton.jit
    def _gated_act_kernel(gate_up_ptr, out_ptr, features, stride_in, stride_out,
                          GELU: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < features
        gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=ok, other=0.0).to(tl.float32)
        up = tl.load(gate_up_ptr + row * stride_in + features + cols, mask=ok, other=0.0).to(tl.float32)
        if GELU:  # 0.5 (1 + tanh(y)) is sigmoid(2y): no cancellation where tanh nears -1
            inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)   # sqrt(2 / pi) (x + c x^3)
            activated = gate / (1.0 + tl.exp(-2.0 * inner))
        else:
            activated = gate / (1.0 + tl.exp(-gate))
        activated = activated.to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, (activated * up).to(out_ptr.dtype.element_ty), mask=ok)


def gated_act(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """gate_up [..., 2 * I] (gate first, as fuse_projections concatenates them) -> act(gate) * up [..., I]."""
    if triton is None:
        raise RuntimeError("Triton gated activation: the triton package is not installed")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate and up halves of {gate_up.shape[-1]} features do not split evenly")
    features = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * features)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], features, dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0]:
        _gated_act_kernel[(rows.shape[0], triton.cdiv(features, BLOCK))](
            rows, out, features, rows.stride(0), out.stride(0), GELU=activation == "gelu_pytorch_tanh", BLOCK=BLOCK)
    return out.view(*gate_up.shape[:-1], features)
