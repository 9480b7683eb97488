"""``prefixscope.replay.sim.simulate``: sequential replay (exact), counting, rejection, fast keys, the
step-based scheduler model, streaming memory, and the Mooncake reuse figures."""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import replace

import pytest

from prefixscope.core.errors import SimulationError
from prefixscope.replay.sim import SimRun, SimSummary, simulate
from prefixscope.replay.types import ConcurrencyConfig, RequestResult, SimConfig, TraceRequest
from tests.replay_core_support import mooncake_path, mooncake_requests


def tr(rid, tokens, *, out=0, arrival=0.0, **kw) -> TraceRequest:
    return TraceRequest(request_id=rid, arrival_s=arrival, num_prompt_tokens=len(tokens),
                        prompt_token_ids=tokens, output_tokens=out, **kw)


def hits(results):
    return [r.cached_tokens for r in results]


# -- sequential ---------------------------------------------------------------------------------
def test_seventeen_tokens_twice_gives_sixteen_cached():
    cfg = SimConfig(block_size=16, num_gpu_blocks=64)
    res = list(simulate([tr("a", list(range(17))), tr("b", list(range(17)))], cfg))
    assert hits(res) == [0, 16]
    assert [r.created_cache_tokens for r in res] == [16, 0]


def test_sequential_results_in_trace_order_with_times():
    cfg = SimConfig(block_size=16)
    res = list(simulate([tr("a", list(range(40)), arrival=1.0), tr("b", list(range(40)), arrival=2.5)], cfg))
    assert [r.request_id for r in res] == ["a", "b"]
    assert [(r.admitted_s, r.finished_s) for r in res] == [(1.0, 1.0), (2.5, 2.5)]


def test_decode_blocks_are_cached_floor_p_plus_o_minus_1():
    # P=40, O=30, B=16: the finished request leaves floor((40+30-1)/16) = 4 cached blocks.
    run = simulate([tr("a", list(range(40)), out=30)], SimConfig(block_size=16, num_gpu_blocks=20))
    list(run)
    assert run.manager.block_pool.num_cached_blocks == 4
    # O=25: floor(64/16) = 4; O=24: floor(63/16) = 3 (the last sampled token is never fed back).
    for out, cached in ((25, 4), (24, 3), (1, 2), (0, 2)):
        run = simulate([tr("a", list(range(40)), out=out)], SimConfig(block_size=16, num_gpu_blocks=20))
        list(run)
        assert run.manager.block_pool.num_cached_blocks == cached, out


def test_output_tokens_push_prefixes_out_of_the_cache():
    a = list(range(64))
    b = list(range(1000, 1064))
    # 8 usable blocks: a (4 blocks) then b (4 blocks) fit; with 64 outputs b also fills 4
    # decode blocks and evicts a's prefix.
    seq = [tr("a1", a), tr("b", b, out=65), tr("a2", a)]
    no_out = list(simulate(seq, SimConfig(block_size=16, num_gpu_blocks=9, simulate_output=False)))
    with_out = list(simulate(seq, SimConfig(block_size=16, num_gpu_blocks=9)))
    assert hits(no_out) == [0, 0, 48]
    assert hits(with_out) == [0, 0, 0]
    assert with_out[1].completion_tokens == 65 and no_out[1].completion_tokens == 0


def test_skip_reading_requests_write_but_are_not_counted():
    t = list(range(48))
    res = list(simulate([tr("p", t, skip_reading=True), tr("q", t), tr("r", t, skip_reading=True)],
                        SimConfig(block_size=16)))
    assert hits(res) == [0, 32, 0]
    assert [r.counted for r in res] == [False, True, False]
    s = SimSummary.from_results(res, SimConfig(block_size=16))
    assert (s.prompt_tokens, s.cached_tokens, s.counted_requests) == (48, 32, 1)
    assert s.all_prompt_tokens == 144


def test_caching_disabled_counts_nothing():
    t = list(range(48))
    run = simulate([tr("a", t), tr("b", t)], SimConfig(block_size=16, enable_prefix_caching=False))
    res = list(run)
    assert hits(res) == [0, 0] and not any(r.counted for r in res)
    s = run.summary()
    assert s.hit_rate is None and s.prompt_tokens == 0 and s.evicted_blocks == 0


