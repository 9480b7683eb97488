"""The miss ledger: every prompt token of every request in exactly one class.

Classes (``CLASSES``, the order of the tests below; docs/metrics.md "Miss ledger" has the
formulas and the reason for the order, with the 3C model of Hill & Smith (1989) it extends):

``hit``
    served from the instance's cache: ``h x B`` tokens (``h`` hit blocks, ``B`` block size).
``granularity``
    engine granularity, ``P - K x B`` with ``K = floor((P - 1) / B)``: the partial last block and
    the last prompt token, which vLLM always recomputes (``vllm/v1/core/kv_cache_manager.py``
    ``get_computed_blocks``, 0.33.0; the cap is the manager's rule 1 here). No cache serves them.
Each block ``j`` in ``[h, K)`` (``B`` tokens each) is a missed block; the first of them
(``j = h``) is the chain *break*. Its class is the first test that holds:

1. ``routing``: its key is resident on another instance of the fleet at arrival (another routing
   decision alone would have served it, with every cache as it was).
2. ``capacity``: its key was stored in the fleet before (on this or another instance) and is
   resident on none now: it was evicted; more memory would have served it.
3. ``isolation``: its key was never stored, but the same prefix (the chain computed without the
   salt and LoRA adapter) was stored under another ``cache_salt``/adapter: separated by design.
4. ``prompt_change``: the block's tokens (alone, without the parent chain: a position-free content
   index, under the same salt/adapter) occurred in an earlier request, so the content was seen but
   this prompt diverged before it.
5. ``cold``: none of these: the content was never seen anywhere in the fleet (compulsory).

A missed block after the break whose key *is* resident on this instance (reachable only through
the broken chain) takes the break's class: the break is what made it miss.

Observation, not hooks: residency is read from each instance's block map
(``BlockPool.get_cached_block``, the map vLLM's lookup reads) at arrival, before the request runs;
"stored before" is the union of every request's own registrations (``keys[h:num_keyed]``, the
blocks ``BlockPool.run_alone`` / ``cache_full_blocks`` register), so the plain replay path is not
touched and costs nothing extra when no ledger is kept. A key stored before and resident nowhere
was evicted (vLLM emits ``BlockRemoved`` exactly then).

Prompt change is block-aligned: content moved by whole blocks is found, content shifted by a
length that is not a multiple of ``B`` reads as ``cold`` (the exact breaker regions are
``diagnose``'s, issue 26 item 2). Hash-id traces (Mooncake, kv-cache-tester) key blocks by
prefix ids, so a block's content there names its prefix: ``prompt_change`` is 0 and such blocks
are ``cold``. Content keys are 64-bit random linear hashes of a block's tokens (a collision,
probability at most 2^-33 per pair of different blocks, would move one block from ``cold`` to
``prompt_change``).

Memory: one entry per distinct block key ever stored and per distinct block content, i.e.
proportional to the distinct prompt blocks of the trace (what "never seen before" needs).

Speed: the content index and run 1 run in C when the extension is built (``replay/_native.c``
``ContentIndex``, ``stored_run``; :class:`PyContentIndex` and :func:`_stored_run` are the
references, equal by test); the stored-before set takes only the keys not in it already.
"""

from __future__ import annotations

from array import array as _array
from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import filterfalse as _filterfalse
from itertools import islice as _islice
from itertools import takewhile as _takewhile
from dataclasses import asdict, dataclass, fields
from typing import Any

from prefixscope.replay.block_pool import BlockPool
from prefixscope.replay.hashing import BlockHasher
from prefixscope.replay.kv_cache_manager import SimRequest
from prefixscope.replay.native import NATIVE
from prefixscope.replay.types import SimConfig, TraceRequest

