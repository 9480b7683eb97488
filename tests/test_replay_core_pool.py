"""The block pool and free queue: vLLM's free-list operations, duplicate-hash semantics,
free order, eviction and the unbounded pool (``vllm/v1/core/block_pool.py``,
``FreeKVCacheBlockQueue``; ported from ``test_kv_cache_utils.py::test_free_kv_cache_block_queue_*``
and ``test_prefix_caching.py::test_maybe_evict_cached_block`` / ``test_block_lookup_cache_*``)."""

from __future__ import annotations

import pytest

from prefixscope.replay.block_pool import BlockPool, FreeBlockQueue
from tests.replay_core_support import check_pool_invariants


def test_free_queue_initialization():
    q = FreeBlockQueue(6)
    assert list(q) == [0, 1, 2, 3, 4, 5] and q.num_free_blocks == 6
    assert q.first() == 0


def test_free_queue_popleft_and_remove_in_the_middle():
    q = FreeBlockQueue(6)
    assert q.popleft() == 0
    q.remove(3)
    assert list(q) == [1, 2, 4, 5] and q.num_free_blocks == 4
    q.remove(5)  # the tail
    q.remove(1)  # the head
    assert list(q) == [2, 4] and q.num_free_blocks == 2


def test_free_queue_append_n_and_prepend_n_keep_given_order():
    q = FreeBlockQueue(6)
    taken = q.popleft_n(4)
    assert taken == [0, 1, 2, 3] and list(q) == [4, 5]
    q.append_n([2, 0])
    q.prepend_n([3, 1])
    assert list(q) == [3, 1, 4, 5, 2, 0] and q.num_free_blocks == 6


def test_free_queue_pop_until_empty():
    q = FreeBlockQueue(3)
    assert q.popleft_n(3) == [0, 1, 2]
    assert list(q) == [] and q.first() is None
    with pytest.raises(IndexError):
        q.popleft()
    q.append_n([1])
    assert list(q) == [1]
    q.prepend_n([2])
    assert list(q) == [2, 1]


def test_pool_takes_block_zero_as_null_block():
    p = BlockPool(5)
    assert list(p.free_queue) == [1, 2, 3, 4] and p.get_num_free_blocks() == 4
    assert p.get_new_blocks(1) == [1]
    p.free_blocks([0])  # freeing the null block is a no-op
    check_pool_invariants(p)


def test_duplicate_hashes_first_inserted_wins_and_evicting_one_keeps_the_other():
    p = BlockPool(6)
    blocks = p.get_new_blocks(4)  # 1, 2, 3, 4
    p.cache_full_blocks(blocks, ["h0", "h1", "h2", "h0"], 0, 4)  # block 4 duplicates block 1
    assert p.get_cached_block("h0") == 1
    assert p.num_cached_blocks == 4
    p.free_blocks(reversed(blocks))  # all hashed -> back, tail first: [5, 4, 3, 2, 1]
    assert list(p.free_queue) == [5, 4, 3, 2, 1]
    # Evict block 1 (the first copy of h0) by popping the front until it is reached.
    assert p.get_new_blocks(1) == [5]
    p.free_queue.remove(1)
    p.ref_cnt[1] = 1
    p._evict(1)
    assert p.get_cached_block("h0") == 4  # the duplicate takes over
    # Evicting the last copy removes the key.
    p.free_queue.remove(4)
    p.ref_cnt[4] = 1
    p._evict(4)
    assert p.get_cached_block("h0") is None
    assert p.get_cached_block("h1") == 2 and p.num_evicted_blocks == 2


def test_evicting_a_later_duplicate_keeps_the_first():
    p = BlockPool(4)
    b = p.get_new_blocks(2)
    p.cache_full_blocks(b, ["k", "k"], 0, 2)
    p.free_blocks([2, 1])  # queue: 3, 2, 1
    assert list(p.free_queue) == [3, 2, 1]
    assert p.get_new_blocks(2) == [3, 2]  # block 2 (the duplicate) is evicted
    assert p.get_cached_block("k") == 1
    check_pool_invariants(p)


def test_free_splits_unhashed_to_front_and_hashed_to_back():
    p = BlockPool(8)
    b = p.get_new_blocks(6)  # 1..6, leaving 7 free
    p.cache_full_blocks(b, ["a", "b", "c", "d", "e"], 0, 5)  # 6 stays partial
    p.free_blocks(reversed(b))
    assert list(p.free_queue) == [6, 7, 5, 4, 3, 2, 1]


def test_free_with_caching_off_puts_everything_in_front():
    p = BlockPool(6, enable_caching=False)
    b = p.get_new_blocks(3)
    p.free_blocks(reversed(b))
    assert list(p.free_queue) == [3, 2, 1, 4, 5]


def test_touch_removes_free_cached_blocks_from_queue():
    p = BlockPool(5)
    b = p.get_new_blocks(2)
    p.cache_full_blocks(b, ["x", "y"], 0, 2)
    p.free_blocks(reversed(b))
    assert list(p.free_queue) == [3, 4, 2, 1]
    p.touch([1])
    assert list(p.free_queue) == [3, 4, 2] and p.ref_cnt[1] == 1
    p.touch([1])
    assert p.ref_cnt[1] == 2 and p.get_num_free_blocks() == 3
    check_pool_invariants(p)


def test_get_new_blocks_beyond_free_raises():
    p = BlockPool(3)
    with pytest.raises(ValueError):
        p.get_new_blocks(3)


def test_usage_counts_referenced_blocks_only():
    p = BlockPool(5)
    b = p.get_new_blocks(2)
    assert p.usage == 0.5
    p.cache_full_blocks(b, ["x", "y"], 0, 2)
    p.free_blocks(b)
    assert p.usage == 0.0 and p.num_cached_blocks == 2


def test_reset_only_when_nothing_is_in_use():
    p = BlockPool(4)
    b = p.get_new_blocks(1)
    p.cache_full_blocks(b, ["x"], 0, 1)
    assert p.reset_prefix_cache() is False
    p.free_blocks(b)
    assert p.reset_prefix_cache() is True
    assert p.get_cached_block("x") is None and p.block_hash == [None] * 4


def test_unbounded_pool_never_evicts_and_reuses_unhashed_blocks():
    p = BlockPool(None)
    b = p.get_new_blocks(3)
    assert b == [1, 2, 3]
    p.cache_full_blocks(b, ["a", "b"], 0, 2)
    p.free_blocks(reversed(b))
    # 3 (unhashed) is at the front and reused; hashed 2 and 1 are never popped.
    assert p.get_new_blocks(3) == [3, 4, 5]
    assert p.get_cached_block("a") == 1 and p.num_evicted_blocks == 0
    check_pool_invariants(p)
    assert p.reset_prefix_cache() is False
