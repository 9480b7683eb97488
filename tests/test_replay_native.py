"""The compiled replay loops (``replay/_native.c``) compute exactly what the Python code does.

1. ``sha256_pickle_chain`` appends ``sha256(pickle.dumps((parent, tuple(block), None), 5))``,
   chained, for every int range pickle writes as BININT1/BININT2/BININT/LONG1 (int64), block
   sizes 1-64 and 512, from any start; it declines (-1, nothing appended) what it cannot write:
   bools, floats, ints past int64, blocks over 8,192 tokens, pickles of several frames.
2. ``BlockPool.run_alone`` through the extension leaves the whole pool (free-queue order, keys,
   map, duplicate lists, counters) as the Python reference ``_run_alone_python`` does, over
   random call sequences with heavy key duplication (hypothesis).
3. A replay of the bundled Mooncake slice gives the same hits and the same final pool with and
   without the extension.

``make test`` builds the extension (Debian's libssl-dev is installed first); under ``CI=true`` a
missing build is a failure (the skip below fails the run, tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import subprocess
import sys
from importlib import import_module

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.replay import block_pool, hashing
from prefixscope.replay.block_pool import BlockPool
from prefixscope.replay.hashing import BlockHasher, none_hash, pickle_block_layout
from prefixscope.replay.native import native_status
from prefixscope.replay.sim import simulate
from prefixscope.replay.types import SimConfig
from tests.replay_core_support import check_pool_invariants, mooncake_path, mooncake_requests

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def native():
    try:
        return import_module("prefixscope.replay._native")
    except ImportError as e:  # a failure under CI=true (tests/conftest.py)
        pytest.skip(f"the compiled replay loops are not built ({e}): run `make venv` with a C "
                    f"compiler and Debian's libssl-dev (make system-deps)")


def reference_chain(parent: bytes, tokens: list, bs: int) -> list[bytes]:
    out = []
    for i in range(0, len(tokens) - len(tokens) % bs, bs):
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i:i + bs]), None),
                                             protocol=5)).digest()
        out.append(parent)
    return out


INT64_EDGES = [0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32,
               -(2**32), 2**39, -(2**39), -(2**39) - 1, -(2**47), 2**55 - 1, -(2**55),
               2**63 - 1, -(2**63), -(1 << 62), -1, -128, -129]
tokens64 = st.one_of(st.sampled_from(INT64_EDGES), st.integers(0, 255), st.integers(256, 65535),
                     st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1))


@SETTINGS
@given(bs=st.one_of(st.integers(1, 64), st.just(512)), data=st.data(),
       parent=st.binary(min_size=32, max_size=32))
def test_chain_equals_pickle_and_hashlib(native, bs, data, parent):
    nb = data.draw(st.integers(0, 5 if bs < 512 else 2))
    start = data.draw(st.integers(0, 3))
    tokens = data.draw(st.lists(tokens64, min_size=start + nb * bs, max_size=start + nb * bs + 3))
    container = data.draw(st.sampled_from([list, tuple]))
    keys: list = [b"earlier"]
    n = native.sha256_pickle_chain(keys, container(tokens), start, nb, bs, parent,
                                   *pickle_block_layout(bs))
    assert n == nb
    assert keys == [b"earlier", *reference_chain(parent, tokens[start:start + nb * bs], bs)]


@pytest.mark.parametrize("bad", [True, False, 1.0, 2**63, -(2**63) - 1, 2**70, "7", None])
def test_chain_declines_what_it_cannot_write(native, bad):
    tokens = [5] * 20 + [bad] + [6] * 11
    keys: list = []
    assert native.sha256_pickle_chain(keys, tokens, 0, 2, 16, b"p" * 32,
                                      *pickle_block_layout(16)) == -1
    assert keys == []  # nothing appended: the caller hashes through pickle.dumps
    h = BlockHasher(block_size=16)  # ... which gives the definition's digests
    got: list = []
    h.extend(got, tokens)
    assert got == reference_chain(none_hash(), tokens, 16)


def test_chain_declines_pickles_of_several_frames_and_huge_blocks(native):
    # 7,000 placeholder ids of 10 bytes each: pickle splits the block into 64 KiB frames.
    tokens = [-(1 << 62)] * 7000
    keys: list = []
    assert native.sha256_pickle_chain(keys, tokens, 0, 1, 7000, b"p" * 32,
                                      *pickle_block_layout(7000)) == -1
    assert keys == []
    got: list = []
    BlockHasher(block_size=7000).extend(got, tokens)
    assert got == reference_chain(none_hash(), tokens, 7000)
    big = list(range(8193))
    assert native.sha256_pickle_chain(keys, big, 0, 1, 8193, b"p" * 32, b"", b"") == -1


def test_chain_checks_its_arguments(native):
    layout = pickle_block_layout(4)
    with pytest.raises(IndexError):
        native.sha256_pickle_chain([], [1, 2, 3], 0, 1, 4, b"p" * 32, *layout)
    with pytest.raises(TypeError):
        native.sha256_pickle_chain([], iter([1, 2, 3, 4]), 0, 1, 4, b"p" * 32, *layout)
    with pytest.raises(ValueError):
        native.sha256_pickle_chain([], [1, 2, 3, 4], 0, 1, 0, b"p" * 32, *layout)
    with pytest.raises(IndexError):  # num_blocks * block_size would overflow
        native.sha256_pickle_chain([], [1] * 10, 0, 2**62, 16, b"p" * 32, *layout)


def test_run_alone_refuses_a_pool_in_use_instead_of_writing_past_its_lists(native):
    # BlockPool.run_alone asserts an idle pool; under python -O those asserts are gone, and the
    # C loop itself stops at the queue's end with an exception.
    p = BlockPool(10)
    p.get_new_blocks(5)
    q = p.free_queue
    with pytest.raises(RuntimeError, match="free queue ran out"):
        native.run_alone(q._next, q._prev, p.block_hash, p._first, p._dups, q._ids,
                         list(range(9)), 0, 9, 9, p._drop_duplicate)
    with pytest.raises(ValueError, match="sizes out of range"):
        native.run_alone(q._next, q._prev, p.block_hash, p._first, p._dups, q._ids,
                         [1, 2], 0, 3, 3, p._drop_duplicate)
    p2 = BlockPool(10)
    p2._first[7] = 99  # a corrupt map names a block past the pool
    q2 = p2.free_queue
    with pytest.raises(RuntimeError, match="names block 99"):
        native.run_alone(q2._next, q2._prev, p2.block_hash, p2._first, p2._dups, q2._ids,
                         [7], 1, 1, 1, p2._drop_duplicate)


@SETTINGS
@given(bs=st.sampled_from([1, 2, 3, 4, 16]), salt=st.sampled_from([None, "s"]),
       tokens=st.lists(tokens64, max_size=120), cut=st.integers(0, 120))
def test_block_hasher_with_and_without_the_extension(native, monkeypatch_session, bs, salt,
                                                     tokens, cut):
    on = BlockHasher(block_size=bs, cache_salt=salt, seed="5")
    with monkeypatch_session.context() as m:
        m.setattr(hashing, "NATIVE", None)
        off = BlockHasher(block_size=bs, cache_salt=salt, seed="5")
    assert on._native and not off._native
    a: list = []
    b: list = []
    on.extend(a, tokens)
    off.extend(b, tokens)
    assert a == b
    cut = min(cut, len(tokens)) // bs * bs  # decode: a window after the keyed blocks
    a2: list = []
    on.extend(a2, tokens[:cut])
    on.extend(a2, tokens[cut:], offset=cut)
    assert a2 == a


@pytest.fixture(scope="module")
def monkeypatch_session():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def pool_state(p: BlockPool):
    return (list(p.free_queue), list(p.block_hash), dict(p._first),
            {k: list(v) for k, v in p._dups.items()}, p.num_evicted_blocks,
            p.num_cached_blocks_total, p.free_queue.num_free_blocks)


@SETTINGS
@given(capacity=st.integers(2, 30), seed=st.integers(0, 2**32 - 1),
       alphabet=st.integers(1, 4), calls=st.integers(1, 40),
       kind=st.sampled_from(["int", "bytes", "tuple"]))
def test_run_alone_equals_the_python_reference(native, capacity, seed, alphabet, calls, kind):
    # Keys are chained, as block hashes are: key j names tokens 0..j, so a request's keys are
    # distinct and requests share prefixes. A small token alphabet makes prefixes recur;
    # eviction of a parent before its child, the unlooked-up last block and skip-read requests
    # make duplicates (several blocks carrying one key), which are then evicted and come back.
    rnd = random.Random(seed)
    a, b = BlockPool(capacity), BlockPool(capacity)
    interned: dict = {}
    make = {"int": lambda t: interned.setdefault(t, len(interned)),
            "bytes": lambda t: hashlib.sha256(repr(t).encode()).digest(),
            "tuple": lambda t: (("cache_salt", "s"), t)}[kind]
    for i in range(calls):
        if rnd.random() < 0.05:
            assert a.reset_prefix_cache() and b.reset_prefix_cache()
        num_blocks = rnd.randint(1, capacity - 1)
        num_keyed = rnd.randint(0, num_blocks)
        num_lookup = 0 if rnd.random() < 0.15 else rnd.randint(max(0, num_keyed - 1), num_keyed)
        tokens = tuple(rnd.randrange(alphabet) for _ in range(num_keyed + rnd.randint(0, 3)))
        keys = [make(tokens[:j + 1]) for j in range(len(tokens))]
        got = a.run_alone(list(keys), num_lookup, num_blocks, num_keyed)
        want = b._run_alone_python(list(keys), num_lookup, num_blocks, num_keyed)
        assert got == want, i
        assert pool_state(a) == pool_state(b), i
        check_pool_invariants(a)


@SETTINGS
@given(capacity=st.integers(2, 12), seed=st.integers(0, 2**32 - 1), calls=st.integers(1, 60))
def test_keys_that_repeat_within_a_request_fail_alike_and_leave_the_pool(native, capacity, seed,
                                                                         calls):
    # Keys that do not name their whole prefix can repeat inside a request; a key repeated among
    # the hits would make one block leave the free queue twice. Both paths refuse it with the
    # same ValueError and leave the pool exactly as it was; every other call agrees.
    rnd = random.Random(seed)
    a, b = BlockPool(capacity), BlockPool(capacity)
    refused = 0
    for i in range(calls):
        num_blocks = rnd.randint(1, capacity - 1)
        num_keyed = rnd.randint(0, num_blocks)
        num_lookup = rnd.randint(0, num_keyed)
        keys = [rnd.randrange(4) for _ in range(num_keyed)]
        outcome = []
        for run in (a.run_alone, b._run_alone_python):
            try:
                outcome.append(run(list(keys), num_lookup, num_blocks, num_keyed))
            except ValueError as e:
                outcome.append(str(e))
        assert outcome[0] == outcome[1], i
        refused += isinstance(outcome[0], str)
        assert pool_state(a) == pool_state(b), i
        check_pool_invariants(a)


class HostileKey:
    """A key whose hash empties the list of keys it was put in (a caller's own objects)."""

    def __init__(self, keys: list, v: int) -> None:
        self.keys, self.v = keys, v

    def __hash__(self) -> int:
        self.keys.clear()
        return hash(self.v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostileKey) and other.v == self.v


def test_a_key_that_changes_the_call_cannot_crash_it(native):
    # The C loop works on its own copy of the keys (the Python path reads the emptied list, so
    # the two register different keys: no contract for such objects) and re-checks the pool's
    # lists after any Python code a key may run: a valid pool or an exception, never a crash.
    p = BlockPool(10)
    keys: list = []
    keys += [HostileKey(keys, i) for i in range(5)]
    assert p.run_alone(keys, 5, 5, 5) == 0
    check_pool_invariants(p)
    assert len(p._first) == 5

    class Shrinker(HostileKey):
        def __hash__(self) -> int:  # a key that empties the pool's own lists
            pool.free_queue._next.clear()
            return hash(self.v)

    pool = BlockPool(10)
    with pytest.raises(RuntimeError, match="lists changed"):
        pool.run_alone([Shrinker([], i) for i in range(3)], 3, 3, 3)


def test_sizes_out_of_range_fail_alike(native):
    for use_native in (True, False):
        p = BlockPool(10)
        run = p.run_alone if use_native else p._run_alone_python
        if not use_native:  # the reference has no checks of its own: the public method does
            with pytest.MonkeyPatch().context() as m:
                m.setattr(block_pool, "NATIVE", None)
                with pytest.raises(ValueError, match="sizes out of range"):
                    p.run_alone([1, 2], 0, 3, 3)  # fewer keys than keyed blocks
                with pytest.raises(ValueError, match="sizes out of range"):
                    p.run_alone([1, 2, 3], 3, 3, 2)
        else:
            with pytest.raises(ValueError, match="sizes out of range"):
                run([1, 2], 0, 3, 3)
        assert p.num_cached_blocks_total == 0 and len(list(p.free_queue)) == 9


def test_run_alone_meets_duplicates():
    # The generator above does reach the duplicate paths (BlockPool._drop_duplicate).
    p = BlockPool(10)  # 9 usable blocks
    p.run_alone([1, 2, 3], 0, 3, 3)
    p.run_alone([1, 2, 3], 0, 3, 3)  # skip-read: every key a second time
    assert {k: len(v) for k, v in p._dups.items()} == {1: 1, 2: 1, 3: 1}
    # The queue is now 3 free blocks, the first copies of 3, 2, 1, then the second copies:
    # five new blocks evict the first copies of 3 and 2 (their duplicates take over).
    p.run_alone([7, 8, 9, 10, 11], 0, 5, 5)
    check_pool_invariants(p)
    assert {k: len(v) for k, v in p._dups.items()} == {1: 1}
    assert p.run_alone([1, 2, 3, 4], 4, 4, 4) == 3  # the survivors still hit


def test_run_alone_writes_the_shared_id_objects(native):
    # The lists keep one int object per block id (memory touched at large capacities).
    p = BlockPool(50)
    for i in range(20):
        p.run_alone([1000 + i % 7, i, 500 + i, 2000 + i * 3], 2, 6, 4)
    ids = p.free_queue._ids
    for lst in (p.free_queue._next, p.free_queue._prev):
        for v in lst:
            assert v < 0 or v is ids[v]
    assert all(b is ids[b] for b in p._first.values())


def test_a_mooncake_replay_is_the_same_with_and_without_the_extension(native, monkeypatch):
    reqs = list(mooncake_requests(mooncake_path(), 0, 150, block_size=16, mode="tokens"))
    results = {}
    for on in (True, False):
        with monkeypatch.context() as m:
            if not on:
                m.setattr(block_pool, "NATIVE", None)
                m.setattr(hashing, "NATIVE", None)
            run = simulate(reqs, SimConfig(block_size=16, num_gpu_blocks=3000), read_ahead=True)
            hits = [r.cached_tokens for r in run]
            pool = run.manager.block_pool
            results[on] = (hits, pool_state(pool))
    assert sum(results[True][0]) > 0
    assert results[True] == results[False]


def test_native_status_and_the_switch():
    code = "from prefixscope.replay.native import native_status; print(native_status())"
    env = {**os.environ, "PREFIXSCOPE_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "python"
    assert native_status() in ("native", "python")


@pytest.mark.parametrize("bad", [True, 1.0, "5"])
def test_block_hashes_refuses_token_ids_that_are_not_ints(bad):
    # vLLM's prompt_token_ids are Python ints; a bool or a numpy integer pickles otherwise, and
    # gave digests that depended on how many blocks followed (new user, session 9).
    from prefixscope.core.errors import SimulationError
    from prefixscope.replay.hashing import block_hashes

    with pytest.raises(SimulationError, match="token id at index 3 is a builtins"):
        block_hashes([1, 2, 3, bad] + [4] * 60, block_size=16)


def test_block_hashes_refuses_numpy_ids():
    import numpy as np

    from prefixscope.core.errors import SimulationError
    from prefixscope.replay.hashing import block_hashes

    with pytest.raises(SimulationError, match=r"index 0 is a numpy\.int64.*tolist"):
        block_hashes(np.arange(64, dtype=np.int64), block_size=16)
    assert block_hashes(np.arange(64).tolist(), block_size=16) == block_hashes(
        list(range(64)), block_size=16)


@SETTINGS
@given(s=st.sampled_from([1, 3, 16, 64, 512]), data=st.data(),
       vocab=st.sampled_from([None, 6, 32000, 151936]), serial=st.integers(0, 2**20))
def test_expanded_tokens_in_bulk_equal_token_by_token(s, data, vocab, serial):
    # The hash-id readers' lazy tokens, computed with numpy for the hasher (a Mooncake replay
    # spent 8 of its 9 s in the per-token path): the same ints as the per-token definition.
    from prefixscope.replay.trace_hashids import ALIAS_BASE, ExpandedTokens

    ids = st.one_of(st.integers(0, 99), st.integers(0, 2**40), st.integers(ALIAS_BASE,
                                                                              ALIAS_BASE + 999))
    canon = data.draw(st.lists(ids, max_size=5))
    n = data.draw(st.integers(0, len(canon) * s + 3 * s + 2))
    e = ExpandedTokens(canon, s, n, serial=serial, vocab_size=vocab)
    ref = [e._token(p) for p in range(n)]
    assert list(e) == ref and e.as_token_list() == ref
    a, b = data.draw(st.integers(0, n + 2)), data.draw(st.integers(0, n + 2))
    assert e[a:b] == ref[a:b] and e.as_token_list(a, b) == ref[a:b]
    if n >= s:  # and the hasher reads it as it reads the list
        k1: list = []
        k2: list = []
        BlockHasher(block_size=s).extend(k1, e)
        BlockHasher(block_size=s).extend(k2, ref)
        assert k1 == k2


# -- the miss ledger's content index and Belady's MIN (replay/ledger.py, replay/belady.py) ------

_I64 = st.integers(-2**63, 2**63 - 1)


@SETTINGS
@given(bs=st.sampled_from([1, 2, 4, 16]), data=st.data(),
       ops=st.lists(st.tuples(st.sampled_from(["add", "count", "count_add"]),
                              st.integers(0, 6), st.integers(0, 6), st.integers(0, 3)),
                    min_size=1, max_size=40))
def test_content_index_equals_the_python_reference(native, bs, data, ops):
    """count/add over blocks of token lists drawn from a small alphabet (repeated content),
    int64 extremes included, under a few salts (one chosen to make a key 0, the empty slot's
    value): the same counts as the set of ints of ``_block_hashes``, and the same size."""
    from prefixscope.replay.ledger import PyContentIndex, _block_hashes, _coef_bytes

    alphabet = data.draw(st.lists(_I64, min_size=1, max_size=4))
    toks = data.draw(st.lists(st.sampled_from(alphabet), min_size=6 * bs, max_size=6 * bs))
    zero_salt = (-_block_hashes(toks, 0, 1, bs, 0)[0]) & (2**64 - 1)
    salts = [0, 1, 2**64 - 1, zero_salt]
    coef = _coef_bytes(bs)
    c, py = native.ContentIndex(), PyContentIndex()
    for op, a, b, si in ops:
        a, b = min(a, b), max(a, b)
        args = (toks, a, b, bs, coef, salts[si])
        if op == "add":
            assert c.add(*args) is py.add(*args) is None
        elif op == "count":
            assert c.count(*args) == py.count(*args)
        else:  # count a sub-range, add the whole range (repeated content within the call)
            lo = data.draw(st.integers(a, b))
            hi = data.draw(st.integers(lo, b))
            cargs = (toks, a, b, lo, hi, bs, coef, salts[si])
            assert c.count_add(*cargs) == py.count_add(*cargs)
        assert len(c) == len(py)


def test_content_index_grows_and_refuses_what_it_cannot_read(native):
    from prefixscope.replay.ledger import _coef_bytes

    c = native.ContentIndex()
    toks = list(range(40_000))
    c.add(toks, 0, 40_000 // 4, 4, _coef_bytes(4), 7)
    assert len(c) == 10_000 and c.count(toks, 0, 10_000, 4, _coef_bytes(4), 7) == (10_000, True)
    assert c.count(toks, 0, 10_000, 4, _coef_bytes(4), 8)[0] < 10
    with pytest.raises(IndexError):
        c.count(toks, 0, 10_001, 4, _coef_bytes(4), 7)
    with pytest.raises(OverflowError):
        c.add([2**63] * 4, 0, 1, 4, _coef_bytes(4), 0)
    with pytest.raises(TypeError):
        c.add(["a"] * 4, 0, 1, 4, _coef_bytes(4), 0)
    with pytest.raises(ValueError):
        c.add(toks, 0, 1, 8, _coef_bytes(4), 0)  # fewer multipliers than tokens a block
    with pytest.raises(ValueError):
        c.count_add(toks, 2, 4, 1, 3, 4, _coef_bytes(4), 0)  # counted blocks outside the added


_SEGS = [list(range(k * 10, k * 10 + n)) for k, n in enumerate([4, 4, 6, 8, 3, 5, 12])]


@st.composite
def _fleet_traces(draw):
    from prefixscope.replay.types import TraceRequest

    out = []
    for k in range(draw(st.integers(1, 24))):
        segs = draw(st.lists(st.integers(0, len(_SEGS) - 1), min_size=1, max_size=5))
        ids = [t for s in segs for t in _SEGS[s]]
        known = draw(st.booleans())
        n_out = draw(st.integers(0, 9))
        out.append(TraceRequest(
            request_id=f"r{k}", arrival_s=float(k), num_prompt_tokens=len(ids),
            prompt_token_ids=ids, output_tokens=n_out,
            output_token_ids=[_SEGS[k % 7][0]] * n_out if known and n_out else None,
            cache_salt=draw(st.sampled_from([None, None, "s"])),
            skip_reading=draw(st.booleans()) and k % 6 == 5))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=_fleet_traces(), instances=st.integers(1, 3), cap=st.sampled_from([None, 6, 12]),
       router=st.sampled_from(["round-robin", "longest-prefix", "random"]))
def test_the_ledger_is_the_same_with_and_without_the_extension(native, trace, instances, cap,
                                                                router):
    from prefixscope.replay import ledger
    from prefixscope.replay.fleet import replay_fleet

    cfg = SimConfig(block_size=4, num_gpu_blocks=cap, hash_algo="sha256")
    out = {}
    for on in (True, False):
        saved = ledger.NATIVE
        ledger.NATIVE = ledger.NATIVE if on else None
        try:
            run = replay_fleet(trace, cfg, instances=instances, router=router)
            out[on] = (list(run), run.result.ledger.as_dict())
            assert isinstance(run.ledger.content, ledger.PyContentIndex) is (not on)
        finally:
            ledger.NATIVE = saved
    assert out[True] == out[False]


def test_the_ledger_on_a_mooncake_fleet_is_the_same_with_and_without_the_extension(native):
    from prefixscope.replay import ledger
    from prefixscope.replay.fleet import replay_fleet

    reqs = list(mooncake_requests(mooncake_path(), 0, 150, block_size=16, mode="tokens"))
    cfg = SimConfig(block_size=16, num_gpu_blocks=3000)
    out = {}
    for on in (True, False):
        saved = ledger.NATIVE
        ledger.NATIVE = ledger.NATIVE if on else None
        try:
            out[on] = run = replay_fleet(reqs, cfg, instances=3, router="round-robin").run()
        finally:
            ledger.NATIVE = saved
    led = out[True].ledger
    assert led.routing and led.capacity and led.cold
    assert out[True].ledger == out[False].ledger and run.ledger == led


@st.composite
def _accesses(draw):
    from prefixscope.replay.belady import AccessTrace

    acc = AccessTrace(block_size=1)
    fresh = 1 << 31
    for _ in range(draw(st.integers(0, 30))):
        keys = draw(st.lists(st.integers(0, 12), min_size=0, max_size=8, unique=True))
        n_fresh = draw(st.integers(0, 3))
        nl = draw(st.integers(0, len(keys)))
        keys = keys + list(range(fresh, fresh + n_fresh))
        fresh += n_fresh
        acc.keys.append(keys)
        acc.num_lookup.append(nl)
        acc.num_blocks.append(len(keys) + draw(st.integers(0, 2)))
        acc.prompt_tokens.append(len(keys) + 1)
        acc.counted.append(True)
    return acc


@SETTINGS
@given(acc=_accesses(), size=st.integers(2, 16))
def test_min_hits_equals_the_python_reference(native, acc, size):
    """Random access traces (keys from a small alphabet: many shared, evicted, re-used; fresh
    decode keys from 2^31): the compiled MIN gives the reference's hits at every size."""
    from prefixscope.replay.belady import _min_hits_python, min_hits

    assert min_hits(acc, size) == _min_hits_python(acc, size)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=_fleet_traces(), size=st.integers(2, 30), algo=st.sampled_from(["sha256", "fast"]))
def test_min_hits_on_hashed_traces_equals_the_python_reference(native, trace, size, algo):
    from prefixscope.replay.belady import _min_hits_python, collect_accesses, min_hits

    acc = collect_accesses(trace, SimConfig(block_size=4, hash_algo=algo))
    assert min_hits(acc, size) == _min_hits_python(acc, size)


def test_min_hits_on_a_mooncake_slice_equals_the_python_reference(native):
    from prefixscope.replay.belady import _min_hits_python, collect_accesses, min_hits

    reqs = list(mooncake_requests(mooncake_path(), 0, 300, block_size=16, mode="keys"))
    acc = collect_accesses(reqs, SimConfig(block_size=16, hash_algo="fast"))
    for size in (300, 1000, 4000):
        mn = min_hits(acc, size)
        assert mn == _min_hits_python(acc, size)
        assert sum(m for m in mn if m > 0) > 0


def test_min_hits_checks_its_arguments(native):
    with pytest.raises(ValueError):
        native.min_hits([[1, 2]], [3], [2], 4)  # num_lookup past the keys
    with pytest.raises(ValueError):
        native.min_hits([[2**32]], [1], [1], 4)
    with pytest.raises(ValueError):
        native.min_hits([[1]], [1, 1], [1], 4)
    assert native.min_hits([], [], [], 4) == []


@SETTINGS
@given(keys=st.lists(st.integers(0, 15), min_size=1, max_size=20, unique=True),
       data=st.data(), n_others=st.integers(0, 3))
def test_stored_run_equals_the_python_reference(native, monkeypatch_session, keys, data,
                                                n_others):
    """Random memberships (keys behind the break held here, by others, by none; the run's end
    anywhere): the compiled run 1 gives the reference's counts."""
    from prefixscope.replay import ledger

    pick = st.sets(st.sampled_from(keys))
    ever = set(data.draw(pick)) | {keys[0]}
    mine = dict.fromkeys(data.draw(pick))
    others = [dict.fromkeys(data.draw(pick)) for _ in range(n_others)]
    stop = data.draw(st.integers(1, len(keys)))
    args = (keys, 0, stop, ever, mine, others)
    got = native.stored_run(*args)
    monkeypatch_session.setattr(ledger, "NATIVE", None)
    try:
        assert got == ledger._stored_run(*args)
    finally:
        monkeypatch_session.undo()
