"""Published reuse figures reproduced through the real simulator (vLLM's counting rule).

Definitions (``docs/replay.md`` "Published figures"): every request is replayed in file order
through ``prefixscope.replay.sim.simulate`` with an unbounded cache and no simulated outputs, so a request
hits the longest run of its leading full blocks already cached, capped at
``floor((n - 1) / B)`` blocks (vLLM 0.33 ``KVCacheManager.get_computed_blocks``).

- token-weighted = Σ cached_tokens / Σ prompt_tokens;
- per-request mean = mean of cached / prompt over requests;
- 2nd half = token-weighted over the requests after the first ``floor(n / 2)``.
"""

from __future__ import annotations

import collections
import statistics

import pytest

from prefixscope.replay.sim import simulate
from prefixscope.replay.traces import read_trace
from prefixscope.replay.types import SimConfig
from tests.replay_io_support import KV_CACHE_TESTER, MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC


def _replay(path, *, block_size, fmt, algo="fast", limit=None):
    reqs = read_trace(path, format=fmt, block_size=block_size, output_tokens="0",
                      limit=limit).requests
    return list(simulate(reqs, SimConfig(block_size=block_size, hash_algo=algo,
                                         simulate_output=False)))


def _figures(results):
    tw = sum(r.cached_tokens for r in results) / sum(r.prompt_tokens for r in results)
    mean = statistics.fmean(r.cached_tokens / r.prompt_tokens for r in results)
    half = results[len(results) // 2:]
    second = sum(r.cached_tokens for r in half) / sum(r.prompt_tokens for r in half)
    return tw, mean, second


def test_mooncake_conversation_trace_unbounded_cache():
    res = _replay(MOONCAKE_CONVERSATION, block_size=512, fmt="mooncake")
    tw, mean, second = _figures(res)
    # vLLM rule at the trace's own 512-token blocks (data pack: 0.3734)
    assert tw == pytest.approx(0.3734, abs=5e-4)
    # the paper's "40%" is the per-request mean (0.4094 without the last-token cap) or the
    # 2nd half (0.3981); the vLLM rule moves both by less than 0.002
    assert mean == pytest.approx(0.408, abs=2e-3) and abs(mean - 0.40) < 0.03
    assert second == pytest.approx(0.398, abs=2e-3) and abs(second - 0.40) < 0.03
    assert sum(r.cached_tokens > 0 for r in res) / len(res) > 0.999


def test_mooncake_synthetic_trace_unbounded_cache():
    tw, _, _ = _figures(_replay(MOONCAKE_SYNTHETIC, block_size=512, fmt="mooncake"))
    assert tw == pytest.approx(0.6504, abs=5e-4)  # paper Table 2: 66%
    assert abs(tw - 0.66) < 0.03


def test_mooncake_conversation_trace_at_engine_block_16():
    # Each 512-token id expanded to tokens, replayed at vLLM's default block size: the reuse is
    # the leading-prefix figure (0.3736), the cap of one 16-token block costing almost nothing.
    tw, _, _ = _figures(_replay(MOONCAKE_CONVERSATION, block_size=16, fmt="mooncake"))
    assert tw == pytest.approx(0.3736, abs=5e-4)


def test_fast_keys_and_vllm_sha256_hashes_give_identical_hits():
    fast = _replay(MOONCAKE_CONVERSATION, block_size=16, fmt="mooncake", limit=120)
    sha = _replay(MOONCAKE_CONVERSATION, block_size=16, fmt="mooncake", algo="sha256", limit=120)
    assert [r.cached_tokens for r in fast] == [r.cached_tokens for r in sha]
    assert sum(r.cached_tokens for r in fast) > 0


def test_kv_cache_tester_per_conversation_hit_rates():
    res = _replay(KV_CACHE_TESTER, block_size=64, fmt="kv-cache-tester")
    per: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for r in res:
        if "subagent" in r.attrs:  # the published method leaves sub-agents out
            continue
        acc = per[r.attrs["conversation"]]
        acc[0] += r.cached_tokens
        acc[1] += r.prompt_tokens
    rates = sorted(c / p for c, p in per.values())
    assert len(rates) == 40
    # data pack, vLLM rule token-weighted per conversation: min 0.604, median 0.957,
    # mean 0.928, max 0.992; upstream README (739 traces): median 96%, mean 93%
    assert statistics.median(rates) == pytest.approx(0.957, abs=1e-3)
    assert statistics.fmean(rates) == pytest.approx(0.928, abs=1e-3)
    assert (round(rates[0], 3), round(rates[-1], 3)) == (0.604, 0.992)
    aggregate = sum(c for c, _ in per.values()) / sum(p for _, p in per.values())
    assert aggregate == pytest.approx(0.9638, abs=2e-4)
