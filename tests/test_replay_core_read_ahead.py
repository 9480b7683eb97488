"""``simulate(..., read_ahead=True)``: requests read and hashed a batch ahead of the cache model
give the same results, the same final pool and the same errors at the same positions as the
lazy default; only the reading happens up to one batch earlier (bounded)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.core.errors import SimulationError
from prefixscope.replay import sim
from prefixscope.replay.sim import read_ahead, simulate
from prefixscope.replay.types import SimConfig, TraceRequest
from tests.replay_core_support import check_pool_invariants, mooncake_path, mooncake_requests

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class TraceBroke(Exception):
    """Raised by a test trace at a chosen position (a reader's bad record)."""


def trace(specs, break_at):
    """TraceRequests from ``(tokens, out, has_ids)``; raises TraceBroke before ``break_at``."""
    for i, (tokens, out, has_ids) in enumerate(specs):
        if i == break_at:
            raise TraceBroke(i)
        yield TraceRequest(str(i), float(i), len(tokens),
                           prompt_token_ids=tokens if has_ids else None, output_tokens=out)


def outcome(specs, break_at, config, ahead):
    """(results as tuples, the error's type and message or None, final pool state)."""
    run = simulate(trace(specs, break_at), config, read_ahead=ahead)
    got, err = [], None
    try:
        for r in run:
            got.append((r.request_id, r.prompt_tokens, r.cached_tokens, r.created_cache_tokens,
                        r.completion_tokens, r.counted, r.rejected_reason))
    except (TraceBroke, SimulationError) as e:
        err = (type(e).__name__, str(e))
    p = run.manager.block_pool
    check_pool_invariants(p)
    state = (list(p.free_queue), list(p.block_hash), dict(p._first),
             {k: list(v) for k, v in p._dups.items()}, p.num_evicted_blocks,
             p.num_cached_blocks_total, list(p.ref_cnt))
    return got, err, state, run.summary()


@SETTINGS
@given(specs=st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=60),
                                st.integers(0, 30), st.integers(0, 9).map(lambda x: x > 0)),
                      min_size=1, max_size=25),
       break_at=st.integers(0, 30), bs=st.sampled_from([1, 2, 4, 16]),
       capacity=st.sampled_from([None, 3, 8, 40]),
       algo=st.sampled_from(["sha256", "xxhash", "sha256_cbor"]),
       batch=st.integers(1, 6), batch_blocks=st.integers(1, 50))
def test_read_ahead_gives_the_lazy_results_pool_and_errors(specs, break_at, bs, capacity, algo,
                                                           batch, batch_blocks):
    config = SimConfig(block_size=bs, num_gpu_blocks=capacity, hash_algo=algo)
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(sim, "READ_AHEAD_REQUESTS", batch)
        mp.setattr(sim, "READ_AHEAD_BLOCKS", batch_blocks)
        assert outcome(specs, break_at, config, True) == outcome(specs, break_at, config, False)
    finally:
        mp.undo()


def test_read_ahead_equals_lazy_on_mooncake_with_the_default_batches():
    reqs = list(mooncake_requests(mooncake_path(), 0, 120, block_size=16))
    for cap in (3000, None):
        config = SimConfig(block_size=16, num_gpu_blocks=cap)
        lazy = [(r.request_id, r.cached_tokens) for r in simulate(reqs, config)]
        ahead = [(r.request_id, r.cached_tokens) for r in simulate(reqs, config, read_ahead=True)]
        assert ahead == lazy
        assert sum(c for _, c in lazy) > 0


def test_read_ahead_reads_at_most_one_batch_ahead():
    pulled = []

    def tracking():
        for i in range(10**9):
            pulled.append(i)
            yield TraceRequest(str(i), float(i), 64, prompt_token_ids=list(range(64)))

    run = simulate(tracking(), SimConfig(block_size=16), read_ahead=True)
    next(run)
    assert len(pulled) == sim.READ_AHEAD_REQUESTS  # 4 blocks each: the request bound ends it
    for _ in range(sim.READ_AHEAD_REQUESTS):
        next(run)
    assert len(pulled) == 2 * sim.READ_AHEAD_REQUESTS
    # Large prompts: the block bound ends a batch first.
    pulled.clear()
    big = sim.READ_AHEAD_BLOCKS // 4

    def large():
        for i in range(10**9):
            pulled.append(i)
            yield TraceRequest(str(i), float(i), 16 * big, prompt_token_ids=[i] * (16 * big))

    next(simulate(large(), SimConfig(block_size=16), read_ahead=True))
    assert len(pulled) == 4
    # Fast keys are not read ahead (nothing to hash), nor the step model's requests.
    pulled.clear()
    next(simulate(tracking(), SimConfig(block_size=16, hash_algo="fast"), read_ahead=True))
    assert len(pulled) == 1


def test_read_ahead_helper_raises_after_the_items_before_the_error():
    def items():
        yield from [(None, "a"), (None, "b")]
        raise TraceBroke("third")

    it = read_ahead(items(), 10, 100)
    assert next(it) == (None, "a")
    assert next(it) == (None, "b")
    with pytest.raises(TraceBroke, match="third"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
