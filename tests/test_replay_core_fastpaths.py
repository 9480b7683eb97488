"""The simulator's fast paths equal the plain ones they replace.

1. The vectorised pickle encoder (``prefixscope.replay.hashing.pickle_int_opcodes`` with
   ``pickle_block_layout``/``pickle_block_head``) writes, block by block, byte for byte what
   ``pickle.dumps((parent, tuple(tokens), None), protocol=5)`` writes (hypothesis, all int
   ranges, block sizes 1..64 and 512), and declines ids it cannot encode.
2. ``BlockHasher`` through that path gives the digests of the per-block definition, the golden
   vector and every captured vLLM ``BlockStored`` hash.
3. ``KVCacheManager.run_alone`` (one pass per request on an idle pool) leaves the pool exactly as
   the step-by-step sequence (lookup, allocate, decode, free) does: same hits, free-queue order,
   keys, duplicate lists and counters (hypothesis, with eviction and duplicate keys).
"""

from __future__ import annotations

import hashlib
import json
import pickle
from array import array

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.replay import hashing
from prefixscope.replay.hashing import (
    BlockHasher,
    hash_function,
    int_block_hash,
    none_hash,
    pickle_block_head,
    pickle_block_layout,
    pickle_int_opcodes,
)
from prefixscope.replay.kv_cache_manager import KVCacheManager, SimRequest, cdiv
from prefixscope.replay.scheduler import run_steps
from tests.replay_core_support import check_pool_invariants

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# Every opcode class and its edges: BININT1, BININT2, BININT (positive and negative).
EDGES = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, -1, -(2**31), -256, -65536]
int32_tokens = st.one_of(
    st.sampled_from(EDGES), st.integers(0, 255), st.integers(256, 65535),
    st.integers(65536, 2**31 - 1), st.integers(-(2**31), -1),
)
block_sizes = st.one_of(st.integers(1, 64), st.just(512))


def pickled_blocks(parent: bytes, tokens: list[int], bs: int) -> list[bytes]:
    return [pickle.dumps((parent, tuple(tokens[i:i + bs]), None), protocol=5)
            for i in range(0, len(tokens), bs)]


@SETTINGS
@given(bs=block_sizes, data=st.data(), parent_size=st.sampled_from([32, 16]))
def test_encoder_writes_what_pickle_writes(bs, data, parent_size):
    nb = data.draw(st.integers(1, 6 if bs < 512 else 2))
    tokens = data.draw(st.lists(int32_tokens, min_size=nb * bs, max_size=nb * bs))
    parent = data.draw(st.binary(min_size=parent_size, max_size=parent_size))
    prefix, suffix = pickle_block_layout(bs)
    enc = pickle_int_opcodes(tokens, bs, prefix, suffix)
    assert enc is not None
    stream, ends = enc
    assert len(ends) == nb and ends[-1] == len(stream)
    starts = [0, *ends[:-1]]
    got = [pickle_block_head(e - s, parent_size) + parent + stream[s:e]
           for s, e in zip(starts, ends)]
    assert got == pickled_blocks(parent, tokens, bs)


@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1, 2**62, -(1 << 62), 1.0, "7"])
def test_encoder_declines_what_it_cannot_encode(bad):
    assert pickle_int_opcodes([1, 2, bad, 4], 4) is None


def test_largest_fast_block_is_one_pickle_frame():
    bs = hashing._MAX_FAST_BLOCK_SIZE
    tokens = [2**31 - 1] * bs  # 5 bytes each: the largest body
    prefix, suffix = pickle_block_layout(bs)
    stream, ends = pickle_int_opcodes(tokens, bs, prefix, suffix)
    parent = bytes(32)
    assert pickle_block_head(ends[0], 32) + parent + stream == pickled_blocks(parent, tokens, bs)[0]


