"""The output head's second route: the file's quantized head weight through the int4 kernel, for a few rows.

The head (SmolLM2's tied 49152 x 576 embedding) is the largest matmul of a decode step, and its float copy
must stay: the embedding lookup needs float rows. The file's own Q8_0 (or Q4) blocks, run through torch's
int4 kernel as QuantizedLinear does for the projections, read fewer bytes, which pays while the call is
bound by reading the weight; with more rows the kernel's arithmetic (twice a Q4 matmul for Q8_0) costs
more than the bfloat16 F.linear on the float copy. Measured on a 2-core AVX-512 EPYC, 1 thread, CPU time
per call (int4 route vs bf16 F.linear): 1 row 2.18 vs 3.94 ms, 2 rows 2.57 vs 4.28, 4 rows 3.45 vs 4.22,
8 rows 6.69 vs 4.89 (docs/BENCHMARKS.md, session 11). Hence at most HEAD_KERNEL_MAX_ROWS rows here.

bfloat16 only: in float32 the kernel is a scalar loop on x86, far slower than F.linear. Both routes hold the
same weights up to bfloat16 rounding (scales rounded to bfloat16 here, each weight there), so a decode
step's logits depend on its row count within bfloat16's error, as a bfloat16 matmul's already do; float32
models never take this route.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.quantized import QuantizedLinear

HEAD_KERNEL_MAX_ROWS = 4


class QuantizedHead(nn.Module):
    """The head's quantized weight, for the calls it serves faster than the float head (`serves`)."""

    def __init__(self, linear: QuantizedLinear, max_rows: int = HEAD_KERNEL_MAX_ROWS) -> None:
        super().__init__()
        self.linear = linear
        self.max_rows = max_rows

    def serves(self, hidden: torch.Tensor) -> bool:
        """Whether this route is the faster one for `hidden` [..., in_features]."""
        rows = hidden.numel() // self.linear.in_features
        return hidden.dtype == torch.bfloat16 and hidden.device.type == "cpu" and rows <= self.max_rows

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden)
