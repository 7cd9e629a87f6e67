"""Host values onto the device without a blocking copy.

A copy from pageable host memory makes the host wait for the device (the driver stages it through a
pinned buffer of its own), so a step that builds its inputs that way waits for the previous step's
kernels before it can launch anything. Staged in pinned memory and copied non-blocking instead, the
copy queues behind them on the stream; torch's pinned allocator keeps the staging buffer until the
copy has run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def device_tensor(values: torch.Tensor | Sequence[int] | Sequence[Sequence[int]], device: torch.device,
                  dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (nested lists of numbers, or a host tensor) as a tensor on `device`."""
    if device.type != "cuda":
        return torch.as_tensor(values, dtype=dtype, device=device)
    host = values.to(dtype).pin_memory() if isinstance(values, torch.Tensor) else \
        torch.tensor(values, dtype=dtype, pin_memory=True)
    return host.to(device, non_blocking=True)
