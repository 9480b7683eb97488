"""The sidebar's "Newest data" when replay runs are newer than production (new-user check of
session 11: the demo said "2 min ago", from its replay runs, while the production data the
pages show by default was 20 h old). Real ingest path, AppTest."""

from __future__ import annotations

import json
import time

from prefixscope.core.formatting import fmt_time
from prefixscope.store import db as store_db
from prefixscope.store.queries import requests as rq
from tests import dashboard_support as ds


def test_the_sidebar_names_production_and_run_newest_apart(tmp_path, use_db):
    from prefixscope.ingest.usage import ingest_usage_file

    now = time.time()
    prod_ts, run_ts = now - 20 * 3600, now - 120
    src = tmp_path / "usage.jsonl"
    src.write_text("".join(json.dumps({
        "request_id": rid, "ts_unix_s": ts, "model": "m", "instance": "a", "run_id": run,
        "usage": {"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 1500}}})
        + "\n" for rid, ts, run in (("p1", prod_ts, ""), ("r1", run_ts, "replay-x"))))
    db = str(tmp_path / "runs.duckdb")
    with store_db.writer(db) as con:
        assert ingest_usage_file(con, src).rows_added == 2
        v = rq.request_filter_values(con)
        con.execute("CHECKPOINT")
    assert (v["max_ts_unix_s"], v["production_max_ts_unix_s"]) == (run_ts, prod_ts)
    at = ds.first_run(use_db(db))
    ds.assert_clean(at)
    captions = "\n".join(c.value for c in at.sidebar.caption)
    assert f"Newest production data: {fmt_time(prod_ts)} (" in captions, captions
    assert f"newest run: {fmt_time(run_ts)}" in captions, captions