def reference_hashes(tokens, bs, algo="sha256", salt=None, seed=None):
    fn, parent, out = hash_function(algo), none_hash(algo, seed), []
    for i in range(len(tokens) // bs):
        extra = (("cache_salt", salt),) if salt and i == 0 else None
        parent = fn((parent, tuple(tokens[i * bs:(i + 1) * bs]), extra))
        out.append(parent)
    return out


@SETTINGS
@given(bs=st.sampled_from([1, 2, 3, 4, 16, 32]), algo=st.sampled_from(["sha256", "xxhash"]),
       salt=st.sampled_from([None, "s"]), cut=st.integers(0, 200),
       tokens=st.lists(int32_tokens, max_size=300),
       container=st.sampled_from([list, tuple, lambda t: array("q", t)]))
def test_block_hasher_equals_the_per_block_definition(bs, algo, salt, cut, tokens, container):
    h = BlockHasher(algo=algo, block_size=bs, cache_salt=salt, seed="7")
    keys: list = []
    h.extend(keys, container(tokens))
    assert keys == reference_hashes(tokens, bs, algo, salt, "7")
    # Incrementally, from an offset window (as decode does).
    cut = min(cut, len(tokens)) // bs * bs
    keys2: list = []
    h.extend(keys2, tokens[:cut])
    h.extend(keys2, tokens[cut:], offset=cut)
    assert keys2 == keys


@pytest.mark.parametrize("tokens", [
    list(range(64)) + [2**40] + list(range(63)),  # inside a full block
    list(range(64)) + [2**40],  # in the partial tail (never hashed, still declined)
])
def test_tokens_beyond_int32_fall_back_to_pickle(tokens):
    keys: list = []
    BlockHasher(block_size=16).extend(keys, tokens)
    assert keys == reference_hashes(tokens, 16)


@SETTINGS
@given(bs=st.sampled_from([1, 2, 3, 4, 16, 32, 7000]), algo=st.sampled_from(["sha256", "xxhash"]),
       runs=st.lists(st.tuples(st.sampled_from([-(1 << 62), 1 << 40, -(1 << 31) - 1, 5, 300]),
                               st.integers(1, 40)), min_size=1, max_size=5),
       head=st.lists(int32_tokens, max_size=40), cut=st.integers(0, 400))
def test_repeated_blocks_beyond_int32_reuse_their_pickle(bs, algo, runs, head, cut):
    # Generated output without known ids is a run of one placeholder id beyond int32: blocks
    # equal to the previous one reuse its serialised body (one pickle frame; bs=7000 with
    # 10-byte ints is several frames, where nothing is reused), hashed as pickle.dumps would be.
    tokens = head + [t for t, n in runs for _ in range(n * (8 if bs < 100 else bs // 2))]
    tokens = tokens[:bs * 12 + 5]
    h = BlockHasher(algo=algo, block_size=bs, seed="3")
    keys: list = []
    h.extend(keys, tokens)
    assert keys == reference_hashes(tokens, bs, algo, None, "3")
    cut = min(cut, len(tokens)) // bs * bs  # decode: a window after the keyed blocks
    keys2: list = []
    h.extend(keys2, tokens[:cut])
    h.extend(keys2, tokens[cut:], offset=cut)
    assert keys2 == keys


def test_encoder_ignores_the_partial_tail():
    prefix, suffix = pickle_block_layout(4)
    assert pickle_int_opcodes(list(range(10)), 4, prefix, suffix) == pickle_int_opcodes(
        list(range(8)), 4, prefix, suffix)


@pytest.fixture
def always_vectorised(monkeypatch):
    """Route every extend() of one block or more through the vectorised encoder."""
    monkeypatch.setattr(hashing, "_MIN_FAST_BLOCKS", 1)


def test_golden_vector_through_the_vectorised_path(always_vectorised):
    keys: list = []
    BlockHasher(block_size=16).extend(keys, list(range(32)))
    assert [k.hex() for k in keys] == [
        "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798",
        "8be7aaa33831156d316f1f463ae57e643deb63f42e633e2d631df88815cc4629",
    ]


def test_captured_block_stored_hashes_through_the_vectorised_path(always_vectorised, data_dir):
    # Live vLLM 0.32 CPU server, block size 32, sha256, PYTHONHASHSEED unset.
    files = sorted((data_dir / "vllm-cpu-0.32").glob("kv_events*.jsonl"))
    assert files
    full: dict[int, bytes] = {}
    checked = 0
    for f in files:
        for line in f.read_text().splitlines():
            for ev in json.loads(line)["payload"][1]:
                if ev["type"] != "BlockStored":
                    continue
                bs, toks, extra = ev["block_size"], ev["token_ids"], ev.get("extra_keys")
                salt = extra[0][0] if extra and extra[0] else None
                hasher = BlockHasher(block_size=bs, cache_salt=salt)
                keys = [] if ev["parent_block_hash"] is None else [full[ev["parent_block_hash"]]]
                hasher.extend(keys, toks, offset=len(keys) * bs)
                got = keys[-len(ev["block_hashes"]):]
                assert [int_block_hash(d) for d in got] == ev["block_hashes"]
                full.update(zip(ev["block_hashes"], got))
                checked += len(got)
    assert checked > 600


# -- run_alone equals the step-by-step sequence ---------------------------------------------------
def make_request(i, prompt, out, bs, hasher, skip):
    return SimRequest(str(i), block_size=bs, prompt_token_ids=prompt, hasher=hasher,
                      max_tokens=out, skip_reading=skip)


def pool_state(m: KVCacheManager):
    p = m.block_pool
    return (list(p.free_queue), list(p.block_hash), dict(p._first),
            {k: list(v) for k, v in p._dups.items()}, p.num_evicted_blocks,
            p.num_cached_blocks_total, p.free_queue.num_free_blocks, list(p.ref_cnt))


@SETTINGS
@given(bs=st.sampled_from([1, 2, 3, 4, 16]), algo=st.sampled_from(["sha256", "fast"]),
       capacity=st.integers(2, 40),
       trace=st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=70),
                                st.integers(0, 40), st.booleans()), min_size=1, max_size=14))
def test_run_alone_leaves_the_pool_as_the_steps_do(bs, algo, capacity, trace):
    a = KVCacheManager(num_gpu_blocks=capacity, block_size=bs)
    b = KVCacheManager(num_gpu_blocks=capacity, block_size=bs)
    hasher = BlockHasher(algo=algo, block_size=bs)
    for i, (prompt, out, skip) in enumerate(trace):
        if cdiv(len(prompt) + max(out, 1) - 1, bs) > capacity - 1:
            continue  # rejected upstream (longer than the cache)
        skip = skip and i % 3 == 0
        ra = make_request(i, prompt, out, bs, hasher, skip)
        rb = make_request(i, prompt, out, bs, hasher, skip)
        got = a.run_alone(ra)
        assert got is not None
        assert got == run_steps(b, rb)  # the product's slow path itself
        assert (ra.cached_tokens, ra.num_computed_tokens, ra.num_output_tokens) == (
            rb.cached_tokens, rb.num_computed_tokens, rb.num_output_tokens)
        assert pool_state(a) == pool_state(b)
        check_pool_invariants(a.block_pool)


def test_run_alone_declines_when_blocks_are_in_use():
    m = KVCacheManager(num_gpu_blocks=10, block_size=4)
    h = BlockHasher(block_size=4)
    held = make_request(0, list(range(8)), 1, 4, h, False)
    m.allocate_slots(held, 8)
    assert m.run_alone(make_request(1, list(range(8)), 1, 4, h, False)) is None
    unbounded = KVCacheManager(num_gpu_blocks=None, block_size=4)
    assert unbounded.run_alone(make_request(2, list(range(8)), 1, 4, h, False)) is None


def test_sha256_path_uses_hashlib_digests():
    # The vectorised path feeds copies of hashlib objects: the digest of the full pickle.
    tokens = list(range(1000, 1000 + 16 * 8))
    keys: list = []
    BlockHasher(block_size=16).extend(keys, tokens)
    root = none_hash()
    want = hashlib.sha256(pickle.dumps((root, tuple(tokens[:16]), None), protocol=5)).digest()
    assert keys[0] == want
    xk: list = []
    BlockHasher(algo="xxhash", block_size=16, seed="1").extend(xk, tokens)
    xroot = none_hash("xxhash", "1")
    assert xk[0] == xxhash.xxh3_128_digest(pickle.dumps((xroot, tuple(tokens[:16]), None), 5))


# Hash-id traces: mostly BININT tokens (ids * 512 + offset), a few smaller ones early or late.
binint_tokens = st.one_of(st.integers(65536, 2**31 - 1), st.integers(-(2**31), -1))


@SETTINGS
@given(bs=st.sampled_from([1, 4, 16, 17, 64]), data=st.data())
def test_uniform_binint_tail_is_what_pickle_writes(bs, data):
    # Blocks after the last token below 65536 take the uniform path (J + 4 bytes each).
    nb = data.draw(st.integers(1, 8))
    tokens = data.draw(st.lists(binint_tokens, min_size=nb * bs, max_size=nb * bs + bs - 1))
    for _ in range(data.draw(st.integers(0, 3))):  # a few short tokens anywhere (or none)
        tokens[data.draw(st.integers(0, len(tokens) - 1))] = data.draw(st.integers(0, 65535))
    parent = data.draw(st.binary(min_size=32, max_size=32))
    prefix, suffix = pickle_block_layout(bs)
    stream, ends = pickle_int_opcodes(tokens, bs, prefix, suffix)
    assert len(ends) == nb and ends[-1] == len(stream)
    starts = [0, *ends[:-1]]
    got = [pickle_block_head(e - s, 32) + parent + stream[s:e] for s, e in zip(starts, ends)]
    assert got == pickled_blocks(parent, tokens[:nb * bs], bs)
    keys: list = []
    BlockHasher(block_size=bs, seed="5").extend(keys, tokens)
    assert keys == reference_hashes(tokens, bs, "sha256", None, "5")


@SETTINGS
@given(bs=st.sampled_from([1, 2, 4, 16]), checkpoint=st.sampled_from([1, 2, 3, 32]),
       max_blocks=st.sampled_from([4, 40, 1 << 18]), data=st.data())
def test_prefix_memo_reuses_only_equal_prefixes(bs, checkpoint, max_blocks, data):
    # Prompts built from a few shared stems, each extended, cut or changed in one token: the
    # memo's digests must be those of the per-block definition, prompt after prompt, and for
    # two hashers (a salted one never uses the memo) sharing one memo without mixing.
    memo = hashing.PrefixMemo(max_blocks, checkpoint)
    plain = BlockHasher(block_size=bs, seed="9", memo=memo)
    other = BlockHasher(block_size=bs, seed="8", memo=memo)
    salted = BlockHasher(block_size=bs, seed="9", cache_salt="s", memo=memo)
    stems = data.draw(st.lists(st.lists(int32_tokens, min_size=bs * 4, max_size=bs * 12),
                               min_size=1, max_size=3))
    for _ in range(data.draw(st.integers(1, 8))):
        tokens = list(data.draw(st.sampled_from(stems)))
        edit = data.draw(st.sampled_from(["extend", "cut", "change", "same"]))
        if edit == "extend":
            tokens += data.draw(st.lists(int32_tokens, max_size=bs * 6))
        elif edit == "cut":
            tokens = tokens[:data.draw(st.integers(0, len(tokens)))]
        elif edit == "change" and tokens:
            i = data.draw(st.integers(0, len(tokens) - 1))
            tokens[i] = data.draw(int32_tokens.filter(lambda t, old=tokens[i]: t != old))
        if data.draw(st.booleans()):
            stems.append(tokens)
        hasher = data.draw(st.sampled_from([plain, other, salted]))
        seed = "8" if hasher is other else "9"
        salt = "s" if hasher is salted else None
        keys: list = []
        hasher.extend(keys, tokens)
        assert keys == reference_hashes(tokens, bs, "sha256", salt, seed)
    assert memo._blocks <= max_blocks


def test_prefix_memo_reuses_a_conversation_history():
    # A second turn resends the first turn's prompt: its first blocks come from the memo.
    memo = hashing.PrefixMemo()
    h = BlockHasher(block_size=16, memo=memo)
    h._native = False  # the memo serves the Python path (the compiled chain hashes every block)
    turn1 = [70000 + i for i in range(16 * 70)]
    turn2 = turn1 + [90000 + i for i in range(16 * 10)]
    k1: list = []
    h.extend(k1, turn1)
    assert memo.lookup(h._tag, hashing.pack_int32(turn2), 16) == k1  # 70 blocks, found at 31, 63
    k2: list = []
    h.extend(k2, turn2)
    assert k2[:70] == k1 and k2 == reference_hashes(turn2, 16)
    assert all(a is b for a, b in zip(k1, k2))  # the same digest objects: not recomputed
