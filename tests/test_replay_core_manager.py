"""vLLM's own prefix-caching tests, ported as narrated scenarios with exact block ids and
free-queue order (``tests/v1/core/test_prefix_caching.py`` of vLLM 0.33; the same results come
from vLLM 0.32's KVCacheManager, see ``tests/test_replay_core_parity.py``)."""

from __future__ import annotations

import pytest

from prefixscope.replay.hashing import block_hashes
from tests.replay_core_support import free_ids, make_manager, make_request
from tests.replay_core_support import check_pool_invariants

COMMON = [i for i in range(3) for _ in range(16)]  # three full blocks of 16 tokens


def admit(manager, req):
    """Lookup then allocate the request's remaining prompt tokens (as the scheduler does)."""
    hits, n = manager.get_computed_blocks(req)
    new = manager.allocate_slots(req, req.num_tokens - n, n, hits)
    if new is not None:
        req.num_computed_tokens = req.num_tokens
    return hits, n, new


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_prefill(algo):
    m = make_manager(11)  # 10 usable blocks, block 0 is the null block
    # Request 0: 3 full blocks + 7 tokens, a full miss. Gets blocks 1-4 (4 is partial).
    req0 = make_request("0", COMMON + [3] * 7, algo=algo)
    assert len(req0.block_keys) == 3
    hits, n, new = admit(m, req0)
    assert (hits, n, new) == ([], 0, [1, 2, 3, 4])
    # Full blocks carry the chained hashes; the partial block carries none.
    want = block_hashes(COMMON, block_size=16, algo=algo)
    assert [m.block_pool.block_hash[b] for b in (1, 2, 3)] == want
    assert m.block_pool.block_hash[4] is None
    assert [m.block_pool.ref_cnt[b] for b in (1, 2, 3, 4)] == [1, 1, 1, 1]
    # Request 1 shares the 48-token prefix while request 0 still runs: hits 1-3, new block 5.
    req1 = make_request("1", COMMON + [3] * 5, algo=algo)
    hits, n, new = admit(m, req1)
    assert (hits, n, new) == ([1, 2, 3], 48, [5])
    assert [m.block_pool.ref_cnt[b] for b in (1, 2, 3)] == [2, 2, 2]
    assert m.block_pool.get_num_free_blocks() == 5
    # Free both: partial blocks (5, then 4) go to the front, hashed ones (3, 2, 1) to the back.
    m.free(req0)
    m.free(req1)
    assert free_ids(m) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    # Request 2 hits the free cached blocks 1-3 and reuses the partial block 5 first.
    req2 = make_request("2", COMMON + [3] * 6, algo=algo)
    hits, n, new = admit(m, req2)
    assert (hits, n, new) == ([1, 2, 3], 48, [5])
    assert m.block_pool.get_num_free_blocks() == 6
    assert free_ids(m) == [4, 6, 7, 8, 9, 10]
    m.free(req2)
    # A 160-token miss allocates all ten blocks in free-queue order, evicting 3, 2, 1 last.
    req3 = make_request("3", [99] * 160, algo=algo)
    hits, n, new = admit(m, req3)
    assert (hits, n, new) == ([], 0, [5, 4, 6, 7, 8, 9, 10, 3, 2, 1])
    assert free_ids(m) == [] and m.block_pool.num_evicted_blocks == 3
    check_pool_invariants(m.block_pool)


def test_prefill_plp():
    """Prompt-logprobs requests never read the cache but still write (duplicate) blocks."""
    m = make_manager(11)
    req0 = make_request("0", COMMON + [3] * 7, skip_reading=True)
    hits, n, new = admit(m, req0)
    assert (hits, n, new) == ([], 0, [1, 2, 3, 4])
    req0_keys = [m.block_pool.block_hash[b] for b in (1, 2, 3, 4)]
    # A normal request hits request 0's blocks while they are in use.
    req1 = make_request("1", COMMON + [3] * 5)
    hits, n, new = admit(m, req1)
    assert (hits, n, new) == ([1, 2, 3], 48, [5])
    m.free(req0)
    m.free(req1)
    assert free_ids(m) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    # A second prompt-logprobs request with the same prefix: no hit, fresh blocks whose
    # hashes duplicate request 0's.
    req2 = make_request("2", COMMON + [3] * 6, skip_reading=True)
    hits, n, new = admit(m, req2)
    assert (hits, n) == ([], 0) and new == [5, 4, 6, 7]
    assert [m.block_pool.block_hash[b] for b in new] == req0_keys
    assert all(m.block_pool.ref_cnt[b] == 1 for b in new)
    # Lookups still return the first inserted copy (blocks 1-3).
    assert [m.block_pool.get_cached_block(k) for k in req0_keys[:3]] == [1, 2, 3]
    m.free(req2)
    check_pool_invariants(m.block_pool)


