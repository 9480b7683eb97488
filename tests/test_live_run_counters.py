"""A live replay run's counters are its own before/after delta (issue 11, items 2 and 6).

Real capture: ``data/live-replay-sample/run`` (a live replay against vLLM 0.32 CPU; the server
had served 5,245 query tokens before the run). Before the fix ``hitrate --run`` printed 79.2%
(5,856 / 7,390: everything since the server started, through the before scrape's created-zero
sample) instead of the run's 71.6% (1,536 / 2,145)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "data" / "live-replay-sample" / "run"
RUN_ID = json.loads((RUN / "run.json").read_text())["run_id"]


def test_hitrate_of_a_live_run_is_its_own_delta(cli, db_path):
    code, _, err = cli(["ingest", "live-run", RUN, "--db", db_path])
    assert code == 0, err
    code, out, err = cli(["hitrate", "--db", db_path, "--run", RUN_ID, "--window", "1d",
                          "--json"])
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["hit_tokens"], r["query_tokens"]) for r in rows] == [(1536, 2145)]
    code, out, err = cli(["report", "--db", db_path, "--run", RUN_ID, "--source", "counters"])
    assert code == 0, err
    assert "1,536 of 2,145" in out and "5,856" not in out


def test_a_restart_during_the_run_still_counts_from_zero(con, tmp_path):
    """The after scrape of a server that restarted during the run: its created-zero lies inside
    the run and is kept, so the run counts the new process's tokens."""
    from prefixscope.ingest.exposition import ingest_exposition
    from prefixscope.store.queries.metrics import hit_rate_totals

    doc = json.loads((RUN / "run.json").read_text())
    after = (RUN / "metrics_after.prom").read_text()
    # the same exposition as if the process had started 1 s after the before scrape
    created = "1.7959660403388462e+09"
    assert created in after
    restarted = after.replace(created, repr(doc["before_ts_unix_s"] + 1.0))
    p = tmp_path / "after.prom"
    p.write_text(restarted)
    for path, ts in ((RUN / "metrics_before.prom", doc["before_ts_unix_s"]),
                     (p, doc["after_ts_unix_s"])):
        ingest_exposition(con, str(path), instance="srv", at_unix_s=ts, run_id="r",
                          since_unix_s=doc["before_ts_unix_s"])
    t = hit_rate_totals(con, by=(), run_ids=["r"]).iloc[0]
    assert t.query_tokens == 7390  # the new process's whole value: it started inside the run


def test_live_deltas_are_per_series_then_summed():
    """Item 6: a reset of one engine's series is not hidden by growth in another."""
    from prefixscope.replay.live_metrics import counter_deltas

    before = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000\n'
              'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 100\n')
    # engine 0 restarted (now 300), engine 1 grew by 900: per series 300 + 900
    after = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} 300\n'
             'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 1000\n')
    assert counter_deltas(before, after)["vllm:prefix_cache_queries_total"] == 1200


def test_live_deltas_of_the_real_run_match_its_requests():
    from prefixscope.replay.live_metrics import counter_deltas

    d = counter_deltas((RUN / "metrics_before.prom").read_text(),
                       (RUN / "metrics_after.prom").read_text())
    assert d["vllm:prefix_cache_queries_total"] == 2145
    assert d["vllm:prefix_cache_hits_total"] == 1536
    assert d["vllm:request_success_total"] == 10


@pytest.mark.parametrize("value", ["1000", "0"])
def test_a_series_absent_before_counts_nothing_unless_created_in_the_run(value):
    from prefixscope.replay.live_metrics import counter_deltas

    before = 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 10\n'
    after = (before.replace("10", "20") +
             f'vllm:prefix_cache_queries_total{{engine="1",model_name="m"}} {value}\n')
    assert counter_deltas(before, after)["vllm:prefix_cache_queries_total"] == 10