#: Token classes in the order they are tested (most specific first); they partition each
#: request's prompt tokens.
CLASSES = ("hit", "granularity", "routing", "capacity", "isolation", "prompt_change", "cold")
#: The classes a missed block can take (the tests 1-5 of the module docstring, in order).
MISS_CLASSES = ("routing", "capacity", "isolation", "prompt_change", "cold")
#: Dimensions :func:`group_totals` can group by (fields of :class:`LedgerRecord`).
GROUP_BY = ("model", "instance", "day", "scope")
_MULTI = object()  # free_index value: stored under two or more identities


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One request's prompt tokens by class (tokens; the seven classes sum to ``prompt_tokens``).

    Attributes:
        request_id: the trace request's id.
        instance: the instance (replica) that served it.
        prompt_tokens: prompt length, tokens.
        hit, granularity, routing, capacity, isolation, prompt_change, cold: tokens per class.
        model: the trace's model name, or None.
        scope: the request's scope: ``attrs["scope"]`` when the trace names one, else ``salted``
            (a ``cache_salt`` or LoRA adapter) or ``none``. Never the salt itself.
        day: trace day, ``floor(arrival_s / 86400)`` (0 = the first 24 h of the trace).
        break_block: index of the first missed block (the chain break), None without missed
            blocks.
        break_class: the break block's class, None without missed blocks.
        capacity_belady: tokens of ``capacity`` that Belady's MIN at the same capacity would
            have served on this instance (``replay.belady``; 0 unless that pass ran).
    """

    request_id: str
    instance: str
    prompt_tokens: int
    hit: int
    granularity: int
    routing: int
    capacity: int
    isolation: int
    prompt_change: int
    cold: int
    model: str | None = None
    scope: str = "none"
    day: int = 0
    break_block: int | None = None
    break_class: str | None = None
    capacity_belady: int = 0

    def counts(self) -> dict[str, int]:
        """``{class: tokens}`` in :data:`CLASSES` order."""
        return {c: getattr(self, c) for c in CLASSES}


@dataclass(slots=True)
class LedgerTotals:
    """Sums of :class:`LedgerRecord` fields over requests (tokens; ``requests`` a count).

    ``missed`` is every prompt token not hit (the six loss classes); ``hit_rate`` is
    ``hit / prompt_tokens`` (a fraction, None when no tokens).
    """

    requests: int = 0
    prompt_tokens: int = 0
    hit: int = 0
    granularity: int = 0
    routing: int = 0
    capacity: int = 0
    isolation: int = 0
    prompt_change: int = 0
    cold: int = 0
    capacity_belady: int = 0

    def add(self, r: LedgerRecord) -> None:
        """Add one request's record."""
        self.requests += 1
        self.prompt_tokens += r.prompt_tokens
        self.hit += r.hit
        self.granularity += r.granularity
        self.routing += r.routing
        self.capacity += r.capacity
        self.isolation += r.isolation
        self.prompt_change += r.prompt_change
        self.cold += r.cold
        self.capacity_belady += r.capacity_belady

    @property
    def missed(self) -> int:
        """Prompt tokens not served from cache (tokens)."""
        return self.prompt_tokens - self.hit

    @property
    def hit_rate(self) -> float | None:
        """``hit / prompt_tokens`` in [0, 1], None when there are no prompt tokens."""
        return self.hit / self.prompt_tokens if self.prompt_tokens else None

    def share_of_missed(self, cls: str) -> float | None:
        """Class ``cls``'s tokens over the missed tokens, in [0, 1]; None when nothing missed."""
        m = self.missed
        return getattr(self, cls) / m if m else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields plus ``missed`` and ``hit_rate``."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["missed"] = self.missed
        d["hit_rate"] = self.hit_rate
        return d


def group_totals(records: Iterable[LedgerRecord],
                 by: Sequence[str] = GROUP_BY) -> dict[tuple[Any, ...], LedgerTotals]:
    """Totals per group: ``{(value of each field in by): LedgerTotals}``, groups in first-seen
    order. ``by`` names fields of :class:`LedgerRecord` among :data:`GROUP_BY` (``()`` gives one
    group, key ``()``).

    Raises:
        ValueError: a name in ``by`` is not one of :data:`GROUP_BY`.
    """
    bad = [b for b in by if b not in GROUP_BY]
    if bad:
        raise ValueError(f"cannot group the ledger by {bad}: choose from {list(GROUP_BY)}")
    out: dict[tuple[Any, ...], LedgerTotals] = {}
    for r in records:
        key = tuple(getattr(r, b) for b in by)
        t = out.get(key)
        if t is None:
            t = out[key] = LedgerTotals()
        t.add(r)
    return out


