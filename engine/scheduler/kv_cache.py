"""The paged KV cache: fixed-size blocks of key/value slots; and the plain free list of host swap space.

A sequence owns a list of block ids (its block table); its token at position p lives in slot
`block_table[p // block_size] * block_size + p % block_size`. Attention writes new keys/values by slot
and reads a sequence's history through its block table, so sequences of any length share one
preallocated pool and a finished sequence's blocks are reused at once. The schedulers decide who gets
blocks; this module only keeps the memory, and its `pool` of block ids (engine/scheduler/block_pool.py:
reference counts, and full blocks kept cached for reuse by a later prompt with the same prefix).
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Protocol

import numpy
import torch

from engine.scheduler.block_pool import BlockPool, OutOfBlocks


class _ModelDimensions(Protocol):  # a ModelConfig, without importing the model from below it
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...


@dataclass(frozen=True)
class KVShape:
    """What the cache's memory depends on, and nothing else of the model."""
    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: _ModelDimensions) -> KVShape:
        return cls(config.num_hidden_layers, config.num_key_value_heads, config.head_dim)


class SwapBlockAllocator:
    """Host swap space's free list over block ids 0..num_blocks-1. Allocation is all-or-nothing. (The
    device pool is a BlockPool, engine/scheduler/block_pool.py, which adds reference counts and cached
    prefixes.)"""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        # Pop from the end so that low block ids are handed out first (easier to read in dumps).
        self._free = list(range(num_blocks - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfBlocks(f"asked for {count} KV blocks, {len(self._free)} free")
        blocks = [self._free.pop() for _ in range(count)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            if block not in self._used:
                raise ValueError(f"block {block} freed but not allocated")
            self._used.remove(block)
            self._free.append(block)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


ALIGNMENT = 64  # a cache line, as torch aligns its own CPU tensors


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed pool. On the CPU its pages are the kernel's zero pages until a block is first written
    (numpy's zeros is calloc, which maps fresh memory rather than filling it; torch.zeros writes every
    byte): a pool costs memory only as far as sequences have used it, and a large one starts at once."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    size = math.prod(shape) * dtype.itemsize
    raw = numpy.zeros(size + ALIGNMENT, dtype=numpy.uint8)
    start = -raw.ctypes.data % ALIGNMENT  # calloc's block starts 16 bytes into its page: rows then straddle lines
    return torch.from_numpy(raw[start:start + size]).view(dtype).view(shape)


class PagedKVCache:
    """Preallocated key and value slots for every layer: [layers, (num_blocks + 1) * block_size, kv_heads,
    head_dim]. The extra block, `pad_block`, is never allocated: padding rows of a captured decode
    graph write there, so they can never touch a sequence's keys and values."""

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.pad_block = num_blocks
        slots = (shape.layers, (num_blocks + 1) * block_size, shape.kv_heads, shape.head_dim)
        self.keys = _zeros(slots, dtype, torch.device(device))
        self.values = _zeros(slots, dtype, self.keys.device)
        self.pool = BlockPool(num_blocks)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index], self.values[index]
