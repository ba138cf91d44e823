"""A model's KV blocks: who holds which, and the prefix cache (nano-vllm's and vLLM's scheme).

A full block is named by a hash of its tokens chained with the hash of the block before it, so
equal names mean equal prefixes. Blocks are reference-counted: a block whose count drops to 0
keeps its name and contents and joins the back of the free list; allocation takes from the front,
so the least recently released cached block is the first to be reused for something else.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

NO_HASH = None


def chain_hash(prev: int | None, tokens) -> int:
    return hash((prev, tuple(tokens)))


@dataclass(slots=True)
class Block:
    id: int
    ref: int = 0
    hash: int | None = NO_HASH
    tokens: tuple = ()


@dataclass(frozen=True, slots=True)
class Admission:
    """What admitting a sequence would take: its cached leading blocks and the new ones."""
    cached: list  # block ids of the leading full blocks found in the prefix cache
    hashes: list  # their chain hashes
    n_new: int  # blocks to allocate for the first chunk
    takes_free: int  # cached blocks that sit in the free list now (their count goes 0 -> 1)

    def fits(self, n_free: int) -> bool:
        return self.n_new + self.takes_free <= n_free


class BlockManager:
    def __init__(self, n_blocks: int, block_size: int):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(n_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(n_blocks))
        self.by_hash: dict[int, int] = {}
        self.n_cached = 0  # free blocks that keep a name (counted as they come and go: status is O(1))

    # ---- counts (status, metrics) -----------------------------------------------------------
    def counts(self) -> dict[str, int]:
        return {"total": len(self.blocks), "used": len(self.blocks) - len(self.free), "cached": self.n_cached,
                "free": len(self.free) - self.n_cached}

    # ---- admission ------------------------------------------------------------------------------
    def plan(self, seq, n_tokens: int) -> Admission:
        """Admitting `seq` (holding no blocks) with a first chunk of up to n_tokens after its
        cached prefix. The block holding its last token is never taken from the cache: that token
        is run again, for the logits the first new token is sampled from."""
        bs = self.block_size
        cached, hashes, prev = [], [], None
        for i in range((len(seq) - 1) // bs):
            toks = seq.tokens[i * bs:(i + 1) * bs]
            h = chain_hash(prev, toks)
            bid = self.by_hash.get(h)
            if bid is None or self.blocks[bid].tokens != tuple(toks):
                break
            cached.append(bid)
            hashes.append(h)
            prev = h
        start = len(cached) * bs
        n = min(n_tokens, len(seq) - start)
        n_new = -(-(start + n) // bs) - len(cached)
        return Admission(cached, hashes, n_new, sum(1 for b in cached if self.blocks[b].ref == 0))

    def admit(self, seq, a: Admission) -> None:
        for bid in a.cached:
            b = self.blocks[bid]
            if b.ref == 0:
                del self.free[bid]
                self.n_cached -= 1
            b.ref += 1
        seq.block_table = list(a.cached)
        seq.block_hashes = list(a.hashes)
        seq.n_computed = seq.n_cached = len(a.cached) * self.block_size
        seq.n_hashed = len(a.cached)

    # ---- growth and release -------------------------------------------------------------------
    def needed(self, seq, n_tokens: int) -> int:
        """New blocks seq needs to compute n_tokens more."""
        return max(0, -(-(seq.n_computed + n_tokens) // self.block_size) - len(seq.block_table))

    def can_grow(self, seq, n_tokens: int) -> bool:
        return self.needed(seq, n_tokens) <= len(self.free)

    def grow(self, seq, n_tokens: int) -> None:
        for _ in range(self.needed(seq, n_tokens)):
            bid, _ = self.free.popitem(last=False)
            b = self.blocks[bid]
            if b.hash is not NO_HASH:
                self.n_cached -= 1
                if self.by_hash.get(b.hash) == bid:
                    del self.by_hash[b.hash]
            b.hash, b.tokens, b.ref = NO_HASH, (), 1
            seq.block_table.append(bid)

    def release(self, seq) -> None:
        """Give back seq's blocks; the cached ones stay findable until reused. The last blocks go
        in first, so a shared prefix outlives the tails that followed it."""
        for bid in reversed(seq.block_table):
            b = self.blocks[bid]
            b.ref -= 1
            if b.ref == 0:
                self.free[bid] = None
                self.n_cached += b.hash is not NO_HASH
        seq.block_table, seq.block_hashes, seq.n_hashed = [], [], 0

    def register(self, seq) -> None:
        """Name seq's newly computed full blocks, so later requests can reuse them."""
        bs = self.block_size
        while seq.n_hashed < seq.n_computed // bs:
            i = seq.n_hashed
            toks = tuple(seq.tokens[i * bs:(i + 1) * bs])
            h = chain_hash(seq.block_hashes[-1] if seq.block_hashes else None, toks)
            b = self.blocks[seq.block_table[i]]
            if h not in self.by_hash:  # a twin computed by another sequence keeps the name
                b.hash, b.tokens = h, toks
                self.by_hash[h] = b.id
            seq.block_hashes.append(h)
            seq.n_hashed += 1
