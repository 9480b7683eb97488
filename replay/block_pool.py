"""vLLM's KV block pool and free queue, as plain lists indexed by block id.

A port of ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``BlockHashToBlockMap``) and
``FreeKVCacheBlockQueue`` in ``vllm/v1/core/kv_cache_utils.py`` (vLLM 0.32.0, same rules in
0.33.0), for one full-attention KV-cache group. Blocks are ints; per-block state lives in lists,
which is several times faster than one object per block and keeps memory proportional to the
number of blocks, never to the trace.

Invariants (asserted by :meth:`BlockPool.check_invariants`; the hot paths assert the cheap ones):

1. Block 0 is the null block: never in the free queue, never hashed, its reference count is not
   maintained. The first real allocation returns block 1.
2. A block other than 0 is in the free queue if and only if its reference count is 0.
3. ``num_free_blocks`` equals the length of the free queue; the queue is a doubly linked list
   (``_next``/``_prev``), so removal from the middle is O(1).
4. A block carries at most one hash key; a block with a key is registered in the cache map
   under that key, and every block the map names carries that key. Several blocks may carry the
   same key (no de-duplication); the map returns the first inserted one still cached.
5. Allocation pops from the front of the free queue; a popped block that carries a key loses it
   (eviction). Hits remove blocks from the free queue (``touch``).
6. ``free_blocks`` takes blocks in eviction-priority order (the caller passes a request's blocks
   in reverse). Blocks reaching reference count 0 go to the *front* when they carry no key (or
   caching is off) and to the *back* when they carry one, keeping the given order in each group.

Unbounded mode (``num_gpu_blocks=None``) behaves like a pool with infinitely many never-used
blocks: a key is never evicted; new ids are minted when the front of the queue holds no
key-less block. Hit counts equal those of any pool large enough never to evict.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence

_HEAD = -2  # sentinel index: always the second-to-last slot of _next/_prev
_TAIL = -1  # sentinel index: always the last slot


class FreeBlockQueue:
    """Doubly linked list of free block ids with O(1) removal (vLLM ``FreeKVCacheBlockQueue``).

    ``_next[b]``/``_prev[b]`` link block ``b``; the head and tail sentinels live in the last two
    slots so that Python's negative indexing reaches them while the lists grow.
    """

    __slots__ = ("_next", "_prev", "num_free_blocks")

    def __init__(self, num_blocks: int) -> None:
        """Start with blocks ``0 .. num_blocks-1`` queued in id order."""
        n = num_blocks
        # Slots 0..n-1 are blocks; slot n is HEAD, slot n+1 is TAIL.
        self._next = [i + 1 for i in range(n)] + [0 if n else _TAIL, _TAIL]
        self._prev = [i - 1 for i in range(n)] + [_HEAD, n - 1 if n else _HEAD]
        if n:
            self._next[n - 1] = _TAIL
            self._prev[0] = _HEAD
        self.num_free_blocks = n

    def grow(self) -> int:
        """Add a new block slot (not queued) and return its id (unbounded pools only)."""
        new_id = len(self._next) - 2
        self._next.insert(new_id, 0)
        self._prev.insert(new_id, 0)
        return new_id

    def first(self) -> int | None:
        """The block at the front, or None when the queue is empty."""
        b = self._next[_HEAD]
        return None if b == _TAIL else b

    def popleft(self) -> int:
        """Remove and return the front block. Raises ``IndexError`` when empty."""
        nxt = self._next
        b = nxt[_HEAD]
        if b == _TAIL:
            raise IndexError("no free blocks")
        after = nxt[b]
        nxt[_HEAD] = after
        self._prev[after] = _HEAD
        self.num_free_blocks -= 1
        return b

    def popleft_n(self, n: int) -> list[int]:
        """Remove and return the first ``n`` blocks, front first (``n`` <= num_free_blocks)."""
        assert 0 <= n <= self.num_free_blocks, (n, self.num_free_blocks)
        if n == 0:
            return []
        nxt = self._next
        out = []
        b = nxt[_HEAD]
        for _ in range(n):
            out.append(b)
            b = nxt[b]
        nxt[_HEAD] = b
        self._prev[b] = _HEAD
        self.num_free_blocks -= n
        return out

    def remove(self, b: int) -> None:
        """Unlink block ``b`` from anywhere in the queue (it must be queued)."""
        nxt, prv = self._next, self._prev
        p, q = prv[b], nxt[b]
        nxt[p] = q
        prv[q] = p
        self.num_free_blocks -= 1

    def append_n(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` at the back, in the given order (the last one becomes the tail)."""
        if not blocks:
            return
        nxt, prv = self._next, self._prev
        last = prv[_TAIL]
        for b in blocks:
            nxt[last] = b
            prv[b] = last
            last = b
        nxt[last] = _TAIL
        prv[_TAIL] = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` at the front, in the given order (``blocks[0]`` becomes the head)."""
        if not blocks:
            return
        nxt, prv = self._next, self._prev
        first = nxt[_HEAD]
        last = _HEAD
        for b in blocks:
            nxt[last] = b
            prv[b] = last
            last = b
        nxt[last] = first
        prv[first] = last
        self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[int]:
        """Block ids front (evicted first) to back."""
        nxt = self._next
        b = nxt[_HEAD]
        while b != _TAIL:
            yield b
            b = nxt[b]

    def ids(self) -> list[int]:
        """Block ids front (evicted first) to back, as a list (for tests and narration)."""
        return list(self)


class BlockPool:
    """vLLM's block pool for one KV-cache group: reference counts, hash keys, free queue.

    Args:
        num_gpu_blocks: vLLM's ``num_gpu_blocks`` *including* the null block 0 (usable capacity
            is ``num_gpu_blocks - 1``), or None for an unbounded pool that never evicts.
        enable_caching: False gives vLLM's caching-off behaviour (no keys, no hits).

    Counters (cumulative): ``num_evicted_blocks`` (keyed blocks that lost their key when
    reallocated; vLLM emits one ``BlockRemoved`` each), ``num_cached_blocks_total`` (keys
    registered; one ``BlockStored`` hash each).
    """

    __slots__ = (
        "num_gpu_blocks", "enable_caching", "ref_cnt", "block_hash", "free_queue",
        "_first", "_dups", "num_evicted_blocks", "num_cached_blocks_total", "_unbounded",
    )

    def __init__(self, num_gpu_blocks: int | None, *, enable_caching: bool = True) -> None:
        if num_gpu_blocks is not None and num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is the null block), "
                             f"got {num_gpu_blocks}")
        self._unbounded = num_gpu_blocks is None
        n = 2 if num_gpu_blocks is None else num_gpu_blocks
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt: list[int] = [0] * n
        self.block_hash: list[Hashable | None] = [None] * n
        self.free_queue = FreeBlockQueue(n)
        # Invariant 1: block 0 is taken as the null block, like vLLM's constructor does.
        null = self.free_queue.popleft()
        assert null == 0
        self._first: dict[Hashable, int] = {}
        self._dups: dict[Hashable, list[int]] = {}
        self.num_evicted_blocks = 0
        self.num_cached_blocks_total = 0

    # -- lookups -----------------------------------------------------------------------------
    def get_cached_block(self, key: Hashable) -> int | None:
        """The first-inserted cached block carrying ``key``, or None (vLLM ``get_cached_block``)."""
        return self._first.get(key)

    def get_num_free_blocks(self) -> int:
        """Free blocks, counting cached blocks with reference count 0 (eviction candidates).

        Unbounded pools report a very large number.
        """
        if self._unbounded:
            return 1 << 62
        return self.free_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc`` as a fraction: ``1 - free / (num_gpu_blocks - 1)``."""
        if self._unbounded:
            return 0.0
        return 1.0 - self.free_queue.num_free_blocks / (self.num_gpu_blocks - 1)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks currently carrying a key (cached, in use or evictable)."""
        return len(self._first) + sum(len(v) for v in self._dups.values())

    # -- state changes -----------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` blocks from the front, evicting their keys; ref count becomes 1.

        Raises:
            ValueError: fewer than ``num_blocks`` free blocks (callers check first, as vLLM's do).
        """
        if self._unbounded:
            return self._get_new_blocks_unbounded(num_blocks)
        if num_blocks > self.free_queue.num_free_blocks:
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool")
        ret = self.free_queue.popleft_n(num_blocks)
        ref, bh = self.ref_cnt, self.block_hash
        for b in ret:
            if bh[b] is not None:
                self._evict(b)
            assert ref[b] == 0
            ref[b] = 1
        return ret

    def _get_new_blocks_unbounded(self, num_blocks: int) -> list[int]:
        q, ref, bh = self.free_queue, self.ref_cnt, self.block_hash
        ret = []
        for _ in range(num_blocks):
            b = q.first()
            if b is not None and bh[b] is None:
                q.popleft()
            else:
                b = q.grow()
                ref.append(0)
                bh.append(None)
            ref[b] = 1
            ret.append(b)
        return ret

    def _evict(self, b: int) -> None:
        """Drop block ``b``'s key from the map (invariant 4: the next duplicate takes over)."""
        key = self.block_hash[b]
        self.block_hash[b] = None
        self.num_evicted_blocks += 1
        first = self._first
        if first.get(key) == b:
            dups = self._dups.get(key)
            if dups:
                first[key] = dups.pop(0)
                if not dups:
                    del self._dups[key]
            else:
                del first[key]
        else:
            dups = self._dups[key]
            dups.remove(b)
            if not dups:
                del self._dups[key]

    def cache_block(self, b: int, key: Hashable) -> None:
        """Give block ``b`` (full, uncached) the key ``key`` and register it in the map."""
        assert self.block_hash[b] is None and b != 0, b
        self.block_hash[b] = key
        self.num_cached_blocks_total += 1
        first = self._first
        if key in first:
            self._dups.setdefault(key, []).append(b)
        else:
            first[key] = b

    def cache_full_blocks(
        self, blocks: Sequence[int], keys: Sequence[Hashable], num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register ``blocks[num_cached_blocks:num_full_blocks]`` under the matching ``keys``.

        vLLM ``BlockPool.cache_full_blocks``: the keys were computed on the request when its
        tokens arrived; ``keys[i]`` belongs to ``blocks[i]``.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        bh, first, dups = self.block_hash, self._first, self._dups
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            key = keys[i]
            assert bh[b] is None and b != 0, b
            bh[b] = key
            if key in first:
                dups.setdefault(key, []).append(b)
            else:
                first[key] = b
        self.num_cached_blocks_total += num_full_blocks - num_cached_blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on hit blocks, removing those with count 0 from the free queue."""
        ref, q = self.ref_cnt, self.free_queue
        for b in blocks:
            if ref[b] == 0:
                q.remove(b)
            ref[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference per block; queue those reaching 0 (invariant 6).

        Args:
            ordered_blocks: blocks in eviction-priority order (first = evicted first); a
                request's blocks are passed in reverse (vLLM ``SingleTypeKVCacheManager.free``).
        """
        ref, bh = self.ref_cnt, self.block_hash
        front: list[int] = []
        back: list[int] = []
        caching = self.enable_caching
        for b in ordered_blocks:
            if b == 0:
                continue
            c = ref[b] - 1
            ref[b] = c
            assert c >= 0, b
            if c == 0:
                if bh[b] is None or not caching:
                    front.append(b)
                else:
                    back.append(b)
        self.free_queue.prepend_n(front)
        self.free_queue.append_n(back)

    def reset_prefix_cache(self) -> bool:
        """Clear every key if no block is in use (vLLM ``reset_prefix_cache``); else False."""
        if self._unbounded:
            in_use = any(self.ref_cnt[1:])
        else:
            in_use = self.free_queue.num_free_blocks != self.num_gpu_blocks - 1
        if in_use:
            return False
        self._first = {}
        self._dups = {}
        self.block_hash = [None] * len(self.block_hash)
        return True

    # -- checks ------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Assert invariants 1-4 over the whole pool (O(num_gpu_blocks); for tests)."""
        queued = self.free_queue.ids()
        assert len(queued) == self.free_queue.num_free_blocks, "invariant 3"
        assert len(set(queued)) == len(queued), "invariant 3: a block is queued twice"
        assert 0 not in queued and self.block_hash[0] is None, "invariant 1"
        qs = set(queued)
        for b in range(1, len(self.ref_cnt)):
            assert self.ref_cnt[b] >= 0
            if not self._unbounded:
                assert (self.ref_cnt[b] == 0) == (b in qs), f"invariant 2: block {b}"
            elif self.ref_cnt[b] > 0:
                assert b not in qs, f"invariant 2: block {b}"
        registered: dict[int, Hashable] = {}
        for key, b in self._first.items():
            registered[b] = key
        for key, bs in self._dups.items():
            assert key in self._first, "invariant 4: duplicates without a first block"
            for b in bs:
                assert b not in registered, "invariant 4: block registered twice"
                registered[b] = key
        for b, key in enumerate(self.block_hash):
            if key is not None:
                assert registered.get(b) == key, f"invariant 4: block {b} not registered"
        assert len(registered) == sum(k is not None for k in self.block_hash), "invariant 4"
