"""Capacity sweep: LRU (vLLM's exact model) and Belady's MIN at several cache sizes.

:func:`collect_accesses` hashes a trace once into an :class:`AccessTrace`: per request its block
keys (interned as ints), how many it may look up, how many blocks it holds at its peak and how
many it leaves keyed (sequential replay: the same quantities ``KVCacheManager.run_alone``
passes to the pool). Keys depend only on tokens, so one trace serves every capacity.

- :func:`lru_hits`: the exact model, ``BlockPool.run_alone`` per request on a pool of that size
  (the same calls ``replay sim``'s sequential replay makes; equal hits, tested).
- :func:`min_hits`: Belady's MIN (Belady 1966) on the same block-key sequence: when blocks are
  needed, evict the cached block whose next lookup is farthest in the future (never looked up
  again first); ties evict the deeper block first, so a parent is never evicted before its
  child (a child's next lookup is never earlier than its parent's). As in vLLM, a request's hit
  blocks are pinned while it runs and it needs all its blocks at once; its keyed blocks stay
  cached afterwards, its partial block does not. Approximations, stated: MIN is optimal for
  single-block references; with prefix lookups and bulk allocation it is the natural offline
  policy, not a proven optimum; a key already cached beyond the break is not duplicated (vLLM
  allocates a second block for it).
- :func:`capacity_sweep`: one row per capacity, sizes run in parallel processes (``fork``: the
  access trace is shared, not copied).
"""

from __future__ import annotations

import gc
import heapq
import os
from itertools import count, islice
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixscope.core.errors import SimulationError
from prefixscope.replay.block_pool import BlockPool
from prefixscope.replay.kv_cache_manager import cdiv
from prefixscope.replay.native import NATIVE
from prefixscope.replay.sim import _RequestFactory
from prefixscope.replay.types import SimConfig, TraceRequest

_INF = 1 << 62


@dataclass
class AccessTrace:
    """A trace as block-key accesses (sequential replay), capacity-independent.

    Attributes:
        block_size: tokens per block.
        keys: per request, its keys as ints below 2^32 (``num_keyed`` of them), chain order.
        num_lookup: per request, keys it may hit (0 for skip-read requests).
        num_blocks: per request, blocks held at its peak (``cdiv(P + out - 1, B)``).
        prompt_tokens: per request, prompt tokens.
        counted: per request, counted in the hit rate (not skip-read).
        rejected: requests the trace reader passed but ``max_model_len`` rejects (all sizes).
    """

    block_size: int
    keys: list[list[int]] = field(default_factory=list)
    num_lookup: list[int] = field(default_factory=list)
    num_blocks: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    counted: list[bool] = field(default_factory=list)
    rejected: int = 0

    def __len__(self) -> int:
        return len(self.keys)


