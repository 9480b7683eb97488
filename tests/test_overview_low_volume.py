"""Overview's status beside a figure follows the alert rule's minimum volume (new-user check
of session 11: the KPI read "ALERT 336 of 700 tokens" while the daily strip called the same day
NO DATA, under `[alerts] min_query_tokens`, default 1,000). Real ingest path, AppTest."""

from __future__ import annotations

import json
import time

from prefixscope.store import db as store_db
from tests import dashboard_support as ds


def test_a_range_under_the_minimum_volume_reads_no_data_like_the_strip(tmp_path, use_db):
    from prefixscope.ingest.usage import ingest_usage_file

    now = time.time()
    src = tmp_path / "usage.jsonl"
    src.write_text("".join(json.dumps({
        "request_id": f"r{i}", "ts_unix_s": now - 3600 + i, "model": "m", "instance": "a",
        "usage": {"prompt_tokens": 100, "completion_tokens": 1,
                  "prompt_tokens_details": {"cached_tokens": 48}}}) + "\n" for i in range(7)))
    db = str(tmp_path / "low.duckdb")
    with store_db.writer(db) as con:
        assert ingest_usage_file(con, src).rows_added == 7
        con.execute("CHECKPOINT")
    at = ds.first_run(use_db(db))
    ds.assert_clean(at)
    md = "\n".join(ds.texts(at, "markdown"))
    assert (":gray-badge[NO DATA] (under the 1,000-token minimum) 336 of 700 tokens (usage log)"
            in md), md
    assert ":red-badge[ALERT] 336 of 700" not in md
