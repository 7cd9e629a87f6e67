"""What every module fusing several quantized projections of one input checks and shares: the parts alike in
type and input width, and their biases concatenated. The CPU's QuantizedLinear (engine/model/quantized.py)
and CUDA's CudaInt4Linear (engine/kernels/gpu/cuda_int4.py) both fuse this way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import gguf
import torch


class FusablePart(Protocol):
    qtype: gguf.GGMLQuantizationType
    in_features: int
    out_features: int
    bias: torch.Tensor | None


def fused_bias(linears: Sequence[FusablePart]) -> torch.Tensor | None:
    """The bias of a module fusing `linears` (the parts' biases concatenated, or None); ValueError unless
    the parts share the type and in_features, and all or none of them has a bias."""
    first = linears[0]
    for linear in linears[1:]:
        if linear.qtype != first.qtype or linear.in_features != first.in_features:
            raise ValueError(f"cannot fuse {linear.qtype.name} [{linear.out_features}, {linear.in_features}] "
                             f"with {first.qtype.name} [{first.out_features}, {first.in_features}]: "
                             f"parts must share the type and in_features")
    if len({linear.bias is None for linear in linears}) > 1:
        raise ValueError("cannot fuse parts with and without bias")
    return None if first.bias is None else torch.cat([linear.bias for linear in linears if linear.bias is not None])
