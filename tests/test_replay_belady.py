"""Capacity sweep (replay/belady.py): LRU equals ``replay sim`` at every size; Belady's MIN is
never below LRU; a narrated case where MIN keeps what LRU evicts."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.replay.belady import capacity_sweep, collect_accesses, lru_hits, min_hits
from prefixscope.replay.sim import simulate
from prefixscope.replay.types import SimConfig, TraceRequest

B = 4


def req(rid, ids, out=0, skip=False):
    return TraceRequest(request_id=rid, arrival_s=0.0, num_prompt_tokens=len(ids),
                        prompt_token_ids=ids, output_tokens=out, skip_reading=skip)


def test_min_keeps_the_block_used_again_soon_where_lru_evicts_it():
    """num_gpu_blocks 4: 3 usable blocks of 4 tokens. A (8 tokens: 2 blocks, 1 lookup) then X, Y, Z (8 tokens
    each, all different) then A again. Each X/Y/Z needs 2 blocks: LRU evicts A's blocks first
    (the oldest) and A's resend misses; MIN evicts the blocks never used again (X, Y, Z's) and
    keeps A's first block (next used at the resend): A hits 4 tokens."""
    a = list(range(8))
    trace = [req("a", a), req("x", list(range(10, 18))), req("y", list(range(20, 28))),
             req("z", list(range(30, 38))), req("a2", a)]
    acc = collect_accesses(trace, SimConfig(block_size=B, hash_algo="sha256"))
    assert lru_hits(acc, 4) == [0, 0, 0, 0, 0]
    assert min_hits(acc, 4) == [0, 0, 0, 0, 4]
    rows = capacity_sweep(acc, [4, 3, 100], jobs=2)
    assert [(r.num_gpu_blocks, r.lru_cached_tokens, r.min_cached_tokens) for r in rows] == [
        (4, 0, 4), (3, 0, 0), (100, 4, 4)]
    assert rows[0].prompt_tokens == 40 and rows[0].requests == 5 and rows[0].rejected == 0
    assert rows[0].as_dict()["min_minus_lru_tokens"] == 4
    # 2 usable blocks: each request fills the cache, nothing survives for the resend.
    # 1 usable block cannot hold an 8-token request (2 blocks): all rejected.
    assert capacity_sweep(acc, [2], jobs=1)[0].rejected == 5
    assert lru_hits(acc, 2) == min_hits(acc, 2) == [-1] * 5


SEGMENTS = [list(range(k * 10, k * 10 + n)) for k, n in enumerate([4, 4, 6, 8, 3, 5, 12])]


@st.composite
def traces(draw):
    out = []
    for k in range(draw(st.integers(1, 16))):
        segs = draw(st.lists(st.integers(0, len(SEGMENTS) - 1), min_size=1, max_size=5))
        out.append(req(f"r{k}", [t for s in segs for t in SEGMENTS[s]],
                       out=draw(st.integers(0, 6)), skip=draw(st.booleans()) and k % 5 == 4))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), sizes=st.lists(st.integers(2, 40), min_size=1, max_size=4),
       algo=st.sampled_from(["sha256", "fast"]))
def test_lru_equals_replay_sim_and_min_is_never_below_lru(trace, sizes, algo):
    acc = collect_accesses(trace, SimConfig(block_size=B, hash_algo=algo))
    for size in sizes:
        cfg = SimConfig(block_size=B, num_gpu_blocks=size, hash_algo=algo)
        sim = [r.cached_tokens if r.rejected_reason is None else -1 for r in simulate(trace, cfg)]
        lru = lru_hits(acc, size)
        assert lru == sim
        mn = min_hits(acc, size)
        assert [m < 0 for m in mn] == [x < 0 for x in lru]
        counted = [c for c in acc.counted]
        assert sum(m for m, c in zip(mn, counted) if m > 0 and c) >= \
            sum(x for x, c in zip(lru, counted) if x > 0 and c)
    rows = capacity_sweep(acc, sizes, jobs=1)
    for row in rows:
        assert row.min_cached_tokens >= row.lru_cached_tokens
        assert row.min_cached_tokens <= row.prompt_tokens


def test_the_sweep_in_forked_workers_equals_the_sweep_here(monkeypatch):
    """This process computes sizes 0, jobs, 2 x jobs ... and forked workers the others (the
    small-sweep shortcut turned off): the rows equal those computed here, in the order given."""
    from prefixscope.replay import belady

    trace = [req(f"r{k}", [t for s in (k % 7, (k * 3) % 7, 6) for t in SEGMENTS[s]], out=k % 5)
             for k in range(40)]
    acc = collect_accesses(trace, SimConfig(block_size=B, hash_algo="sha256"))
    sizes = [40, 3, 9, 17, 25, 6, 12]
    here = capacity_sweep(acc, sizes, jobs=1)
    monkeypatch.setattr(belady, "PARALLEL_MIN_ACCESSES", 0)
    for jobs in (2, 3):
        assert capacity_sweep(acc, sizes, jobs=jobs) == here
    assert [r.num_gpu_blocks for r in here] == sizes
    assert any(r.min_cached_tokens > r.lru_cached_tokens for r in here)