def test_salt_and_lora_in_simulation():
    t = list(range(64))
    res = list(simulate([
        tr("1", t), tr("2", t, cache_salt="A"), tr("3", t, cache_salt="A"), tr("4", t, cache_salt="B"),
        tr("5", t), tr("6", t, lora_name="x", lora_path="/p"), tr("7", t, lora_name="x", lora_path="/q"),
        tr("8", t, lora_name="x", lora_path="/p"),
    ], SimConfig(block_size=16)))
    assert hits(res) == [0, 0, 48, 0, 48, 0, 0, 48]


def test_request_longer_than_the_cache_is_rejected_and_reported():
    cfg = SimConfig(block_size=16, num_gpu_blocks=5)  # 4 usable blocks = 64 tokens
    run = simulate([tr("ok", list(range(64))), tr("big", list(range(65))),
                    tr("outs", list(range(60)), out=6), tr("ok2", list(range(64)))], cfg)
    res = list(run)
    assert [r.rejected_reason is None for r in res] == [True, False, False, True]
    assert "needs 5 blocks" in res[1].rejected_reason and "holds 4" in res[1].rejected_reason
    assert res[3].cached_tokens == 48
    s = run.summary()
    assert s.rejected_requests == 2 and s.requests == 4 and s.counted_requests == 2
    assert [i for i, _ in s.rejected] == ["big", "outs"]
    assert s.as_dict()["rejected"][0]["request_id"] == "big"


def test_max_model_len_rejects_and_caps_outputs():
    cfg = SimConfig(block_size=16, max_model_len=50)
    res = list(simulate([tr("a", list(range(50))), tr("b", list(range(40)), out=20)], cfg))
    assert "max_model_len" in res[0].rejected_reason
    assert res[1].completion_tokens == 10


def test_fast_algo_equals_sha256_and_block_keys_equal_tokens():
    path = mooncake_path()
    for bs, blocks in ((16, 1500), (32, 400)):
        base = SimConfig(block_size=bs, num_gpu_blocks=blocks)
        want = hits(simulate(mooncake_requests(path, 0, 150, block_size=bs), base))
        fast_tok = hits(simulate(mooncake_requests(path, 0, 150, block_size=bs),
                                 replace(base, hash_algo="fast")))
        fast_key = hits(simulate(mooncake_requests(path, 0, 150, block_size=bs, mode="keys"),
                                 replace(base, hash_algo="fast")))
        assert want == fast_tok == fast_key
        assert sum(want) > 0


def test_vllm_algo_without_token_ids_is_an_error():
    req = TraceRequest("k", 0.0, 32, block_keys=[1, 2])
    with pytest.raises(SimulationError, match="token ids"):
        list(simulate([req], SimConfig(block_size=16)))
    with pytest.raises(SimulationError, match="block keys"):
        list(simulate([TraceRequest("k", 0.0, 32, block_keys=[1])], SimConfig(block_size=16, hash_algo="fast")))


def test_bad_config_is_an_error():
    with pytest.raises(SimulationError):
        simulate([], SimConfig(hash_algo="md5"))
    with pytest.raises(SimulationError):
        simulate([], SimConfig(num_gpu_blocks=1))


def test_unbounded_equals_large_capacity_on_mooncake():
    path = mooncake_path()
    reqs = lambda: mooncake_requests(path, 0, 300, block_size=16, mode="keys")  # noqa: E731
    unb = hits(simulate(reqs(), SimConfig(block_size=16, hash_algo="fast")))
    big = hits(simulate(reqs(), SimConfig(block_size=16, hash_algo="fast", num_gpu_blocks=10**6)))
    assert unb == big


def test_summary_from_run_and_from_list_agree():
    cfg = SimConfig(block_size=16, num_gpu_blocks=40)
    reqs = [tr(str(i), list(range(i % 3, 50 + i % 3)), out=5) for i in range(12)]
    run = simulate(reqs, cfg)
    s_run = SimSummary.from_results(run, cfg)
    s_list = SimSummary.from_results(list(simulate(reqs, cfg)), cfg)
    assert (s_run.prompt_tokens, s_run.cached_tokens, s_run.hit_rate) == \
        (s_list.prompt_tokens, s_list.cached_tokens, s_list.hit_rate)
    assert s_list.evicted_blocks is None and s_run.evicted_blocks is not None
    assert set(s_run.as_dict()) >= {"requests", "prompt_tokens", "cached_tokens", "hit_rate",
                                    "counted_requests", "rejected_requests", "num_preemptions",
                                    "evicted_blocks"}


