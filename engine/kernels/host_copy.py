"""Host values onto the device without a blocking copy, and the per-step block tables built fast on the host.

A copy from pageable host memory makes the host wait for the device (the driver stages it through a
pinned buffer of its own), so a step that builds its inputs that way waits for the previous step's
kernels before it can launch anything. Staged in pinned memory and copied non-blocking instead, the
copy queues behind them on the stream; torch's pinned allocator keeps the staging buffer until the
copy has run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def device_tensor(values: torch.Tensor | Sequence[int] | Sequence[Sequence[int]], device: torch.device,
                  dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (nested lists of numbers, or a host tensor) as a tensor on `device`."""
    if device.type != "cuda":
        return torch.as_tensor(values, dtype=dtype, device=device)
    host = values.to(dtype).pin_memory() if isinstance(values, torch.Tensor) else \
        torch.tensor(values, dtype=dtype, pin_memory=True)
    return host.to(device, non_blocking=True)


def padded_rows(rows: Sequence[Sequence[int]], width: int, pad: int | None = None,
                height: int | None = None) -> torch.Tensor:
    """[height (default len(rows)), width] int64 host tensor: each row followed by `pad`, or where `pad` is
    None by its own last value (block tables: a row never points at another sequence's memory); rows past
    len(rows) all `pad`. Written row by row into one numpy array: this runs every step, and torch.tensor
    of the padded nested lists took 3-7 times as long (6.6x at 64 rows of 512 blocks, bench/host_tables.py)."""
    table = np.full((len(rows) if height is None else height, width), 0 if pad is None else pad, dtype=np.int64)
    for line, row in zip(table, rows):
        line[: len(row)] = row
        if pad is None:
            line[len(row):] = row[-1]
    return torch.from_numpy(table)
