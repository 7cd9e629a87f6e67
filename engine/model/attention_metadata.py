"""What one step's attention needs to know, built once per step and shared by every layer.

The batch is a flat run of tokens from several sequences. A step is split as vLLM splits prefill and
decode metadata: the decodes (sequences fed one token) attend together, exactly as in a step of
decodes only, over block tables and a mask sized to the decodes; each prefill (a whole prompt or a
chunk of one, more than one token) attends alone over its own keys. A decode's attention is then the
same computation whether or not a prefill shares its step, and nobody pays for anybody else's length:
padding every sequence to the step's longest query run and longest block table instead would make
each decode beside a 256-token chunk deep into a long prompt attend as 256 queries over the whole
prompt's keys.

On the CPU with the native kernels (engine/kernels/cpu/paged_attention.py) neither split is used: every token
of the step goes through one op that reads each token's own keys through its sequence's block table,
so the metadata also carries every sequence's table and each token's sequence (`block_tables`,
`token_sequence`).

Everything is built from host lists with one device copy per tensor (engine/kernels/host_copy.py); the
per-layer code only slices and indexes with what is here, so no layer waits on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch

from engine.kernels.host_copy import device_tensor, padded_rows


@dataclass(frozen=True)
class DecodeGroup:
    """The step's one-token sequences, attended together in one call."""
    token_index: torch.Tensor | None  # [Bd] flat index of each decode's token; None: the step is decodes only
    block_tables: torch.Tensor        # [Bd, max_blocks] each decode's blocks, padded (masked) to the longest
    positions: torch.Tensor           # [Bd] each decode's position: it attends keys 0 .. position (the
                                      # paged kernels' bounds, where the torch path reads the mask)
    block_size: int
    sliding_window: int | None
    mask_dtype: torch.dtype           # the activations' (SDPA's fused kernels want the bias to match)

    @cached_property
    def attn_mask(self) -> torch.Tensor:
        """[Bd, 1, 1, max_blocks * block_size] additive: 0 may attend, -inf not. Built on first use, once
        per step (every layer of the torch path reads this one): the paged kernels (Triton, the native CPU
        op) read `positions` instead and never build it."""
        keys = self.block_tables.shape[1] * self.block_size
        return _decode_mask(self.positions, keys, self.sliding_window, self.mask_dtype)


@dataclass(frozen=True)
class PrefillGroup:
    """One sequence fed more than one token: its queries over its own keys only."""
    start: int                        # its queries are the flat tokens [start, stop)
    stop: int
    block_table: torch.Tensor | None  # [blocks] its keys are the first key_len slots of these blocks;
                                      # None: nothing cached, its keys are the step's own
    key_len: int
    attn_mask: torch.Tensor | None    # [1, 1, queries, key_len] additive (a sliding window cuts); None: causal,
                                      # the key_len - queries cached keys before every query