def test_decode():
    """Decode tokens fill the partial block; a block is hashed only when full."""
    m = make_manager(11)
    req0 = make_request("0", COMMON + [3] * 7)
    _, _, new = admit(m, req0)
    assert new == [1, 2, 3, 4]
    # Four generated tokens: block 4 now holds 11 tokens, still no new block and no hash.
    req0.append_output_tokens(4)
    assert m.allocate_slots(req0, 4) == []
    req0.num_computed_tokens += 4
    assert m.get_block_ids("0")[-1] == 4 and m.block_pool.block_hash[4] is None
    # 19 more: 5 fill block 4 (now hashed), 14 go to a new block 5 (not full, no hash).
    req0.append_output_tokens(19)
    assert m.allocate_slots(req0, 19) == [5]
    assert m.block_pool.block_hash[4] is not None and m.block_pool.block_hash[5] is None
    assert len(req0.block_keys) == 4


def test_evict():
    m = make_manager(11)
    # Request 0: 5 full blocks + 7 tokens -> blocks 1-6 (6 partial).
    req0 = make_request("0", list(range(5 * 16 + 7)))
    assert admit(m, req0)[2] == [1, 2, 3, 4, 5, 6]
    # Request 1: three full blocks of fresh tokens -> blocks 7-9; only block 10 stays free.
    req1 = make_request("1", list(range(5 * 16 + 7, 5 * 16 + 7 + 48)))
    assert admit(m, req1)[2] == [7, 8, 9]
    assert free_ids(m) == [10]
    # Freeing request 0: partial block 6 to the front, hashed 5..1 (tail first) to the back.
    m.free(req0)
    assert free_ids(m) == [6, 10, 5, 4, 3, 2, 1]
    m.free(req1)
    assert free_ids(m) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    # A 35-token request hits blocks 1 and 2 and takes block 6 from the front.
    req2 = make_request("2", list(range(2 * 16 + 3)))
    hits, n, new = admit(m, req2)
    assert (hits, n, new) == ([1, 2], 32, [6])
    assert m.block_pool.get_num_free_blocks() == 7


def test_hash_block_correct_reuse():
    """An evicted block reused as a partial block loses its old hash."""
    m = make_manager(2)  # one usable block
    req = make_request("0", list(range(16)))
    assert admit(m, req)[2] == [1]
    assert m.block_pool.block_hash[1] is not None
    m.free(req)
    req = make_request("1", list(range(15)))
    assert admit(m, req)[2] == [1]
    assert m.block_pool.block_hash[1] is None and m.block_pool.num_evicted_blocks == 1


def test_computed_blocks_not_evicted():
    """Allocation evicts another free cached block, not the one just hit."""
    m = make_manager(3)
    req0 = make_request("0", list(range(16)))
    assert admit(m, req0)[2] == [1]
    req1 = make_request("1", list(range(16, 32)))
    assert admit(m, req1)[2] == [2]
    m.free(req0)
    m.free(req1)
    assert free_ids(m) == [1, 2]
    req2 = make_request("2", list(range(32)))
    hits, n, new = admit(m, req2)
    assert (hits, n, new) == ([1], 16, [2])


def test_basic_prefix_caching_disabled():
    m = make_manager(5, block_size=4, enable_caching=False)
    req1 = make_request("1", list(range(10)), block_size=4)
    hits, n, new = admit(m, req1)
    assert (hits, n) == ([], 0) and len(new) == 3
    m.free(req1)
    # No caching: the same prefix misses; with caching off all freed blocks went to the front.
    req2 = make_request("2", list(range(16)), block_size=4)
    hits, n, new = admit(m, req2)
    assert (hits, n) == ([], 0) and len(new) == 4
    # The pool is exhausted: the next request cannot be allocated.
    req3 = make_request("3", list(range(4)), block_size=4)
    assert admit(m, req3)[2] is None
    assert all(h is None for h in m.block_pool.block_hash)


