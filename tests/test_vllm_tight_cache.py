"""A real vLLM with a tight KV cache (96 blocks of 32 tokens, max-model-len 1024): eviction.

Sequentially every request must still be exact (LRU eviction and free-queue order as vLLM 0.32);
at 4 in flight, which freed blocks survive until a later admission depends on the interleaving
of engine steps and client sends, so the per-request figures are reported next to vLLM's own
run-to-run spread (docs/fidelity.md).
"""

from __future__ import annotations

import pytest

from tests.vllm_support import (
    ServerConfig,
    build_traffic,
    live_config,
    measure_concurrency,
    mismatches,
    simulate_like,
    vllm_pool,  # noqa: F401  (fixture)
    write_fidelity_report,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2400)]

# max-model-len 1024 needs >= 33 blocks (32 + the null block): 96 hold about 3 requests.
TIGHT = ServerConfig(max_model_len=1024, num_gpu_blocks_override=96)
SHORT = dict(max_prompt_tokens=900, max_system_chars=1600, max_doc_chars=900)


@pytest.fixture(scope="module")
def server(vllm_pool):  # noqa: F811
    return vllm_pool.get(TIGHT)


def test_sequential_with_forced_eviction_is_exact(server, tmp_path):
    from prefixscope.replay.live_run import run_live

    assert server.num_gpu_blocks() == 96
    reqs = build_traffic(70, seed=5, salted=True, followups=20, **SHORT)
    assert max(r.num_prompt_tokens for r in reqs) <= 900
    server.reset_prefix_cache()
    summary, results = run_live(reqs, live_config(server), tmp_path / "run")
    assert summary.failed == 0
    sim = simulate_like(server, results, order=[r.request_id for r in reqs])
    assert mismatches(results, sim) == []
    assert summary.settled
    assert summary.deltas["vllm:prefix_cache_queries_total"] == summary.prompt_tokens
    assert summary.deltas["vllm:prefix_cache_hits_total"] == summary.cached_tokens
    assert 0 < summary.cached_tokens < summary.prompt_tokens
    # the traffic needs far more than 95 blocks: eviction happened
    assert sum(-(-(r.prompt_tokens + r.completion_tokens) // 32) for r in results) > 10 * 95


def test_concurrency_4_with_eviction(server, tmp_path):
    reqs = build_traffic(130, seed=9, salted=True, followups=21, id_prefix="e", **SHORT)
    report = measure_concurrency(server, reqs, tmp_path, label="chat-96-blocks-")
    write_fidelity_report(report)
    assert all(r["counters_settled"] and r["counter_hits"] == r["live_cached"]
               for r in report["runs"])
    # Weaker than the unbounded case (docs/fidelity.md explains the misses).
    assert report["aggregate_error_fraction"] <= max(report["spread_fraction"], 0.02)
    assert min(r["agreement"] for r in report["runs"]) >= 0.95
    # On its own recorded timeline the cache model is at 99.3-100 % on the saved captures
    # (tests/test_fidelity_step_fit.py). A live run's timeline is the client's clock, whose ends
    # inside a bunch are not the engine's order: live runs measured 99.3 % / 99.3 % (2026-12-01)
    # and 96.7 % / 99.3 % (2026-12-02, five requests of one bunch in run 0) and 96.7 % / 97.4 %
    # (2026-12-07, a loaded machine; docs/fidelity.md): here requests wait for blocks, which the
    # observed clock does not model yet (issue 31, whose target is 99 %).
    observed = [r["agreement_observed_clock"] for r in report["runs"]]
    assert min(observed) >= 0.95, observed
