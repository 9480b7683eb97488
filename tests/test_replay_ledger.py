"""The miss ledger (replay/ledger.py) through fleet replay (replay/fleet.py): narrated scenarios
with exact token counts per class, and property tests (the classes partition every request's
prompt tokens; one instance has no routing loss; an unbounded cache has no capacity loss; round
robin over one instance is ``replay sim``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.replay.fleet import RouterParams, replay_fleet
from prefixscope.replay.ledger import (CLASSES, GROUP_BY, LedgerRecord, check_record,
                                       group_totals, totals_as_rows)
from prefixscope.replay.routers import ROUTERS
from prefixscope.replay.sim import simulate
from prefixscope.replay.types import SimConfig, TraceRequest

B = 4


def req(rid: str, ids: list[int], *, t: float = 0.0, salt: str | None = None, out: int = 0,
        conv: str | None = None, instance: str | None = None) -> TraceRequest:
    attrs = {}
    if conv is not None:
        attrs["conversation"] = conv
    if instance is not None:
        attrs["instance"] = instance
    return TraceRequest(request_id=rid, arrival_s=t, num_prompt_tokens=len(ids),
                        prompt_token_ids=ids, output_tokens=out, cache_salt=salt, attrs=attrs)


def records(trace, *, instances=1, router="round-robin", cap=None, algo="sha256", names=None):
    cfg = SimConfig(block_size=B, num_gpu_blocks=cap, hash_algo=algo)
    run = replay_fleet(trace, cfg, instances=instances, router=router, instance_names=names)
    recs = list(run)
    for r in recs:
        check_record(r)
    return {r.request_id: r for r in recs}, run.result


def classes(r: LedgerRecord) -> dict[str, int]:
    return {c: v for c, v in r.counts().items() if v}


# -- narrated scenarios ----------------------------------------------------------------------

def test_round_robin_conversation_misses_its_history_on_the_other_replica():
    """Two replicas behind round robin, one conversation whose prompt grows by 8 tokens a turn
    (B = 4, no output). Turn 1 (16 tokens) lands on i0: 3 lookup blocks, all cold, 4 tokens of
    granularity (the last block holds the last token, always recomputed). Turn 2 (24 tokens) on
    i1, which is empty: the 4 blocks turn 1 stored on i0 are resident there (routing 16), block
    4 is new (cold 4). Turn 3 (32 tokens) back on i0: turn 1's 4 blocks hit (16), blocks 4-5
    were stored by turn 2 on i1 (routing 8), block 6 is new (cold 4)."""
    base = list(range(100, 132))
    trace = [req("t1", base[:16], conv="c"), req("t2", base[:24], conv="c"),
             req("t3", base[:32], conv="c")]
    recs, res = records(trace, instances=2, router="round-robin")
    assert [recs[k].instance for k in ("t1", "t2", "t3")] == ["i0", "i1", "i0"]
    assert classes(recs["t1"]) == {"cold": 12, "granularity": 4}
    assert classes(recs["t2"]) == {"routing": 16, "cold": 4, "granularity": 4}
    assert recs["t2"].break_block == 0 and recs["t2"].break_class == "routing"
    assert classes(recs["t3"]) == {"hit": 16, "routing": 8, "cold": 4, "granularity": 4}
    assert res.ledger.routing == 24 and res.ledger.hit == 16 and res.ledger.prompt_tokens == 72
    assert res.ledger.share_of_missed("routing") == 24 / 56
    # Session affinity keeps the conversation on one replica: routing loss 0, hits 16 + 24.
    recs, res = records(trace, instances=2, router="session")
    assert {r.instance for r in recs.values()} == {"i0"}
    assert res.ledger.routing == 0 and res.ledger.hit == 40
    # So does the longest-prefix router (it reads each replica's block map).
    _, res = records(trace, instances=2, router="longest-prefix")
    assert res.ledger.routing == 0 and res.ledger.hit == 40


def test_tiny_cache_evicts_and_the_resend_is_a_capacity_miss():
    """num_gpu_blocks 4 (3 usable, B = 4): A (12 tokens) stores 3 blocks; B (12 other tokens)
    pops all three from the free queue (A's blocks were freed deepest first to the back:
    [3, 2, 1]) and evicts A's keys; A again: its 2 lookup blocks were stored and are resident
    nowhere: capacity 8, granularity 4. Unbounded, the resend hits 8."""
    a, b = list(range(12)), list(range(50, 62))
    trace = [req("a", a), req("b", b), req("a2", a)]
    recs, res = records(trace, cap=4)
    assert classes(recs["a2"]) == {"capacity": 8, "granularity": 4}
    assert res.instances[0].evicted_blocks == 3 + 3
    recs, _ = records(trace, cap=None)
    assert classes(recs["a2"]) == {"hit": 8, "granularity": 4}


def test_a_changing_first_line_is_a_prompt_change_not_cold():
    """A 4-token first line (one block) changes between two requests with the same 12-token
    body: block 0 is new content (cold 4); blocks 1-2 carry content an earlier request had, but
    the chain broke before them: prompt change 8; the last block is granularity 4."""
    body = list(range(200, 212))
    trace = [req("r1", [1, 2, 3, 4] + body), req("r2", [1, 2, 3, 5] + body)]
    recs, _ = records(trace)
    assert classes(recs["r1"]) == {"cold": 12, "granularity": 4}
    assert classes(recs["r2"]) == {"cold": 4, "prompt_change": 8, "granularity": 4}
    assert recs["r2"].break_class == "cold" and recs["r2"].break_block == 0


def test_two_salts_are_isolation_and_the_same_salt_hits():
    """The same 16 tokens under salt a, then b, then no salt, then a again: b and no-salt find
    the prefix only under another salt (isolation 12 each); a again hits 12."""
    ids = list(range(300, 316))
    trace = [req("a", ids, salt="a"), req("b", ids, salt="b"), req("none", ids),
             req("a2", ids, salt="a")]
    for algo in ("sha256", "fast"):
        recs, res = records(trace, algo=algo)
        assert classes(recs["a"]) == {"cold": 12, "granularity": 4}
        assert classes(recs["b"]) == {"isolation": 12, "granularity": 4}
        assert classes(recs["none"]) == {"isolation": 12, "granularity": 4}
        assert classes(recs["a2"]) == {"hit": 12, "granularity": 4}
        assert recs["a"].scope == "salted" and recs["none"].scope == "none"
    # An unsalted first request makes a salted one isolation too.
    recs, _ = records([req("none", ids), req("b", ids, salt="b")])
    assert classes(recs["b"]) == {"isolation": 12, "granularity": 4}


def test_decode_blocks_of_a_known_reply_are_hit_by_the_next_turn_and_granularity_is_exact():
    """With output ids known (a chat trace's response_text), a turn's decode blocks are cached:
    turn 1 = 10 prompt + 6 output tokens leaves floor(15 / 4) = 3 keyed blocks; turn 2 re-sends
    the prompt, the reply and 5 more tokens (21 tokens, K = 5): hits 3 blocks (12), blocks 3-4
    are new (cold 8), granularity 21 - 20 = 1."""
    prompt, reply = list(range(10)), list(range(500, 506))
    t1 = TraceRequest("t1", 0.0, 10, prompt_token_ids=prompt, output_tokens=6,
                      output_token_ids=reply)
    t2 = req("t2", prompt + reply + [7, 7, 7, 7, 7])
    recs, _ = records([t1, t2])
    assert classes(recs["t1"]) == {"cold": 8, "granularity": 2}
    assert classes(recs["t2"]) == {"hit": 12, "cold": 8, "granularity": 1}


def test_recorded_router_and_group_totals():
    """The recorded router follows the trace's instance names (numbered in order of first
    appearance); totals group by model, instance, day and scope."""
    ids = list(range(16))
    trace = [req("x", ids, instance="pod-b"), req("y", ids, instance="pod-a", t=90000.0),
             req("z", ids, instance="pod-b", t=90001.0)]
    recs, res = records(trace, router="recorded", names=["pod-b", "pod-a"])
    assert [recs[k].instance for k in "xyz"] == ["pod-b", "pod-a", "pod-b"]
    assert classes(recs["y"]) == {"routing": 12, "granularity": 4}
    assert classes(recs["z"]) == {"hit": 12, "granularity": 4}
    groups = group_totals(recs.values(), ("instance", "day"))
    assert {k: (t.requests, t.hit, t.routing) for k, t in groups.items()} == {
        ("pod-b", 0): (1, 0, 0), ("pod-a", 1): (1, 0, 12), ("pod-b", 1): (1, 12, 0)}
    rows = totals_as_rows(group_totals(recs.values(), GROUP_BY), GROUP_BY)
    assert sum(r["prompt_tokens"] for r in rows) == 48
    with pytest.raises(ValueError, match="cannot group"):
        group_totals([], ("tenant",))


# -- properties ------------------------------------------------------------------------------

SEGMENTS = [list(range(k * 10, k * 10 + n)) for k, n in enumerate([4, 4, 6, 8, 3, 5, 12])]


@st.composite
def traces(draw):
    n = draw(st.integers(1, 14))
    out = []
    for k in range(n):
        segs = draw(st.lists(st.integers(0, len(SEGMENTS) - 1), min_size=1, max_size=5))
        ids = [t for s in segs for t in SEGMENTS[s]]
        salt = draw(st.sampled_from([None, None, "a", "b"]))
        conv = draw(st.sampled_from([None, "c1", "c2"]))
        out.append(req(f"r{k}", ids, t=float(k * 7), salt=salt, out=draw(st.integers(0, 6)),
                       conv=conv, instance=draw(st.sampled_from(["p", "q"]))))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), instances=st.integers(1, 3),
       router=st.sampled_from([r for r in ROUTERS if r != "recorded"]),
       cap=st.sampled_from([None, 12, 20, 40]), algo=st.sampled_from(["sha256", "fast"]))
def test_ledger_partitions_every_request(trace, instances, router, cap, algo):
    cfg = SimConfig(block_size=B, num_gpu_blocks=cap, hash_algo=algo)
    run = replay_fleet(trace, cfg, instances=instances, router=router,
                       params=RouterParams(seed=3, hash_blocks=1, load_window_s=20.0))
    recs = list(run)
    for r in recs:
        check_record(r)  # non-negative, sums to the prompt exactly
    res = run.result
    assert res.ledger.requests == len(recs) == len(trace) - res.rejected
    assert sum(res.ledger.as_dict()[c] for c in CLASSES) == res.ledger.prompt_tokens
    if instances == 1:
        assert res.ledger.routing == 0
    if cap is None:
        assert res.ledger.capacity == 0
    # Every instance's share adds up to the fleet's.
    assert sum(s.cached_tokens for s in res.instances) == res.ledger.hit


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), router=st.sampled_from(ROUTERS[:-1]),
       cap=st.sampled_from([None, 12, 20, 40]), algo=st.sampled_from(["sha256", "fast"]))
def test_one_instance_equals_replay_sim_per_request(trace, router, cap, algo):
    cfg = SimConfig(block_size=B, num_gpu_blocks=cap, hash_algo=algo)
    sim = {r.request_id: r.cached_tokens for r in simulate(trace, cfg)
           if r.rejected_reason is None}
    recs = {r.request_id: r.hit for r in replay_fleet(trace, cfg, instances=1, router=router)}
    assert recs == sim


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), instances=st.integers(2, 3))
def test_recorded_routing_places_requests_where_the_trace_says(trace, instances):
    names = ["p", "q"]
    cfg = SimConfig(block_size=B, hash_algo="fast")
    recs = list(replay_fleet(trace, cfg, instances=instances, router="recorded",
                             instance_names=names))
    assert [r.instance for r in recs] == [t.attrs["instance"] for t in trace]