@dataclass(frozen=True)
class AttentionMetadata:
    positions: torch.Tensor       # [N] position of each flat token
    slot_mapping: torch.Tensor    # [N] cache slot each token's key/value is written to
    last_token_index: torch.Tensor  # [B] flat index of each sequence's last token (whose logits are sampled)
    decodes: DecodeGroup | None   # None when every sequence of the step is a prefill
    prefills: tuple[PrefillGroup, ...]
    block_size: int
    # For the native CPU op (None on other devices): every sequence's blocks, padded with its own last
    # block (never read), and the row of it each flat token reads.
    block_tables: torch.Tensor | None = None     # [B, max_blocks]
    token_sequence: torch.Tensor | None = None   # [N]
    # The same step as the model's sliding-window layers see it, where it also has layers without a
    # window (Gemma 3); None where every layer sees the step alike.
    windowed: "AttentionMetadata | None" = None

    def for_window(self, window: int | None) -> "AttentionMetadata":
        """What a layer with sliding window `window` (None: none) attends with."""
        return self.windowed if window is not None and self.windowed is not None else self

    @property
    def decode_only(self) -> bool:
        """Every sequence feeds exactly one token (a captured graph's step)."""
        return not self.prefills

    @classmethod
    def build(cls, *, block_size: int, block_tables: list[list[int]], cached_lens: list[int],
              query_lens: list[int], sliding_window: int | None = None, some_layers_windowed: bool = False,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> "AttentionMetadata":
        """Metadata for one step. Sequence b already has cached_lens[b] tokens in its blocks and feeds
        query_lens[b] new tokens (its whole prompt or a chunk for a prefill, 1 for a decode).
        `sliding_window` applies to every layer, or with `some_layers_windowed` (ModelConfig.mixes_windows)
        only to the layers that read `windowed`."""
        if some_layers_windowed and sliding_window is not None:
            whole = cls.build(block_size=block_size, block_tables=block_tables, cached_lens=cached_lens,
                              query_lens=query_lens, device=device, dtype=dtype)
            windowed = cls.build(block_size=block_size, block_tables=block_tables, cached_lens=cached_lens,
                                 query_lens=query_lens, sliding_window=sliding_window, device=device, dtype=dtype)
            return replace(whole, windowed=windowed)
        _check_fits(block_size, block_tables, cached_lens, query_lens)
        # Plain Python lists first, one tensor per field at the end: this runs every step, and many
        # small tensor operations cost more than the arithmetic.
        device = torch.device(device)
        positions: list[int] = []
        slots: list[int] = []
        last: list[int] = []
        decode_rows: list[int] = []
        decode_tokens: list[int] = []
        prefills: list[PrefillGroup] = []
        flat = 0
        for b, (table, cached, count) in enumerate(zip(block_tables, cached_lens, query_lens)):
            new = range(cached, cached + count)
            positions.extend(new)
            slots.extend(table[p // block_size] * block_size + p % block_size for p in new)
            if count == 1:
                decode_rows.append(b)
                decode_tokens.append(flat)
            else:
                prefills.append(_prefill_group(flat, table, cached, count, block_size, sliding_window, device, dtype))
            flat += count
            last.append(flat - 1)
        native = _native_tables(block_tables, query_lens, device) if device.type == "cpu" else None
        decodes = None
        if decode_rows:
            decodes = _decode_group(
                token_index=decode_tokens if prefills else None,
                block_tables=[block_tables[b] for b in decode_rows],
                positions=[cached_lens[b] for b in decode_rows],
                block_size=block_size, sliding_window=sliding_window, device=device, dtype=dtype)
        return cls(positions=device_tensor(positions, device), slot_mapping=device_tensor(slots, device),
                   last_token_index=device_tensor(last, device), decodes=decodes, prefills=tuple(prefills),
                   block_size=block_size, block_tables=None if native is None else native[0],
                   token_sequence=None if native is None else native[1])


def _check_fits(block_size: int, block_tables: list[list[int]], cached_lens: list[int],
                query_lens: list[int]) -> None:
    if not (len(block_tables) == len(cached_lens) == len(query_lens)) or not query_lens:
        raise ValueError("block_tables, cached_lens and query_lens must be non-empty and of one length")
    for b, table in enumerate(block_tables):
        if len(table) * block_size < cached_lens[b] + query_lens[b]:
            raise ValueError(f"sequence {b}: {cached_lens[b] + query_lens[b]} tokens do not fit its "
                             f"{len(table)} blocks")


def _native_tables(block_tables: list[list[int]], query_lens: list[int],
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The native CPU op's block tables (each padded with its own last block, never read) and each flat
    token's sequence."""
    return (device_tensor(padded_rows(block_tables, max(len(t) for t in block_tables)), device),
            device_tensor([b for b, count in enumerate(query_lens) for _ in range(count)], device))


def _decode_group(*, token_index: list[int] | None, block_tables: list[list[int]], positions: list[int],
                  block_size: int, sliding_window: int | None, device: torch.device,
                  dtype: torch.dtype) -> DecodeGroup:
    # Padded with the sequence's own last block: masked either way, but a sequence never reads
    # another sequence's memory, whatever state it is in.
    padded = padded_rows(block_tables, max(len(t) for t in block_tables))
    return DecodeGroup(token_index=None if token_index is None else device_tensor(token_index, device),
                       block_tables=device_tensor(padded, device), positions=device_tensor(positions, device),
                       block_size=block_size, sliding_window=sliding_window, mask_dtype=dtype)


def _decode_mask(positions: torch.Tensor, keys: int, sliding_window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, 1, keys] additive mask of one query per sequence at `positions`, built on the device. In the
    activation dtype (SDPA's fused kernels want the bias to match the queries): a boolean mask would be
    converted again by every layer."""
    key_pos = torch.arange(keys, device=positions.device)[None, :]
    allowed = key_pos <= positions[:, None]  # also excludes keys past the sequence's length
    if sliding_window is not None:
        allowed &= key_pos > positions[:, None] - sliding_window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device).masked_fill_(~allowed, float("-inf"))
    return mask[:, None, None, :]


def _prefill_group(start: int, table: list[int], cached: int, count: int, block_size: int,
                   sliding_window: int | None, device: torch.device, dtype: torch.dtype) -> PrefillGroup:
    """One prefill's queries [start, start + count) at positions cached.. over the keys they may see."""
    stop, seen = start + count, cached + count

    def blocks_from(first: int) -> torch.Tensor | None:
        # None when nothing is cached (a whole prompt): its keys are the step's own.
        return device_tensor(table[first: -(-seen // block_size)], device) if cached else None

    if sliding_window is None or seen <= sliding_window:
        # Causal with every cached key before every query (lower-right): no mask tensor, so that SDPA can
        # take its flash kernel (given a mask and GQA it takes only the float32 math one).
        return PrefillGroup(start, stop, block_table=blocks_from(0), key_len=seen, attn_mask=None)
    # The first query sees nothing before cached + 1 - window: blocks wholly before that are not read.
    first_block = max(0, cached + 1 - sliding_window) // block_size
    key_start = first_block * block_size
    query_pos = torch.arange(cached, seen, device=device)[:, None]   # [q, 1]
    key_pos = torch.arange(key_start, seen, device=device)[None, :]  # [1, T]
    allowed = (key_pos <= query_pos) & (key_pos > query_pos - sliding_window)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
    return PrefillGroup(start, stop, block_table=blocks_from(first_block), key_len=seen - key_start,
                        attn_mask=mask[None, None])


def decode_metadata(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int,
                    sliding_window: int | None, dtype: torch.dtype,
                    some_layers_windowed: bool = False) -> AttentionMetadata:
    """Metadata for a batch of one-token decodes, from device tensors by tensor operations only: what
    a captured graph can recompute on replay from its static buffers, with no host values.
    `sliding_window` and `some_layers_windowed` as in AttentionMetadata.build."""
    rows = torch.arange(block_tables.shape[0], device=positions.device)
    slots = block_tables[rows, positions // block_size] * block_size + positions % block_size

    def seen_through(window: int | None) -> AttentionMetadata:
        decodes = DecodeGroup(token_index=None, block_tables=block_tables, positions=positions,
                              block_size=block_size, sliding_window=window, mask_dtype=dtype)
        return AttentionMetadata(positions=positions, slot_mapping=slots, last_token_index=rows, decodes=decodes,
                                 prefills=(), block_size=block_size, block_tables=block_tables, token_sequence=rows)

    if some_layers_windowed and sliding_window is not None:
        return replace(seen_through(None), windowed=seen_through(sliding_window))
    return seen_through(sliding_window)