def test_simulate_is_lazy_and_memory_is_bounded_by_capacity():
    """Peak traced memory grows with the cache, not with the number of requests."""
    def gen(n):
        for i in range(n):
            yield TraceRequest(str(i), float(i), 512, prompt_token_ids=[i * 1000 + k for k in range(512)],
                               output_tokens=8)

    def peak(n):
        gc.collect()
        tracemalloc.start()
        run = simulate(gen(n), SimConfig(block_size=16, num_gpu_blocks=400, hash_algo="fast"))
        for _ in run:
            pass
        _, pk = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return pk

    small, large = peak(200), peak(2000)
    assert large < small * 1.3, (small, large)
    # Laziness: pulling one result reads only what it needs from the trace.
    pulled = []

    def tracking():
        for r in gen(10**9):
            pulled.append(r.request_id)
            yield r

    run = simulate(tracking(), SimConfig(block_size=16))
    next(run)
    next(run)
    assert len(pulled) == 2


# -- the step-based scheduler model -----------------------------------------------------------
def conc(**kw) -> ConcurrencyConfig:
    base = dict(max_num_seqs=8, max_num_batched_tokens=256, step_time_s=0.01)
    base.update(kw)
    return ConcurrencyConfig(**base)


def test_concurrent_blocks_cached_at_scheduling_time_same_step_hit():
    # Two identical prompts arriving together: the second is admitted in the same step and
    # already hits the blocks the first registered when it was scheduled.
    t = list(range(64))
    cfg = SimConfig(block_size=16, num_gpu_blocks=50, concurrency=conc())
    res = list(simulate([tr("a", t, out=2), tr("b", t, out=2)], cfg))
    by_id = {r.request_id: r for r in res}
    assert by_id["a"].cached_tokens == 0 and by_id["b"].cached_tokens == 48
    assert by_id["a"].admitted_s == by_id["b"].admitted_s == 0.0


def test_concurrent_chunked_prefill_registers_only_scheduled_chunks():
    # Budget 32 tokens/step: "a" (64 tokens) prefills in two chunks (steps at t=0 and t=1),
    # registering 2 blocks per chunk. "b" arrives at 0.5 but the budget of step 1 goes to a's
    # second chunk (running requests first); at t=2 b hits a's blocks (capped at 3 of 4).
    t = list(range(64))
    cfg = SimConfig(block_size=16, num_gpu_blocks=50,
                    concurrency=conc(max_num_batched_tokens=32, step_time_s=1.0))
    res = {r.request_id: r for r in simulate([tr("a", t, out=1), tr("b", t, out=1, arrival=0.5)], cfg)}
    assert res["a"].finished_s == 2.0  # steps at t=0 and t=1
    assert res["b"].cached_tokens == 48


def test_concurrent_results_in_completion_order():
    cfg = SimConfig(block_size=16, num_gpu_blocks=100, concurrency=conc())
    res = list(simulate([tr("long", list(range(40)), out=10), tr("short", list(range(100, 140)), out=1)], cfg))
    assert [r.request_id for r in res] == ["short", "long"]
    assert res[0].finished_s < res[1].finished_s


def test_concurrent_head_of_line_blocking_and_max_num_seqs():
    cfg = SimConfig(block_size=16, num_gpu_blocks=100, concurrency=conc(max_num_seqs=1))
    res = list(simulate([tr(str(i), list(range(i * 100, i * 100 + 20)), out=3) for i in range(3)], cfg))
    assert [r.request_id for r in res] == ["0", "1", "2"]
    # One at a time: each is admitted when the previous finished.
    assert res[1].admitted_s >= res[0].finished_s and res[2].admitted_s >= res[1].finished_s


def test_concurrent_preemption_of_most_recently_admitted():
    # 6 usable blocks of 16 tokens. a and b (32-token prompts, 2 blocks each) run together;
    # as they decode they need more blocks and b (admitted last) is preempted.
    cfg = SimConfig(block_size=16, num_gpu_blocks=7, concurrency=conc())
    run = simulate([tr("a", list(range(32)), out=40), tr("b", list(range(100, 132)), out=40)], cfg)
    res = {r.request_id: r for r in run}
    assert res["b"].num_preemptions >= 1 and res["a"].num_preemptions == 0
    s = run.summary()
    assert s.num_preemptions == res["b"].num_preemptions
    # Preempted resumes are not counted again: queries are each prompt once.
    assert s.prompt_tokens == 64 and s.counted_requests == 2
    assert res["b"].cached_tokens == 0  # fixed at its first admission


