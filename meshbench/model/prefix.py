"""Prefix blocks: whole blocks of prompt positions, keyed by their token ids, held once for every session that
reads them.

A block's key is a chained SHA-256: the key of block i hashes the key of block i-1 and the ids of block i, so a
key names the whole prefix up to the block's end, never one block's ids alone (vLLM's ``hash_block_tokens``
does the same). Only whole blocks are keyed: a prompt of 40 ids in blocks of 16 has two keys, and its last 8
positions stay the session's own.

A block is referenced by the sessions that read it; a block no session references stays cached until space is
needed, and is then evicted least recently used first. The store knows shapes and bytes, never the model.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

ROOT = b"meshbench-prefix-v1"  # the parent of a prompt's first block

KeyFn = Callable[[bytes, Sequence[int]], bytes]


def chained_key(parent: bytes, ids: Sequence[int]) -> bytes:
    """SHA-256 of the parent's key and the block's ids (little-endian int64 each)."""
    return hashlib.sha256(parent + np.asarray(ids, dtype="<i8").tobytes()).digest()


def block_keys(tokens: Sequence[int], block_tokens: int, key: KeyFn = chained_key) -> list[bytes]:
    """The keys of the whole blocks of ``tokens``, in order."""
    keys: list[bytes] = []
    parent = ROOT
    for i in range(len(tokens) // block_tokens):
        parent = key(parent, tokens[i * block_tokens : (i + 1) * block_tokens])
        keys.append(parent)
    return keys


@dataclass(slots=True)
class Block:
    """One cached block: its key, its K/V for ``block_tokens`` positions, and the sessions reading it. The GGUF
    engine's blocks have no arrays here: their K/V are cells of llama.cpp sequences (engine.gguf_prefix)."""

    key: bytes
    k: np.ndarray | None  # (n_layers, block_tokens, n_kv_heads, head_dim)
    v: np.ndarray | None  # (n_layers, block_tokens, n_kv_heads, head_dim)
    refs: int = 0


class PrefixBlocks:
    """The store: blocks by key, least recently used first."""

    def __init__(self, block_tokens: int, key: KeyFn = chained_key) -> None:
        if not isinstance(block_tokens, int) or block_tokens < 1:
            raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
        self.block_tokens = block_tokens
        self.key = key
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    @property
    def positions(self) -> int:
        """Positions the store holds (each block once, referenced or not)."""
        return len(self._blocks) * self.block_tokens

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        return block_keys(tokens, self.block_tokens, self.key)

    def match(self, keys: Sequence[bytes]) -> list[Block]:
        """The longest run of resident blocks from the first key on, marked most recently used (``touch``)."""
        run: list[Block] = []
        for k in keys:
            b = self._blocks.get(k)
            if b is None:
                break
            run.append(b)
        self.touch(run)
        return run

    def touch(self, run: Sequence[Block]) -> None:
        """Mark a chain of blocks most recently used, its last block first: a parent is then always more recent
        than its children, so eviction takes a chain from its tail and never leaves a block no prefix reaches."""
        for b in reversed(run):
            self._blocks.move_to_end(b.key)

    def add(self, key: bytes, k: np.ndarray | None = None, v: np.ndarray | None = None) -> Block:
        """A new block, unreferenced (the caller acquires it); its arrays, if any, are the store's own copies."""
        assert key not in self._blocks, key.hex()
        block = Block(key, None if k is None else k.copy(), None if v is None else v.copy())
        self._blocks[key] = block
        return block

    def get(self, key: bytes) -> Block | None:
        return self._blocks.get(key)

    @staticmethod
    def acquire(blocks: Sequence[Block]) -> None:
        for b in blocks:
            b.refs += 1

    @staticmethod
    def release(blocks: Sequence[Block]) -> None:
        for b in blocks:
            assert b.refs > 0, b.key.hex()
            b.refs -= 1

    def unreferenced(self) -> Iterator[bytes]:
        """Keys no session references, least recently used first (a snapshot: evicting while iterating is safe)."""
        return iter([k for k, b in self._blocks.items() if b.refs == 0])

    def evict(self, key: bytes) -> None:
        assert self._blocks[key].refs == 0, key.hex()
        del self._blocks[key]
        self.evictions += 1
