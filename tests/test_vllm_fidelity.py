"""Concurrency: vLLM's own run-to-run spread next to the step-based scheduler model.

The chat traffic of test_vllm_exact.py (130 first turns + 20 follow-ups) is sent twice at 4 in
flight. vLLM is not reproducible request by request under concurrency (arrival order), so
the figures are: the model's aggregate error next to vLLM's spread, and per-request agreement
when the model is given the engine's arrival order. Numbers: docs/fidelity.md (run with
``PREFIXSCOPE_FIDELITY_REPORT=out/fidelity.jsonl ... -s`` to record them).
"""

from __future__ import annotations

import pytest

from tests.vllm_support import (
    ServerConfig,
    build_traffic,
    measure_concurrency,
    vllm_pool,  # noqa: F401  (fixture)
    write_fidelity_report,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2400)]


def test_concurrency_4_against_the_scheduler_model(vllm_pool, tmp_path):  # noqa: F811
    server = vllm_pool.get(ServerConfig())
    reqs = build_traffic(130, seed=7, followups=20, id_prefix="c")
    report = measure_concurrency(server, reqs, tmp_path, label="chat-unbounded-")
    write_fidelity_report(report)
    assert all(r["counters_settled"] for r in report["runs"])
    assert all(r["counter_hits"] == r["live_cached"] for r in report["runs"])
    # Targets of the issue: aggregate error inside vLLM's own spread (at least 0.5 % slack for
    # a run that happens to reproduce itself exactly), per-request agreement >= 99 %.
    assert report["aggregate_error_fraction"] <= max(report["spread_fraction"], 0.005)
    assert min(r["agreement"] for r in report["runs"]) >= 0.99