def test_concurrent_idle_engine_jumps_to_next_arrival():
    cfg = SimConfig(block_size=16, num_gpu_blocks=100, concurrency=conc(step_time_s=0.5))
    res = list(simulate([tr("a", list(range(20)), out=1, arrival=0.0),
                         tr("b", list(range(20)), out=1, arrival=100.0)], cfg))
    assert res[1].admitted_s == 100.0 and res[1].finished_s == 100.5
    assert res[1].cached_tokens == 16


def test_concurrent_sequential_spacing_equals_sequential_replay():
    """Requests spaced far apart never overlap: the step model gives the sequential hits."""
    path = mooncake_path()
    reqs = list(mooncake_requests(path, 0, 120, block_size=16, mode="keys"))
    spaced = [replace(r, arrival_s=i * 1e6) for i, r in enumerate(reqs)]
    base = SimConfig(block_size=16, num_gpu_blocks=3000, hash_algo="fast")
    seq = {r.request_id: r.cached_tokens for r in simulate(spaced, base)}
    cc = {r.request_id: r.cached_tokens
          for r in simulate(spaced, replace(base, concurrency=conc(max_num_batched_tokens=2048)))}
    assert seq == cc


def test_concurrent_rejected_requests_are_reported():
    cfg = SimConfig(block_size=16, num_gpu_blocks=3, concurrency=conc())
    res = list(simulate([tr("big", list(range(100))), tr("ok", list(range(20)), out=1)], cfg))
    assert {r.request_id: r.rejected_reason is not None for r in res} == {"big": True, "ok": False}


def test_concurrent_without_chunked_prefill_waits_for_budget():
    cfg = SimConfig(block_size=16, num_gpu_blocks=100,
                    concurrency=conc(max_num_batched_tokens=64, enable_chunked_prefill=False))
    res = {r.request_id: r for r in simulate([tr("a", list(range(60)), out=3),
                                              tr("b", list(range(200, 260)), out=3)], cfg)}
    # Step 0: a takes 60 of 64 tokens; b needs 60 > 4 left and, unchunked, waits.
    # Step 1: a decodes 1 token; b's 60 fit the remaining 63.
    assert res["a"].admitted_s == 0.0 and res["b"].admitted_s == pytest.approx(0.01)


def test_concurrent_on_mooncake_slice_runs_and_counts_each_request_once():
    path = mooncake_path()
    cfg = SimConfig(block_size=16, num_gpu_blocks=4000, hash_algo="fast",
                    concurrency=ConcurrencyConfig(max_num_seqs=16, max_num_batched_tokens=4096,
                                                  step_time_s=0.05))
    run = simulate(mooncake_requests(path, 0, 200, block_size=16, mode="keys"), cfg)
    res = list(run)
    assert len(res) == 200 and all(isinstance(r, RequestResult) for r in res)
    s = run.summary()
    assert s.counted_requests + s.rejected_requests == 200
    assert s.prompt_tokens == sum(r.prompt_tokens for r in res if r.counted)
    assert run.stats.peak_running <= 16
    assert all(r.cached_tokens % 16 == 0 for r in res)


def test_simrun_is_an_iterator():
    run = simulate([], SimConfig())
    assert isinstance(run, SimRun) and iter(run) is run and list(run) == []
    assert run.summary().requests == 0


# -- published reuse figures --------------------------------------------------------------------
@pytest.mark.parametrize("name,bs,expect", [
    ("conversation_trace.jsonl", 512, 0.3734),  # "vLLM rule, tokens" in the data pack README
    ("synthetic_trace.jsonl", 512, 0.6504),
])
def test_mooncake_unbounded_vllm_rule_reuse(name, bs, expect):
    run = simulate(mooncake_requests(mooncake_path(name), block_size=bs, mode="keys", outputs=False),
                   SimConfig(block_size=bs, hash_algo="fast", simulate_output=False))
    s = SimSummary.from_results(run, run.config)
    assert round(s.hit_rate, 4) == expect
