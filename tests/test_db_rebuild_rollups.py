"""``prefixscope db rebuild-rollups``: rows written with SQL leave the request, latency and
scope rollups stale (the pages read the raw rows); the command rebuilds them from the stored
rows in one transaction, after which the queries read the rollups and give the raw rows'
answers; ``--only-stale`` keeps the current ones."""

from __future__ import annotations

import json

import pandas as pd

from prefixscope.ingest.usage import save_usage_rows
from prefixscope.store import db as store_db
from prefixscope.store.queries import requests as qr
from prefixscope.store.queries.maintenance import rollup_states
from tests.store_support import insert_requests_without_rollups, request_row

DAY = 1_795_046_400.0  # a UTC midnight


def _db(tmp_path) -> str:
    path = str(tmp_path / "p.duckdb")
    with store_db.writer(path) as con:
        save_usage_rows(con, [request_row("", f"r{i}", DAY + 37.0 * i, prompt=1000,
                                          cached=(i * 97) % 1001, ttft=50.0 + i,
                                          latency=500.0 + 3 * i, scope="TENANT")
                              for i in range(200)])
        assert all(rollup_states(con).values())
        insert_requests_without_rollups(con, [
            request_row("", f"sql{i}", DAY + 86400.0 + 11.0 * i, prompt=800, cached=16 * i,
                        ttft=80.0 + 2 * i, latency=900.0 + i, scope="TENANT")
            for i in range(40)])
        states = rollup_states(con)
    assert states == {"request_rollup_1m": False, "latency_rollup_1d": False,
                      "counter_rollup_5m": True, "scope_rollup_5m": False}
    return path


def test_rebuild_rollups_makes_them_current_with_the_raw_answers(tmp_path, cli):
    db = _db(tmp_path)
    code, out, err = cli(["db", "rebuild-rollups", "--db", db, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    by = {r["table"]: r for r in doc["rollups"]}
    assert [r["table"] for r in doc["rollups"]] == ["request_rollup_1m", "latency_rollup_1d",
                                                     "counter_rollup_5m", "scope_rollup_5m"]
    assert all(r["current_after"] for r in doc["rollups"])
    assert not by["request_rollup_1m"]["current_before"]
    assert by["request_rollup_1m"]["rows_written"] > 0
    assert by["latency_rollup_1d"]["rows_written"] > 0
    with store_db.reader(db) as con:
        assert all(rollup_states(con).values())
        assert con.execute("SELECT sum(requests) FROM request_rollup_1m").fetchone()[0] == 240
        for column in ("ttft_ms", "latency_ms"):
            pd.testing.assert_frame_equal(
                qr.request_latency_quantiles(con, column=column, rollup=True),
                qr.request_latency_quantiles(con, column=column, rollup=False),
                check_dtype=False)


def test_only_stale_keeps_current_rollups_and_text_names_what_was_stale(tmp_path, cli):
    db = _db(tmp_path)
    code, out, err = cli(["db", "rebuild-rollups", "--db", db, "--only-stale"])
    assert code == 0, err
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert "kept (current)" in lines["counter_rollup_5m"]
    assert "rebuilt:" in lines["request_rollup_1m"] and "was stale" in lines["request_rollup_1m"]
    assert "rebuilt:" in lines["scope_rollup_5m"]
    code, out, err = cli(["db", "rebuild-rollups", "--db", db, "--only-stale", "--json"])
    assert code == 0, err
    assert [r["rows_written"] for r in json.loads(out)["rollups"]] == [None] * 4
