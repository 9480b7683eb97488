"""Property tests of the cache model (hypothesis): hits are block-aligned, at most n-1 tokens,
never shrink as the shared prefix grows; unbounded equals a large capacity; the pool's
invariants hold after any sequence of requests; fast keys give sha256's hits."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.replay.sim import simulate
from prefixscope.replay.types import ConcurrencyConfig, SimConfig, TraceRequest
from tests.replay_core_support import check_pool_invariants

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

block_sizes = st.sampled_from([1, 2, 4, 16])
# Small alphabets make shared prefixes likely.
prompts = st.lists(st.integers(0, 3), min_size=1, max_size=80)


def req(rid, toks, out=0, **kw):
    return TraceRequest(request_id=rid, arrival_s=0.0, num_prompt_tokens=len(toks),
                        prompt_token_ids=toks, output_tokens=out, **kw)


@SETTINGS
@given(bs=block_sizes, trace=st.lists(st.tuples(prompts, st.integers(0, 20)), min_size=1, max_size=12),
       blocks=st.one_of(st.none(), st.integers(2, 40)))
def test_hits_block_aligned_and_at_most_n_minus_1(bs, trace, blocks):
    cfg = SimConfig(block_size=bs, num_gpu_blocks=blocks)
    run = simulate([req(str(i), p, o) for i, (p, o) in enumerate(trace)], cfg)
    for r in run:
        if r.rejected_reason is None:
            assert r.cached_tokens % bs == 0
            assert r.cached_tokens <= r.prompt_tokens - 1
            assert r.cached_tokens <= (r.prompt_tokens - 1) // bs * bs
    check_pool_invariants(run.manager.block_pool)
    assert not run.manager.req_to_blocks  # every request freed


@SETTINGS
@given(bs=block_sizes, prefix=prompts, suffix_a=prompts, suffix_b=prompts, k=st.integers(0, 80))
def test_hit_never_shrinks_as_the_shared_prefix_grows(bs, prefix, suffix_a, suffix_b, k):
    """Request B shares the first m tokens of request A; B's hit is monotone in m."""
    a = prefix + suffix_a
    last = -1
    for m in range(0, min(k, len(a)) + 1):
        b = a[:m] + [9] + suffix_b  # 9 never occurs in a: the shared prefix is exactly m
        res = list(simulate([req("a", a), req("b", b)], SimConfig(block_size=bs)))
        hit = res[1].cached_tokens
        assert hit >= last
        assert hit == min(m // bs, (len(b) - 1) // bs, len(a) // bs) * bs
        last = hit


@SETTINGS
@given(bs=block_sizes, trace=st.lists(st.tuples(prompts, st.integers(0, 10)), min_size=1, max_size=15))
def test_unbounded_equals_large_capacity(bs, trace):
    reqs = [req(str(i), p, o) for i, (p, o) in enumerate(trace)]
    unb = [r.cached_tokens for r in simulate(reqs, SimConfig(block_size=bs))]
    big = [r.cached_tokens for r in simulate(reqs, SimConfig(block_size=bs, num_gpu_blocks=10_000))]
    assert unb == big


@SETTINGS
@given(bs=block_sizes, trace=st.lists(st.tuples(prompts, st.integers(0, 10), st.booleans(),
                                               st.sampled_from([None, "s1", "s2"])),
                                     min_size=1, max_size=12),
       blocks=st.integers(2, 30))
def test_fast_keys_give_the_same_hits_as_sha256(bs, trace, blocks):
    reqs = [req(str(i), p, o, skip_reading=s, cache_salt=salt)
            for i, (p, o, s, salt) in enumerate(trace)]
    cfg = SimConfig(block_size=bs, num_gpu_blocks=blocks)
    want = [(r.cached_tokens, r.rejected_reason) for r in simulate(reqs, cfg)]
    got = [(r.cached_tokens, r.rejected_reason) for r in simulate(reqs, replace(cfg, hash_algo="fast"))]
    assert want == got


@SETTINGS
@given(bs=st.sampled_from([2, 4, 16]),
       trace=st.lists(st.tuples(prompts, st.integers(0, 12), st.floats(0, 2)), min_size=1, max_size=12),
       blocks=st.integers(2, 40), seqs=st.integers(1, 4), budget=st.integers(4, 64))
def test_concurrent_model_invariants(bs, trace, blocks, seqs, budget):
    t, reqs = 0.0, []
    for i, (p, o, gap) in enumerate(trace):
        t += gap
        reqs.append(replace(req(str(i), p, o), arrival_s=t))
    cfg = SimConfig(block_size=bs, num_gpu_blocks=blocks,
                    concurrency=ConcurrencyConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                                                  step_time_s=0.1))
    run = simulate(reqs, cfg)
    res = list(run)
    assert sorted(r.request_id for r in res) == sorted(r.request_id for r in reqs)
    for r in res:
        if r.rejected_reason is None:
            assert r.cached_tokens % bs == 0 and r.cached_tokens < r.prompt_tokens
            assert r.finished_s >= r.admitted_s >= r.arrival_s - 1e-9
    check_pool_invariants(run.manager.block_pool)
    assert not run.manager.req_to_blocks
    assert run.stats.peak_running <= seqs
