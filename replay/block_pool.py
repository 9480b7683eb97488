"""vLLM's KV block pool and free queue, as plain lists indexed by block id.

A port of ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``BlockHashToBlockMap``) and
``FreeKVCacheBlockQueue`` in ``vllm/v1/core/kv_cache_utils.py`` (vLLM 0.32.0, same rules in
0.33.0), for one full-attention KV-cache group. Blocks are ints; per-block state lives in lists,
which is several times faster than one object per block and keeps memory proportional to the
number of blocks, never to the trace.

Invariants (asserted by ``tests/replay_core_support.check_pool_invariants``; the hot paths assert the cheap ones):

1. Block 0 is the null block: never in the free queue, never hashed, its reference count is not
   maintained. The first real allocation returns block 1.
2. A block other than 0 is in the free queue if and only if its reference count is 0.
3. ``num_free_blocks`` equals the length of the free queue; the queue is a doubly linked list
   (``_next``/``_prev``), so removal from the middle is O(1).
4. A block carries at most one hash key. The map ``_first`` names, for every key some block
   carries, the first-inserted block still carrying it, and nothing else; later blocks with
   the same key (vLLM does not de-duplicate) wait in ``_dups[key]`` in insertion order, which
   exists only while the key has two or more blocks. Memory is bounded by the pool size.
5. Allocation pops from the front of the free queue; a popped block that carries a key loses it
   (eviction). Hits remove blocks from the free queue (``touch``).
6. ``free_blocks`` takes blocks in eviction-priority order (the caller passes a request's blocks
   in reverse). Blocks reaching reference count 0 go to the *front* when they carry no key (or
   caching is off) and to the *back* when they carry one, keeping the given order in each group.

Sequential replay uses :meth:`BlockPool.run_alone`, one pass per request on an idle pool with the
same result as the step-by-step calls (lookup, touch, allocation, registration, free).

Unbounded mode (``num_gpu_blocks=None``) behaves like a pool with infinitely many never-used
blocks: a key is never evicted; new ids are minted when the front of the queue holds no
key-less block. Hit counts equal those of any pool large enough never to evict.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from itertools import islice as _islice
from itertools import repeat as _repeat

from prefixscope.replay.native import NATIVE

_HEAD = -2  # sentinel index: always the second-to-last slot of _next/_prev
_TAIL = -1  # sentinel index: always the last slot
_consume = deque(maxlen=0).extend  # runs an iterator to its end in C


_REPEATED_HIT = ("run_alone: a block key repeats among the request's hits (block keys must "
                 "name their whole prefix)")

#: Largest map built up front (a table of 2**19 slots, 10.5 MB); larger pools grow theirs as used.
MAX_PRESIZED_KEYS = 1 << 18


def presized_map(num_keys: int) -> dict:
    """An empty dict whose table is the one growth would reach when it first holds ``num_keys``.

    CPython grows a dict by rebuilding its table (to the power of two >= 3x its keys) when the
    table's insertion slots (2/3 of its slots) run out, and a new table is new memory, faulted
    in page by page: a block map of 200,000 blocks goes through 15 smaller tables on its way to
    its 2**19 slots. This builds that table before the clock, as vLLM builds its blocks: it
    inserts placeholder keys up to the growth that reaches a table of ``num_keys`` insertion
    slots, then deletes them (deletions never shrink a table). The placeholders use about half
    of those slots, so the first rebuild (same size, dropping their deleted slots) comes after
    about ``num_keys / 2`` insertions; later rebuilds are CPython's as before. At most
    :data:`MAX_PRESIZED_KEYS` keys are provided for. Only speed depends on CPython's growth rule
    (the same in 3.6-3.13); the dict is empty either way.
    """
    num_keys = min(num_keys, MAX_PRESIZED_KEYS)
    size, inserted = 8, 0  # PyDict_MINSIZE, keys inserted when that table was built
    while size * 2 // 3 < num_keys:
        inserted = size * 2 // 3 + 1  # the insertion that finds no free slot
        new = 8
        while new < 3 * (inserted - 1):  # GROWTH_RATE: 3x the keys held
            new *= 2
        size = new
    d = dict.fromkeys(range(inserted))
    _consume(map(d.pop, range(inserted)))
    return d


class FreeBlockQueue:
    """Doubly linked list of free block ids with O(1) removal (vLLM ``FreeKVCacheBlockQueue``).

    ``_next[b]``/``_prev[b]`` link block ``b``; the head and tail sentinels live in the last two
    slots so that Python's negative indexing reaches them while the lists grow.
    """

    __slots__ = ("_next", "_prev", "num_free_blocks", "_ids")

    def __init__(self, num_blocks: int) -> None:
        """Start with blocks ``0 .. num_blocks-1`` queued in id order."""
        n = num_blocks
        # Slots 0..n-1 are blocks; slot n is HEAD, slot n+1 is TAIL.
        # One int object per block id, shared by both lists (and, through them, by the block
        # map): half the memory the id objects' reference counts touch at large capacities.
        ids = list(range(n + 1))
        self._ids = ids  # ids[b] is block b's int object (the compiled run_alone writes these)
        self._next = [*ids[1:], 0 if n else _TAIL, _TAIL]
        self._prev = [*([-1, *ids[:n - 1]] if n else ()), _HEAD, ids[n - 1] if n else _HEAD]
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
        # The block map never holds more keys than usable blocks: its table is built now.
        self._first: dict[Hashable, int] = {} if self._unbounded else presized_map(n - 1)
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
        return sum(k is not None for k in self.block_hash)

    # -- state changes -----------------------------------------------------------------------
    def get_new_blocks(
        self, num_blocks: int, keys: Sequence[Hashable] | None = None, key_start: int = 0,
        num_keys: int = 0,
    ) -> list[int]:
        """Pop ``num_blocks`` blocks from the front, evicting their keys; ref count becomes 1.

        With ``keys``, the first ``num_keys`` popped blocks are also registered under
        ``keys[key_start:key_start + num_keys]`` in the same pass (what ``cache_full_blocks``
        would do right after; the resulting map, duplicates' order included, is the same
        because eviction only removes the popped block and registration only appends).

        Raises:
            ValueError: fewer than ``num_blocks`` free blocks (callers check first, as vLLM's do).
        """
        if self._unbounded:
            ret = self._get_new_blocks_unbounded(num_blocks)
            if num_keys:
                self.cache_full_blocks(ret, keys[key_start:key_start + num_keys], 0, num_keys)
            return ret
        q = self.free_queue
        if num_blocks > q.num_free_blocks:
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool")
        if num_blocks <= 0:
            return []
        assert num_keys <= num_blocks
        # popleft_n, eviction (invariant 5), the reference count and registration in one pass:
        # first the blocks that get a key, then the others.
        nxt = q._next
        ref, bh, first, dups = self.ref_cnt, self.block_hash, self._first, self._dups
        setdefault = first.setdefault
        ret = []
        append = ret.append
        b = nxt[_HEAD]
        evicted = 0
        if num_keys:
            for key in keys[key_start:key_start + num_keys]:
                append(b)
                old = bh[b]
                if old is not None:
                    evicted += 1
                    if dups and old in dups:
                        self._drop_duplicate(b, old)
                    else:  # the key maps to this block alone
                        del first[old]
                ref[b] = 1
                bh[b] = key
                if setdefault(key, b) != b:
                    dups.setdefault(key, []).append(b)
                b = nxt[b]
        for _ in range(num_blocks - num_keys):
            append(b)
            old = bh[b]
            if old is not None:
                evicted += 1
                if dups and old in dups:
                    self._drop_duplicate(b, old)
                else:
                    del first[old]
                bh[b] = None
            ref[b] = 1
            b = nxt[b]
        nxt[_HEAD] = b
        q._prev[b] = _HEAD
        q.num_free_blocks -= num_blocks
        self.num_evicted_blocks += evicted
        self.num_cached_blocks_total += num_keys
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

    def _drop_duplicate(self, b: int, key: Hashable) -> None:
        """Block ``b`` loses ``key``, which has duplicates: the next one takes over if ``b`` was
        the first (invariant 4). The caller clears or replaces ``block_hash[b]``."""
        first, dups = self._first, self._dups
        waiting = dups[key]
        if first[key] == b:
            first[key] = waiting.pop(0)
        else:
            waiting.remove(b)
        if not waiting:
            del dups[key]

    def _evict(self, b: int) -> None:
        """Drop block ``b``'s key from the map (invariant 4: the next duplicate takes over)."""
        key = self.block_hash[b]
        assert key is not None
        if self._dups and key in self._dups:
            self._drop_duplicate(b, key)
        else:
            del self._first[key]
        self.block_hash[b] = None
        self.num_evicted_blocks += 1

    def _register(self, b: int, key: Hashable) -> None:
        self.block_hash[b] = key
        if self._first.setdefault(key, b) != b:
            self._dups.setdefault(key, []).append(b)

    def cache_block(self, b: int, key: Hashable) -> None:
        """Give block ``b`` (full, uncached) the key ``key`` and register it in the map."""
        assert self.block_hash[b] is None and b != 0, b
        self._register(b, key)
        self.num_cached_blocks_total += 1

    def cache_full_blocks(
        self, blocks: Sequence[int], keys: Sequence[Hashable], num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register ``blocks[num_cached_blocks:num_full_blocks]`` under the matching ``keys``.

        vLLM ``BlockPool.cache_full_blocks``: the keys were computed on the request when its
        tokens arrived; ``keys[i]`` belongs to ``blocks[i]``. A key already cached elsewhere
        makes this block a duplicate (invariant 4: the first inserted one keeps answering).
        """
        if num_cached_blocks >= num_full_blocks:
            return
        register = self._register
        bh = self.block_hash
        for b, key in zip(blocks[num_cached_blocks:num_full_blocks],
                          keys[num_cached_blocks:num_full_blocks]):
            assert bh[b] is None and b != 0, b
            register(b, key)
        self.num_cached_blocks_total += num_full_blocks - num_cached_blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on hit blocks, removing those with count 0 from the free queue."""
        ref = self.ref_cnt
        q = self.free_queue
        nxt, prv = q._next, q._prev
        removed = 0
        for b in blocks:
            c = ref[b]
            if c == 0:
                p, n = prv[b], nxt[b]
                nxt[p] = n
                prv[n] = p
                removed += 1
            ref[b] = c + 1
        q.num_free_blocks -= removed

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference per block; queue those reaching 0 (invariant 6).

        Args:
            ordered_blocks: blocks in eviction-priority order (first = evicted first); a
                request's blocks are passed in reverse (vLLM ``SingleTypeKVCacheManager.free``).
        """
        ref, bh = self.ref_cnt, self.block_hash
        q = self.free_queue
        nxt, prv = q._next, q._prev
        front: list[int] = []
        caching = self.enable_caching
        last = prv[_TAIL]  # hashed blocks are linked after the current tail as we go
        n_back = 0
        for b in ordered_blocks:
            c = ref[b] - 1
            if c > 0:
                ref[b] = c
                continue
            if c < 0:  # only the null block, whose count is not maintained (invariant 1)
                assert b == 0, b
                continue
            ref[b] = 0
            if caching and bh[b] is not None:
                nxt[last] = b
                prv[b] = last
                last = b
                n_back += 1
            else:
                front.append(b)
        nxt[last] = _TAIL
        prv[_TAIL] = last
        q.num_free_blocks += n_back
        if front:
            q.prepend_n(front)

    def is_idle(self) -> bool:
        """True when no block is in use (bounded pool: every usable block is in the free queue)."""
        if self._unbounded:
            return not any(self.ref_cnt)
        return self.free_queue.num_free_blocks == self.num_gpu_blocks - 1

    def run_alone(
        self, keys: Sequence[Hashable], num_lookup: int, num_blocks: int, num_keyed: int,
    ) -> int:
        """One request's whole life on an idle pool, in one pass; returns its hit blocks.

        Equivalent, state and counters included, to vLLM's sequence for a request that runs
        alone (``vllm/v1/core/block_pool.py`` and ``kv_cache_manager.py``, 0.32.0):
        ``get_cached_block`` on ``keys[:num_lookup]`` up to the first miss (hits ``h``),
        ``touch`` of the hits, ``get_new_blocks(num_blocks - h)`` with ``cache_full_blocks`` of
        ``keys[h:num_keyed]`` on the first of them, then ``free_blocks`` of all its blocks in
        reverse. Reference counts are 0 before and after, so they are not written. Popping every
        new block before registering any key gives the same map as vLLM's interleaving
        (eviction removes only the popped block's key; registration only appends; invariant 4).

        Args:
            keys: the request's block keys (at least ``num_keyed``).
            num_lookup: keys that may hit (``floor((n - 1) / block_size)``, 0 for skip-read).
            num_blocks: blocks the request holds at its peak (``cdiv(tokens, block_size)``),
                1 .. ``num_gpu_blocks - 1``.
            num_keyed: blocks full at the end, ``num_lookup <= num_keyed <= num_blocks``.

        Runs in C when the extension is built (``replay/_native.c``, the same reads and writes
        on these lists and dicts; :meth:`_run_alone_python` is the reference it is tested
        against).

        Raises:
            AssertionError: the pool is unbounded, caching is off or a block is in use
                (callers use the step-by-step path then).
            ValueError: the sizes are out of range (``keys`` shorter than ``num_keyed``
                included), or a key repeats among the hits (keys that do not name their whole
                prefix); the pool is left as it was.
        """
        q = self.free_queue
        assert not self._unbounded and self.enable_caching
        assert q.num_free_blocks == self.num_gpu_blocks - 1
        if not (0 <= num_lookup <= num_keyed <= num_blocks <= q.num_free_blocks
                and len(keys) >= num_keyed):
            raise ValueError(f"run_alone: sizes out of range (num_lookup {num_lookup}, "
                             f"num_keyed {num_keyed}, num_blocks {num_blocks}, {len(keys)} keys, "
                             f"{q.num_free_blocks} free blocks)")
        if NATIVE is not None and type(keys) is list:
            # The same reads and writes in C (replay/_native.c; tests/test_replay_native.py).
            nh, evicted = NATIVE.run_alone(
                q._next, q._prev, self.block_hash, self._first, self._dups, q._ids, keys,
                num_lookup, num_blocks, num_keyed, self._drop_duplicate)
            self.num_evicted_blocks += evicted
            self.num_cached_blocks_total += num_keyed - nh
            return nh
        return self._run_alone_python(keys, num_lookup, num_blocks, num_keyed)

    def _run_alone_python(
        self, keys: Sequence[Hashable], num_lookup: int, num_blocks: int, num_keyed: int,
    ) -> int:
        """:meth:`run_alone` in Python: the reference the compiled loop must equal."""
        q = self.free_queue
        nxt, prv = q._next, q._prev
        bh, first, dups = self.block_hash, self._first, self._dups
        # Lookup (vLLM KVCacheManager.get_computed_blocks) and touch (the hits leave the queue).
        hits: list[int] = []
        if num_lookup:
            get = first.get
            app = hits.append
            for key in _islice(keys, num_lookup):  # stops at the first miss
                b = get(key)
                if b is None:
                    break
                app(b)
            for i, b in enumerate(hits):
                p, n = prv[b], nxt[b]
                if nxt[p] != b:  # hit twice: a key repeats among the hits
                    for u in reversed(hits[:i]):  # relink in reverse: the queue as it was
                        nxt[prv[u]] = u
                        prv[nxt[u]] = u
                    raise ValueError(_REPEATED_HIT)
                nxt[p] = n
                prv[n] = p
        nh = len(hits)
        nk = num_keyed - nh
        new_keys = keys[nh:num_keyed]
        # Pop the new blocks from the front and link them, as free_blocks(reversed(blocks))
        # will leave them, in the same pass: the back of the queue becomes ... R's last,
        # new[nk-1], ..., new[0], hits[-1], ..., hits[0]; the key-less new blocks go to the
        # front. R (the rest of the queue) keeps its links. Old keys are collected for eviction.
        r_last = prv[_TAIL]  # R's last block, unless the pops take all of R
        prev = _TAIL
        for b in hits:
            nxt[b] = prev
            prv[prev] = b
            prev = b
        olds: list[Hashable | None] = []
        old_append = olds.append
        keyed: list[int] = []
        keyed_append = keyed.append
        b = nxt[_HEAD]
        for key in new_keys:
            after = nxt[b]
            nxt[b] = prev
            prv[prev] = b
            old_append(bh[b])
            bh[b] = key
            keyed_append(b)
            prev = b
            b = after
        unkeyed: list[int] = []
        for _ in range(num_blocks - num_keyed):
            unkeyed.append(b)
            old_append(bh[b])
            bh[b] = None
            b = nxt[b]
        if b == _TAIL:  # R is empty
            nxt[_HEAD] = prev
            prv[prev] = _HEAD
        else:
            nxt[_HEAD] = b
            prv[b] = _HEAD
            nxt[r_last] = prev
            prv[prev] = r_last
        if unkeyed:
            q.prepend_n(unkeyed[::-1])
            q.num_free_blocks -= len(unkeyed)  # prepend_n counted them; they never left
        # Eviction of the old keys (invariant 4), then registration of the new ones.
        evicted = len(olds) - olds.count(None)
        if evicted:
            if dups and not dups.keys().isdisjoint(olds):
                for b, old in zip(keyed + unkeyed, olds):
                    if old is not None:
                        if old in dups:
                            self._drop_duplicate(b, old)
                        else:
                            del first[old]
            else:  # each old key maps to its block alone
                _consume(map(first.pop, olds, _repeat(None)))
        size = len(first)
        _consume(map(first.setdefault, new_keys, keyed))
        if len(first) - size != nk:  # keys already cached elsewhere: duplicates (invariant 4)
            for b, key in zip(keyed, new_keys):
                if first[key] != b:
                    dups.setdefault(key, []).append(b)
        self.num_evicted_blocks += evicted
        self.num_cached_blocks_total += nk
        return nh

    def reset_prefix_cache(self) -> bool:
        """Clear every key if no block is in use (vLLM ``reset_prefix_cache``); else False."""
        if self._unbounded:
            in_use = any(self.ref_cnt[1:])
        else:
            in_use = self.free_queue.num_free_blocks != self.num_gpu_blocks - 1
        if in_use:
            return False
        self._first = {} if self._unbounded else presized_map(self.num_gpu_blocks - 1)
        self._dups = {}
        self.block_hash = [None] * len(self.block_hash)
        return True