def test_cache_key_salting():
    toks = COMMON + [3] * 11
    a = make_request("0", toks, cache_salt="salt1")
    assert len(a.block_keys) == 3
    plain = block_hashes(toks, block_size=16)
    assert all(x != y for x, y in zip(a.block_keys, plain))
    same = make_request("1", toks, cache_salt="salt1")
    other = make_request("2", toks, cache_salt="salt2")
    assert same.block_keys == a.block_keys
    assert all(x != y for x, y in zip(other.block_keys, a.block_keys))
    # Behaviour: the same salt hits, a different salt or no salt misses.
    m = make_manager(20)
    admit(m, a)
    m.free(a)
    assert admit(m, same)[1] == 48
    assert admit(m, other)[1] == 0
    assert admit(m, make_request("3", toks))[1] == 0


def test_prefill_not_enough_free_blocks_with_computed_blocks():
    """A failed allocation leaves the hit blocks' reference counts unchanged."""
    m = make_manager(11)
    req0 = make_request("0", COMMON)
    admit(m, req0)
    part0 = m.get_block_ids("0")
    assert part0 == [1, 2, 3]
    req1 = make_request("1", COMMON * 2)
    hits, n, _ = admit(m, req1)
    assert hits == part0 and n == 48
    part1 = m.get_block_ids("1")
    assert part1 == [1, 2, 3, 4, 5, 6]
    m.free(req1)
    assert [m.block_pool.ref_cnt[b] for b in part1] == [1, 1, 1, 0, 0, 0]
    req2 = make_request("2", [7] * 32)
    assert admit(m, req2)[2] == [7, 8]
    assert m.block_pool.get_num_free_blocks() == 5
    # Request 3 hits all six blocks of request 1 but needs 3 new + 3 evictable > 5 free.
    req3 = make_request("3", COMMON * 3)
    hits, n = m.get_computed_blocks(req3)
    assert hits == part1 and n == 96
    assert m.allocate_slots(req3, 48, n, hits) is None
    assert [m.block_pool.ref_cnt[b] for b in part1] == [1, 1, 1, 0, 0, 0]
    assert m.block_pool.get_num_free_blocks() == 5
    check_pool_invariants(m.block_pool)


def test_reset_prefix_cache():
    m = make_manager(11)
    req0 = make_request("0", COMMON + [3] * 7)
    assert admit(m, req0)[2] == [1, 2, 3, 4]
    req1 = make_request("1", COMMON + [4] * 7)
    hits, n, new = admit(m, req1)
    assert len(hits) == 3 and new == [5]
    # Blocks are in use: the reset fails and the cache keeps its keys.
    assert m.reset_prefix_cache() is False
    assert m.block_pool.num_cached_blocks == 3
    m.free(req0)
    m.free(req1)
    assert m.reset_prefix_cache() is True
    assert m.block_pool.num_cached_blocks == 0
    assert all(h is None for h in m.block_pool.block_hash)
    assert admit(m, make_request("2", COMMON + [4] * 7))[1] == 0


def test_seventeen_token_prompt_sent_twice_caches_sixteen():
    # vLLM test_scheduler_e2e::test_prefix_cache_stats_is_recorded (B=16).
    m = make_manager(100)
    for expect in (0, 16):
        req = make_request("r", list(range(17)))
        assert admit(m, req)[1] == expect
        m.free(req)


@pytest.mark.parametrize("block_size,n,expect", [
    (16, 320, 304), (16, 319, 304), (16, 321, 320), (16, 32, 16), (16, 16, 0),
    (32, 320, 288), (32, 319, 288), (32, 321, 320), (32, 32, 0), (32, 16, 0),
])
def test_last_prompt_token_is_always_recomputed(block_size, n, expect):
    # An identical resend of an n-token prompt hits floor((n-1)/B)*B tokens.
    m = make_manager(200, block_size)
    hits = []
    for _ in range(3):
        req = make_request("r", list(range(1000, 1000 + n)), block_size)
        hits.append(admit(m, req)[1])
        m.free(req)
    assert hits == [0, expect, expect]
    assert expect == (n - 1) // block_size * block_size
