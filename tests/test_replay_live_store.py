"""``prefixscope.store.queries.replay_live.save_live_run`` writes its ``runs`` row through the one writer,
``prefixscope.store.queries.replay.insert_run``: twice is the same as once."""

from __future__ import annotations

import json

from prefixscope.store.queries.replay_live import live_run_counters, save_live_run

Q = "vllm:prefix_cache_queries_total"
H = "vllm:prefix_cache_hits_total"


def _save(con, **kw):
    args = dict(run_id="live-1", label="first", created_unix_s=1795960000.0,
                params={"concurrency": 1, "trace": "t.jsonl"}, instance="127.0.0.1:8000",
                before={Q: 100.0, H: 10.0}, after={Q: 2245.0, H: 1546.0},
                deltas={Q: 2145.0, H: 1536.0}, before_ts_unix_s=1795960000.0,
                after_ts_unix_s=1795960100.0, settled=True)
    args.update(kw)
    return save_live_run(con, **args)


def test_twice_is_once(con):
    assert _save(con) == 2
    assert _save(con) == 2
    rows = con.execute("SELECT run_id, kind, label, created_unix_s, params_json, source_id "
                       "FROM runs").fetchall()
    assert rows == [("live-1", "replay-live", "first", 1795960000.0,
                     json.dumps({"concurrency": 1, "trace": "t.jsonl"}, sort_keys=True), None)]
    assert live_run_counters(con)["delta"].tolist() == [1536.0, 2145.0]


def test_existing_run_row_is_kept_and_counters_replaced(con):
    _save(con)
    _save(con, label="second", deltas={Q: 10.0})
    assert con.execute("SELECT label FROM runs").fetchall() == [("first",)]
    got = live_run_counters(con)
    assert got[["metric", "delta"]].values.tolist() == [[Q, 10.0]]


def test_a_failed_counter_write_leaves_no_run_row(con):
    import duckdb
    import pytest

    with pytest.raises(duckdb.ConstraintException):  # before_ts_unix_s is NOT NULL
        _save(con, before_ts_unix_s=None)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
