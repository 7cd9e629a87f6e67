"""The decode batch's padded block table, kept on the host and the device and updated in place.

Between two decode steps a batch's table barely changes: a sequence gains a block every `block_size`
tokens, and now and then a sequence joins, leaves or moves to another row. Built afresh each step
(engine/kernels/host_copy.py:padded_rows), the table costs host time in proportion to rows x blocks and
a copy of all of it to the device. Here every row is remembered: a step writes only what changed in the
host rows, copies the span of changed rows to the device (in a steady decode, one row now and then), and
hands out a device copy of the rows and blocks asked for.

The contract, whatever order batches come in: `table(tables, height, width)` equals
`padded_rows(tables, width, pad, height)`: each row's own blocks, then the pad block, and every row below
`tables` all pad, so a row never points at another sequence's memory. A remembered row is trusted only
as far as it is, by value, a prefix of the new one; it is a copy, because the scheduler's lists change in
place. Anything else rewrites the row.

On CUDA the host rows are pinned and copied without blocking; before it writes them again, a step waits
for the previous copy to have read them. That wait costs nothing in serving: every step or burst reads
its tokens back before the next one builds its table, and the copy was queued before those tokens.
"""

from __future__ import annotations

import torch

from engine.kernels.host_copy import device_tensor, padded_rows


class DeviceBlockTable:
    """Up to `rows` rows of up to `blocks` blocks; wider or taller tables are built afresh. The buffers
    grow to the largest table asked for, not to those limits (a long length limit's full width, at
    every bucket's rows, would be tens of megabytes that short requests never touch)."""

    def __init__(self, rows: int, blocks: int, pad: int, device: torch.device) -> None:
        self.rows, self.blocks, self.pad, self.device = rows, blocks, pad, device
        self.rows_written = 0  # rows copied to the device so far: what the in-place update saves
        self._host = torch.empty(0, 0, dtype=torch.long)
        self._lines = self._host.numpy()  # the host rows as numpy: element writes without torch's overhead
        self._device = self._host
        self._remembered: list[list[int]] = []  # what each host row holds before its pad
        self._copied: torch.cuda.Event | None = None

    def table(self, tables: list[list[int]], height: int, width: int) -> torch.Tensor:
        """[height, width] int64 on the device: `tables`' rows padded with the pad block, then pad rows."""
        if height > self.rows or width > self.blocks or len(tables) > height:
            return device_tensor(padded_rows(tables, width, pad=self.pad, height=height), self.device)
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the host rows this step rewrites
        if height > self._host.shape[0] or width > self._host.shape[1]:
            self._grow(height, width)
        host, device = self._host, self._device
        changed = [row for row in range(height) if self._write_row(row, tables[row] if row < len(tables) else [])]
        if changed:
            first, last = changed[0], changed[-1] + 1
            device[first:last].copy_(host[first:last], non_blocking=True)
            self._copied = self._record_copy()
            self.rows_written += last - first
        # A copy of its own: a batch keeps its table while later steps update these rows.
        return device[:height, :width].clone(memory_format=torch.contiguous_format)

    def _write_row(self, row: int, blocks: list[int]) -> bool:
        """Bring one host row to `blocks` then pad; False if it already was."""
        line, old = self._lines[row], self._remembered[row]
        kept = len(old)
        if len(blocks) >= kept and blocks[:kept] == old:
            if len(blocks) == kept:
                return False
            line[kept:len(blocks)] = blocks[kept:]
            old.extend(blocks[kept:])
            return True
        line[: len(blocks)] = blocks
        line[len(blocks):kept] = self.pad  # the old row's blocks past the new one's end
        self._remembered[row] = list(blocks)
        return True

    def _grow(self, height: int, width: int) -> None:
        """Buffers of at least height x width, every row pad and remembered empty: the rows are rewritten
        from the next tables (a batch outgrowing its buffers is rare: a larger bucket, a longer context)."""
        rows, blocks = max(height, self._host.shape[0]), max(width, self._host.shape[1])
        # Normal tensors even when first reached from inference mode: later steps update them from outside
        # it (device-loop bursts), which inference tensors refuse.
        with torch.inference_mode(False):
            self._host = torch.full((rows, blocks), self.pad, dtype=torch.long, pin_memory=self.device.type == "cuda")
            # A tensor of its own on the CPU too, so the rows' copy runs (and is tested) everywhere.
            self._device = self._host.to(self.device, copy=True)
        self._lines = self._host.numpy()
        self._remembered = [[] for _ in range(rows)]

    def _record_copy(self) -> torch.cuda.Event | None:
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event