def scope_of(tr: TraceRequest) -> str:
    """The ledger's scope label of ``tr``: ``attrs["scope"]``, else ``salted`` or ``none``."""
    s = tr.attrs.get("scope") if tr.attrs else None
    if s:
        return str(s)
    return "salted" if (tr.cache_salt or tr.lora_name is not None) else "none"


def _identity(tr: TraceRequest) -> tuple[str | None, str | None, str | None] | None:
    if tr.cache_salt or tr.lora_name is not None:
        return (tr.cache_salt or None, tr.lora_name, tr.lora_path)
    return None


@dataclass(slots=True)
class _Pending:
    """What :meth:`MissLedger.classify` computed for :meth:`MissLedger.stored` to register."""

    instance: int
    identity: Any
    content: bool  # token trace: the blocks' content is indexed
    content_added: bool  # the prompt blocks' content is in the index already (classify)
    free_keys: list[Hashable] | None
    hit_blocks: int
    stored_end: int  # first missed block never stored before (all later ones neither)


class MissLedger:
    """Classifies each request's prompt tokens while a fleet of cache models replays.

    Use: for each request in trace order, :meth:`classify` it against the instance it is routed
    to *before* that instance runs it, run it (``KVCacheManager.run_alone`` or
    ``scheduler.run_steps``), then call :meth:`stored` with the finished request (before
    ``release_tokens``). Sequential replay only: nothing runs between the two calls
    (:meth:`classify` already enters the prompt blocks' content in the content index, so a
    classified request must be stored).

    Args:
        pools: the instances' block pools (``KVCacheManager.block_pool``), index = instance.
        names: instance names, same order (what records carry).
        config: the replay's :class:`SimConfig` (block size, hash algorithm and seed: the
            salt-free chain for ``isolation`` is computed with the same hash).
    """

    def __init__(self, pools: Sequence[BlockPool], names: Sequence[str], config: SimConfig):
        assert len(pools) == len(names) and pools
        self.pools = list(pools)
        self.names = list(names)
        self.block_size = config.block_size
        self.config = config
        self._maps = [p._first for p in self.pools]  # key -> block: the map lookups read
        self.ever: set[Hashable] = set()  # every key stored on some instance so far
        self.free_index: dict[Hashable, Any] = {}  # salt-free key of salted blocks -> identity
        #: content keys of every stored block (token traces): compiled when built
        self.content: ContentIndex = new_content_index()
        self._free_hasher: BlockHasher | None = None
        self._pending: _Pending | None = None

    # -- classification -------------------------------------------------------------------
    def classify(self, instance: int, tr: TraceRequest, req: SimRequest) -> LedgerRecord:
        """The record of ``req`` (not yet run) if it runs on ``instance`` now.

        Args:
            instance: index into ``pools``.
            tr: the trace request (model, salt, attrs, arrival).
            req: its simulator state with the prompt's block keys computed
                (``SimRequest.block_keys``), not yet looked up.

        Returns:
            :class:`LedgerRecord` whose ``hit`` equals the hit tokens the instance's lookup
            will give (vLLM's rule: longest resident prefix of the first ``K`` keys).

        The missed blocks fall in three runs, because "stored before" is prefix-closed (a
        request registers its keys after its hits, all of them chained): blocks stored before
        (resident here behind the break, routing or capacity), then never-stored blocks whose
        salt-free prefix another identity stored (isolation; also prefix-closed), then the rest
        (prompt change or cold, by content), counted in one pass.
        """
        bs = self.block_size
        p = req.num_prompt_tokens
        keys = req.block_keys
        num_lookup = (p - 1) // bs
        mine = self._maps[instance]
        h = 0
        while h < num_lookup and keys[h] in mine:
            h += 1
        identity = _identity(tr)
        content = self._has_content(tr, req)
        free_keys = self._free_keys(tr, req, identity) if identity is not None else None
        counts = dict.fromkeys(MISS_CLASSES, 0)
        ever = self.ever
        first_class: str | None = None  # the break's class when it is in run 1 or 2
        # Run 1: blocks stored before (prefix-closed: a scan to the first key never stored).
        s = h
        if s < num_lookup and keys[s] in ever:
            others = [m for i, m in enumerate(self._maps) if i != instance]
            s, first_routing, here, elsewhere, capacity = _stored_run(
                keys, h, num_lookup, ever, mine, others)
            first_class = "routing" if first_routing else "capacity"
            counts[first_class] += (1 + here) * bs
            counts["routing"] += elsewhere * bs
            counts["capacity"] += capacity * bs
        # Run 2: never stored, the same prefix under another salt or adapter.
        t = s
        fi = self.free_index
        if identity is None:
            if t < num_lookup and keys[t] in fi:
                t += _run_length(fi, keys, t, num_lookup)
        else:
            assert free_keys is not None
            while t < num_lookup:
                fk = free_keys[t]
                owner = fi.get(fk)
                if not (fk in ever or (owner is not None and owner != identity)):
                    break
                t += 1
        if t > s:
            counts["isolation"] += (t - s) * bs
            if first_class is None:
                first_class = "isolation"
        # Run 3: content seen before (prompt change) or not (cold).
        # The prompt blocks' content enters the index in the same pass (what stored() would
        # add; a block counts only when an earlier request entered its content).
        n_rest = num_lookup - t
        n_pc, first_rest = 0, "cold"
        if content:
            n_pc, first_in = self.content.count_add(_tokens(req.prompt), h, p // bs, t,
                                                    num_lookup, bs, _coef_bytes(bs),
                                                    _salt(identity))
            first_rest = "prompt_change" if first_in else "cold"
        if n_rest:
            counts["prompt_change"] += n_pc * bs
            counts["cold"] += (n_rest - n_pc) * bs
        break_class = None
        if h < num_lookup:
            break_class = first_class if first_class is not None else first_rest
        self._pending = _Pending(instance, identity, content, content, free_keys, h, s)
        return LedgerRecord(
            request_id=tr.request_id, instance=self.names[instance], prompt_tokens=p,
            hit=h * bs, granularity=p - num_lookup * bs, model=tr.model, scope=scope_of(tr),
            day=int(tr.arrival_s // 86400),
            break_block=h if h < num_lookup else None, break_class=break_class, **counts)

    @staticmethod
    def _has_content(tr: TraceRequest, req: SimRequest) -> bool:
        """Whether the request's blocks have content keys (token traces; not hash-id traces):
        a random linear hash of each block's tokens modulo 2^64 plus the identity's hash (two
        different blocks collide with probability at most 2^-33), :func:`_block_hashes`."""
        return tr.block_keys is None and req.prompt is not None

    def _free_keys(self, tr: TraceRequest, req: SimRequest, identity: Any) -> list[Hashable]:
        """The request's prompt block keys without salt and adapter (the ``isolation`` chain)."""
        if tr.block_keys is not None and self.config.hash_algo == "fast":
            return list(tr.block_keys)
        h = self._free_hasher
        if h is None:
            c = self.config
            h = self._free_hasher = BlockHasher(algo=c.hash_algo, block_size=c.block_size,
                                                seed=c.hash_seed)
        out: list[Hashable] = []
        ids = tr.prompt_token_ids
        assert ids is not None
        h.extend(out, ids if type(ids) is list else list(ids))
        return out

    # -- registration -----------------------------------------------------------------------
    def stored(self, req: SimRequest) -> None:
        """Register what the request just classified and run stored: its new block keys (on its
        instance), the salt-free keys of its salted prompt blocks, and its blocks' content.

        ``req`` has run (``num_computed_tokens`` = prompt + fed-back output tokens) and still
        holds its keys (call before ``release_tokens``).
        """
        pend = self._pending
        assert pend is not None, "stored() without classify()"
        self._pending = None
        self.register(pend.instance, req, pend.hit_blocks, pend)

    def stored_unclassified(self, instance: int, tr: TraceRequest, req: SimRequest,
                            hit_tokens: int) -> None:
        """Register a request that ran without a record (a skip-read request: it writes blocks
        but is not counted, as in vLLM's counters)."""
        identity = _identity(tr)
        h = hit_tokens // self.block_size
        pend = _Pending(instance, identity, self._has_content(tr, req), False,
                        self._free_keys(tr, req, identity) if identity is not None else None, h,
                        h)
        self.register(instance, req, h, pend)

    def register(self, instance: int, req: SimRequest, h: int, pend: _Pending) -> None:
        """Add the request's registrations ``keys[h:num_keyed]`` to the fleet's history."""
        bs = self.block_size
        p = req.num_prompt_tokens
        num_full = p // bs
        num_keyed = req.num_computed_tokens // bs
        if req.prompt is None:  # block-key mode: decode keys are fresh objects, never read
            num_keyed = min(num_keyed, num_full)
        # keys[h:stored_end] were stored before (classify's run 1): already in the set.
        self.ever.update(req.block_keys[max(h, pend.stored_end):num_keyed])
        if pend.free_keys is not None:
            fi = self.free_index
            for fk in pend.free_keys[h:num_full]:
                owner = fi.get(fk)
                if owner is None:
                    fi[fk] = pend.identity
                elif owner is not _MULTI and owner != pend.identity:
                    fi[fk] = _MULTI
        if pend.content:
            salt = _salt(pend.identity)
            coef = _coef_bytes(bs)
            if not pend.content_added:
                self.content.add(_tokens(req.prompt), h, num_full, bs, coef, salt)
            if req.output_token_ids is not None and num_keyed > num_full:
                # Decode blocks of a known reply: a later prompt may re-send it.
                toks = [*req.prompt[num_full * bs:], *req.outputs]
                self.content.add(toks, 0, num_keyed - num_full, bs, coef, salt)


def _stored_run(keys: Sequence[Hashable], start: int, stop: int, ever: set[Hashable],
                mine: dict, others: list[dict]) -> tuple[int, bool, int, int, int]:
    """Run 1 of :meth:`MissLedger.classify` from ``start`` (whose key is in ``ever``): ``(end,
    the break is routing, here, elsewhere, capacity)``: ``end`` the first index below ``stop``
    whose key is not in ``ever``; whether another instance holds the first key; of the later
    keys of the run, how many this instance holds (they take the break's class), else another
    one (routing), else none (capacity). In C when the extension is built
    (``_native.stored_run``, the same counts)."""
    if NATIVE is not None and type(keys) is list and type(ever) is set:
        return NATIVE.stored_run(keys, start, stop, ever, mine, others)  # type: ignore[no-any-return]
    end = start + _run_length(ever, keys, start, stop)
    key = keys[start]
    first_routing = any(key in m for m in others)
    # After the break: each a filter pass over the run.
    rest = keys[start + 1:end]
    here = len(rest)
    rest = list(_filterfalse(mine.__contains__, rest))
    here -= len(rest)
    elsewhere = len(rest)
    for m in others:
        if not rest:
            break
        rest = list(_filterfalse(m.__contains__, rest))
    elsewhere -= len(rest)
    return end, first_routing, here, elsewhere, len(rest)


def _run_length(held: Any, keys: Sequence[Hashable], start: int, stop: int) -> int:
    """How many of ``keys[start:stop]`` from the first are in ``held`` (up to the first not)."""
    return len(list(_takewhile(held.__contains__, _islice(keys, start, stop))))


_COEF: Any = None  # odd 64-bit multipliers per token position (a fixed seed: reproducible)
_COEF_BYTES: dict[int, bytes] = {}  # block size -> its multipliers as native uint64 bytes
_MASK64 = (1 << 64) - 1


def _salt(identity: Any) -> int:
    """The content keys' per-identity offset (``hash(identity)`` mod 2^64)."""
    return hash(identity) & _MASK64


def _tokens(ids: Sequence[int]) -> Sequence[int]:
    """``ids`` as a list or tuple (what the compiled index reads)."""
    return ids if type(ids) is list or type(ids) is tuple else list(ids)


def _coef_bytes(block_size: int) -> bytes:
    """The first ``block_size`` multipliers of :func:`_block_hashes`, native uint64 bytes."""
    b = _COEF_BYTES.get(block_size)
    if b is None:
        _coefficients(block_size)
        b = _COEF_BYTES[block_size] = _COEF[:block_size].tobytes()
    return b


def _coefficients(block_size: int) -> Any:
    global _COEF
    import numpy as np

    if _COEF is None or len(_COEF) < block_size:
        rng = np.random.default_rng(0x5EED)
        _COEF = rng.integers(0, 2**63, size=max(block_size, 64), dtype=np.uint64) * 2 + 1
    return _COEF


def _block_hashes(ids: Sequence[int], start: int, stop: int, block_size: int,
                  salt: int) -> list[int]:
    """``sum(ids[j*B + i] * R_i) + salt mod 2^64`` for blocks ``start .. stop-1`` (ints)."""
    import numpy as np

    coef = _coefficients(block_size)
    part = ids[start * block_size:stop * block_size]
    try:  # array('q') reads a list of ints several times faster than numpy does
        arr = np.frombuffer(_array("q", part), dtype=np.uint64)
    except (TypeError, OverflowError):
        arr = np.asarray(part, dtype=np.int64).view(np.uint64)
    arr = arr.reshape(stop - start, block_size)
    with np.errstate(over="ignore"):
        h = (arr * coef[:block_size]).sum(axis=1, dtype=np.uint64) + np.uint64(salt & (2**64 - 1))
    return h.tolist()


class PyContentIndex:
    """The content index in Python: the keys of :func:`_block_hashes` in a set of ints. The
    reference the compiled ``ContentIndex`` (``replay/_native.c``) must equal; both take
    ``(tokens, start, stop, block_size, coef, salt)`` for blocks ``start .. stop-1``."""

    def __init__(self) -> None:
        self.keys: set[int] = set()

    def count(self, ids: Sequence[int], start: int, stop: int, block_size: int, coef: bytes,
              salt: int) -> tuple[int, bool]:
        """``(how many of the blocks' keys are held, whether the first one is)``."""
        if start >= stop:
            return 0, False
        keys = _block_hashes(ids, start, stop, block_size, salt)
        held = self.keys.__contains__
        return sum(map(held, keys)), held(keys[0])

    def add(self, ids: Sequence[int], start: int, stop: int, block_size: int, coef: bytes,
            salt: int) -> None:
        """Hold the blocks' keys."""
        if start < stop:
            self.keys.update(_block_hashes(ids, start, stop, block_size, salt))

    def count_add(self, ids: Sequence[int], start: int, stop: int, count_from: int,
                  count_to: int, block_size: int, coef: bytes, salt: int) -> tuple[int, bool]:
        """:meth:`count` of blocks ``count_from .. count_to-1``, then :meth:`add` of blocks
        ``start .. stop-1`` (the compiled index does both in one pass)."""
        out = self.count(ids, count_from, count_to, block_size, coef, salt)
        self.add(ids, start, stop, block_size, coef, salt)
        return out

    def __len__(self) -> int:
        return len(self.keys)


ContentIndex = PyContentIndex  # the interface (the compiled class has the same methods)


def new_content_index() -> ContentIndex:
    """An empty content index: the compiled one when the extension is built, else Python's."""
    if NATIVE is not None:
        return NATIVE.ContentIndex()  # type: ignore[no-any-return]
    return PyContentIndex()


def check_record(r: LedgerRecord) -> None:
    """Assert the ledger's invariant on one record: the classes sum to the prompt tokens and
    none is negative (a bug otherwise)."""
    counts = r.counts()
    assert all(v >= 0 for v in counts.values()), (r.request_id, counts)
    assert sum(counts.values()) == r.prompt_tokens, (r.request_id, counts, r.prompt_tokens)


def records_as_dicts(records: Iterable[LedgerRecord]) -> list[dict[str, Any]]:
    """JSON-ready records (field names as in :class:`LedgerRecord`)."""
    return [asdict(r) for r in records]


def totals_as_rows(groups: Mapping[tuple[Any, ...], LedgerTotals],
                   by: Sequence[str]) -> list[dict[str, Any]]:
    """``group_totals`` output as rows: the group fields then :meth:`LedgerTotals.as_dict`."""
    return [{**dict(zip(by, k)), **t.as_dict()} for k, t in groups.items()]


__all__ = ["CLASSES", "GROUP_BY", "LedgerRecord", "LedgerTotals", "MISS_CLASSES", "MissLedger",
           "check_record", "group_totals", "records_as_dicts", "scope_of", "totals_as_rows"]