def collect_accesses(requests: Iterable[TraceRequest], config: SimConfig) -> AccessTrace:
    """Hash ``requests`` (trace order) into an :class:`AccessTrace`.

    ``config``'s capacity is ignored (every size is swept later); its block size, hash
    algorithm, output simulation and ``max_model_len`` apply as in ``replay sim``.

    Raises:
        SimulationError: from the request factory (a trace without token ids for a vLLM hash).
    """
    cfg = SimConfig(block_size=config.block_size, num_gpu_blocks=None,
                    hash_algo=config.hash_algo, hash_seed=config.hash_seed,
                    simulate_output=config.simulate_output, max_model_len=config.max_model_len)
    factory = _RequestFactory(cfg)
    bs = cfg.block_size
    acc = AccessTrace(block_size=bs)
    intern: dict[Any, int] = {}
    fresh = count(1 << 31)  # decode keys of block-key traces: unique, never looked up
    for tr in requests:
        if factory.reject_reason(tr) is not None:
            acc.rejected += 1
            continue
        req = factory.build(tr)
        p = req.num_prompt_tokens
        out = max(req.max_tokens, 1)
        if out > 1:
            req.append_output_tokens(out)
        num_tokens = p + out - 1
        num_keyed = num_tokens // bs
        keys = req.block_keys
        if num_keyed >= 1 << 20:
            raise SimulationError(f"request {tr.request_id}: {num_keyed} blocks (the capacity "
                                  "sweep handles up to 2^20 per request)")
        # fresh decode keys of block-key traces: never looked up, never interned
        n_int = num_keyed if req.prompt is not None else min(num_keyed, p // bs)
        ids = _intern(intern, keys, n_int)
        ids.extend(islice(fresh, num_keyed - n_int))
        acc.keys.append(ids)
        acc.num_lookup.append(0 if req.skip_reading else (p - 1) // bs)
        acc.num_blocks.append(cdiv(num_tokens, bs))
        acc.prompt_tokens.append(p)
        acc.counted.append(not req.skip_reading)
        req.release_tokens()
    return acc


def _intern(intern: dict[Any, int], keys: list[Any], n: int) -> list[int]:
    """The ids of ``keys[:n]``, a new key getting the next id (``len(intern)``); in C when the
    extension is built (``_native.intern_keys``, the same ids)."""
    if NATIVE is not None and type(keys) is list:
        return NATIVE.intern_keys(intern, keys, n)  # type: ignore[no-any-return]
    ids = []
    for k in islice(keys, n):
        v = intern.get(k)
        if v is None:
            v = intern[k] = len(intern)
        ids.append(v)
    return ids


def compute_next_use(acc: AccessTrace, num_gpu_blocks: int | None = None) -> list[list[int]]:
    """For request r's key j, the next request after r whose lookup keys include it (``_INF``
    if none), skipping requests the cache of ``num_gpu_blocks`` cannot hold (they never run,
    so they use nothing; None: no request skipped). One backward pass."""
    cap = _INF if num_gpu_blocks is None else num_gpu_blocks - 1
    nxt: dict[int, int] = {}
    out: list[list[int]] = [[]] * len(acc)
    for r in range(len(acc) - 1, -1, -1):
        if acc.num_blocks[r] > cap:
            continue
        keys = acc.keys[r]
        get = nxt.get
        out[r] = [get(k, _INF) for k in keys]
        for k in keys[:acc.num_lookup[r]]:
            nxt[k] = r
    return out


def lru_hits(acc: AccessTrace, num_gpu_blocks: int) -> list[int]:
    """Hit tokens per request under vLLM's exact LRU model with ``num_gpu_blocks`` (null block
    included); -1 for a request the cache cannot hold (rejected at this size)."""
    if num_gpu_blocks < 2:
        raise SimulationError("num_gpu_blocks must be >= 2 (block 0 is vLLM's null block)")
    pool = BlockPool(num_gpu_blocks)
    cap = num_gpu_blocks - 1
    bs = acc.block_size
    out = []
    run = pool.run_alone
    for keys, nl, nb in zip(acc.keys, acc.num_lookup, acc.num_blocks):
        if nb > cap:
            out.append(-1)
            continue
        out.append(run(keys, nl, nb, len(keys)) * bs)
    return out


def min_hits(acc: AccessTrace, num_gpu_blocks: int) -> list[int]:
    """Hit tokens per request under Belady's MIN (module docstring) with ``num_gpu_blocks``
    (null block included); -1 for a request the cache cannot hold.

    Runs in C when the extension is built (``replay/_native.c`` ``min_hits``: next use and the
    evictions with arrays indexed by key and a heap of (priority, key) pairs);
    :func:`_min_hits_python` is the reference it is tested against (equal hits,
    tests/test_replay_native.py).
    """
    if num_gpu_blocks < 2:
        raise SimulationError("num_gpu_blocks must be >= 2 (block 0 is vLLM's null block)")
    if NATIVE is not None:
        bs = acc.block_size
        return [h * bs if h >= 0 else -1 for h in
                NATIVE.min_hits(acc.keys, acc.num_lookup, acc.num_blocks, num_gpu_blocks - 1)]
    return _min_hits_python(acc, num_gpu_blocks)


def _min_hits_python(acc: AccessTrace, num_gpu_blocks: int) -> list[int]:
    """:func:`min_hits` in Python: the reference the compiled loop must equal.

    The heap holds one int per entry, ``-((next use << 20 | depth) << 32 | key)``: the smallest
    is the farthest next use, then the deepest block (stale entries are skipped when popped).
    """
    next_use = compute_next_use(acc, num_gpu_blocks)
    cap = num_gpu_blocks - 1
    bs = acc.block_size
    never = len(acc)  # next use "never": later than any request
    resident: dict[int, int] = {}  # key -> its priority (next use << 20 | depth)
    heap: list[int] = []
    push, pop = heapq.heappush, heapq.heappop
    out: list[int] = []
    append = out.append
    for keys, nl, nb, nu in zip(acc.keys, acc.num_lookup, acc.num_blocks, next_use):
        if nb > cap:
            append(-1)
            continue
        h = 0
        while h < nl and keys[h] in resident:
            h += 1
        append(h * bs)
        need = (nb - h) - (cap - len(resident))
        if need > 0:
            pinned = set(keys[:h])
            kept = []
            while need > 0:
                e = pop(heap)
                k = (-e) & 0xFFFFFFFF
                if resident.get(k) != (-e) >> 32:
                    continue  # stale entry
                if k in pinned:
                    kept.append(e)
                    continue
                del resident[k]
                need -= 1
            for e in kept:
                push(heap, e)
        get = resident.get
        for j, k in enumerate(keys):
            n = nu[j]
            prio = ((never if n == _INF else n) << 20) | j
            if get(k) != prio:
                resident[k] = prio
                push(heap, -((prio << 32) | k))
        if len(heap) > 4 * len(resident) + 1024:  # drop stale entries
            heap = [-((v << 32) | k) for k, v in resident.items()]
            heapq.heapify(heap)
    return out


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """One capacity of the sweep (tokens; rates are fractions of counted prompt tokens).

    Attributes:
        num_gpu_blocks: vLLM ``num_gpu_blocks`` (null block included).
        requests: requests counted at this size; ``rejected``: requests it cannot hold.
        prompt_tokens: Σ prompt tokens of counted requests.
        lru_cached_tokens, min_cached_tokens: Σ hit tokens under LRU (vLLM) and Belady's MIN.
    """

    num_gpu_blocks: int
    requests: int
    rejected: int
    prompt_tokens: int
    lru_cached_tokens: int
    min_cached_tokens: int

    @property
    def lru_hit_rate(self) -> float | None:
        return self.lru_cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def min_hit_rate(self) -> float | None:
        return self.min_cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with both hit rates and ``min_minus_lru_tokens``."""
        return {"num_gpu_blocks": self.num_gpu_blocks,
                "requests": self.requests, "rejected": self.rejected,
                "prompt_tokens": self.prompt_tokens, "lru_cached_tokens": self.lru_cached_tokens,
                "min_cached_tokens": self.min_cached_tokens,
                "min_minus_lru_tokens": self.min_cached_tokens - self.lru_cached_tokens,
                "lru_hit_rate": self.lru_hit_rate, "min_hit_rate": self.min_hit_rate}


def capacity_row(acc: AccessTrace, num_gpu_blocks: int) -> CapacityRow:
    """LRU and MIN at one size."""
    lru = lru_hits(acc, num_gpu_blocks)
    mn = min_hits(acc, num_gpu_blocks)
    requests = rejected = prompt = lru_t = min_t = 0
    for lh, mh, p, c in zip(lru, mn, acc.prompt_tokens, acc.counted):
        if lh < 0:
            rejected += 1
            continue
        if not c:
            continue
        requests += 1
        prompt += p
        lru_t += lh
        min_t += mh
    return CapacityRow(num_gpu_blocks, requests, rejected + acc.rejected, prompt, lru_t, min_t)


_SHARED: AccessTrace | None = None  # the access trace forked workers read


def _row_in_worker(num_gpu_blocks: int) -> CapacityRow:
    assert _SHARED is not None
    return capacity_row(_SHARED, num_gpu_blocks)


#: Below this many block accesses (keys x sizes) a sweep runs in this process: forking costs
#: more than it saves (about 0.1-0.3 s to start and join the workers).
PARALLEL_MIN_ACCESSES = 4_000_000


def capacity_sweep(acc: AccessTrace, sizes: Sequence[int], *, jobs: int | None = None
                   ) -> list[CapacityRow]:
    """One :class:`CapacityRow` per size (in the order given), on ``jobs`` processes (default:
    the CPUs, at most the sizes; 1 runs in this process): this process computes sizes
    ``0, jobs, 2 x jobs, ...`` while ``jobs - 1`` forked workers compute the others. Workers
    are forked after hashing, so they read ``acc`` without a copy; where ``fork`` is not
    available, or the sweep is small (under :data:`PARALLEL_MIN_ACCESSES` block accesses in
    all), the sizes run here. The rows are the same either way.

    Raises:
        SimulationError: a size below 2.
    """
    global _SHARED
    bad = [s for s in sizes if s < 2]
    if bad:
        raise SimulationError(f"capacities must be >= 2 blocks (block 0 is vLLM's null block), "
                              f"got {bad}")
    jobs = min(jobs or os.cpu_count() or 1, len(sizes))
    import multiprocessing as mp

    accesses = sum(map(len, acc.keys)) * len(sizes)
    if jobs <= 1 or accesses < PARALLEL_MIN_ACCESSES or "fork" not in mp.get_all_start_methods():
        return [capacity_row(acc, s) for s in sizes]
    _SHARED = acc
    # Frozen, the objects alive now are never traversed by the workers' collector: a full
    # collection in a worker would otherwise read every object of the parent (a replay's
    # token lists: gigabytes) and copy the pages it writes.
    gc.freeze()
    try:
        here = list(range(0, len(sizes), jobs))
        there = [k for k in range(len(sizes)) if k % jobs]
        rows: list[CapacityRow | None] = [None] * len(sizes)
        with mp.get_context("fork").Pool(jobs - 1) as pool:
            pending = pool.map_async(_row_in_worker, [sizes[k] for k in there], chunksize=1)
            for k in here:
                rows[k] = capacity_row(acc, sizes[k])
            for k, row in zip(there, pending.get()):
                rows[k] = row
        return [r for r in rows if r is not None]
    finally:
        gc.unfreeze()
        _SHARED = None
