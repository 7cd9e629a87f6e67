"""The KV block pool with automatic prefix caching: block hashes, reference counts, LRU reuse.

A full block of a sequence is named by a hash chained over (its parent block's hash, its token ids,
the cache scope): two blocks with the same hash hold the same keys and values, computed for the same
scope. The scope is the requesting user unless an operator widens it (EngineConfig.prefix_cache_scope),
so a lookup can only ever find blocks computed for the same scope: no user hits, or can time, another
user's prefix.

Every allocated block has a reference count (the sequences whose block table holds it). A hashed
block is immutable: it is full, and its holders only ever write at positions past it. When its count
drops to zero it stays cached (and counts as free, since it can be taken back at once); when the
pool needs room, the least recently used of those is evicted first, and only after the never-cached
free blocks are used up.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

BlockHash = bytes


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than asked for; nothing was allocated."""


def block_hash(parent: BlockHash | None, tokens: list[int], scope: str) -> BlockHash:
    """The hash of one full block. Scope and tokens are length-prefixed so no two different inputs
    spell the same bytes; a cryptographic digest, because a collision would hand one scope's keys and
    values to another."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(parent or b"\0" * 16)
    encoded_scope = scope.encode()
    digest.update(len(encoded_scope).to_bytes(4, "little") + encoded_scope)
    digest.update(len(tokens).to_bytes(4, "little"))
    for token in tokens:
        digest.update(token.to_bytes(4, "little"))
    return digest.digest()


def chain_hashes(tokens: list[int], block_size: int, scope: str, known: list[BlockHash]) -> list[BlockHash]:
    """`known` extended with the hashes of every further full block of `tokens` (known ones are kept)."""
    hashes = list(known)
    for index in range(len(hashes), len(tokens) // block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(block_hash(parent, tokens[index * block_size:(index + 1) * block_size], scope))
    return hashes


class BlockPool:
    """Block ids 0..num_blocks-1 with reference counts and a hash index. Allocation is all-or-nothing;
    without any `register` call it behaves as a plain free list."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        # Pop from the end so that low block ids are handed out first (easier to read in dumps).
        self._free = list(range(num_blocks - 1, -1, -1))
        self._refs: dict[int, int] = {}  # allocated block -> holders (>= 1); cached idle blocks are absent
        self._by_hash: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # hashed blocks no one holds, oldest first

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take now: never-cached ones and idle cached ones."""
        return len(self._free) + len(self._idle)

    @property
    def num_cached(self) -> int:
        """Blocks holding a hashed prefix, held or idle."""
        return len(self._hash_of)

    @property
    def num_held(self) -> int:
        """Blocks some sequence holds: 0 once every sequence has finished (no leaked reference)."""
        return len(self._refs)

    def ref_count(self, block: int) -> int:
        return self._refs.get(block, 0)

    def is_shared_or_immutable(self, block: int) -> bool:
        """A block no one may write into: held by more than one sequence, or full and hashed."""
        return self._refs.get(block, 0) > 1 or block in self._hash_of

    def allocate(self, count: int) -> list[int]:
        """`count` fresh, writable blocks, each held once; never-cached blocks first, then the least
        recently used idle cached ones (their hashes are forgotten)."""
        if count > self.num_free:
            raise OutOfBlocks(f"asked for {count} KV blocks, {self.num_free} free")
        blocks = []
        for _ in range(count):
            if self._free:
                block = self._free.pop()
            else:
                block, _ = self._idle.popitem(last=False)
                del self._by_hash[self._hash_of.pop(block)]
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; a block no one holds any more stays cached if it is hashed."""
        for block in blocks:
            refs = self._refs.get(block, 0)
            if refs <= 0:
                raise ValueError(f"block {block} freed but not allocated")
            if refs > 1:
                self._refs[block] = refs - 1
                continue
            del self._refs[block]
            if block in self._hash_of:
                self._idle[block] = None  # most recently used last
            else:
                self._free.append(block)

    def lookup(self, hashes: list[BlockHash]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes`; takes no reference."""
        found = []
        for value in hashes:
            block = self._by_hash.get(value)
            if block is None:
                break
            found.append(block)
        return found

    def acquire(self, blocks: list[int]) -> None:
        """Take one reference to each cached block (found by `lookup`)."""
        for block in blocks:
            if block in self._idle:
                del self._idle[block]
                self._refs[block] = 1
            elif block in self._refs:
                self._refs[block] += 1
            else:
                raise ValueError(f"block {block} acquired but neither cached nor held")

    def register(self, block: int, value: BlockHash) -> None:
        """Name a held, full block by its hash, making it immutable and findable. A hash already cached
        in another block keeps that one (this block stays private and is freed as usual)."""
        if self._refs.get(block, 0) < 1:
            raise ValueError(f"block {block} registered but not held")
        if value in self._by_hash or block in self._hash_of:
            return
        self._by_hash[value] = block
        self._hash_of[block] = value

    def clear_cache(self) -> None:
        """Forget every hash (prefix caching turned off): idle cached blocks become plain free blocks."""
        self._free.extend(self._idle)
        self._idle.clear()
        self._by_hash.clear()
        self._hash_of.clear()
