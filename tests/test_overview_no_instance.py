"""Overview on a usage log stored without an instance (new user, session 11): the README's
``prefixscope ingest requests logs/usage.jsonl`` with no ``--instance`` and no instance in the
records stores NULL instances; with an empty window between two others the hit-rate line's
gap filler (``figures.with_gaps``) merged a float NaN key on an object column and the page
showed ``ValueError: You are trying to merge on float64 and object columns``. Real ingest
path, AppTest."""

from __future__ import annotations

import json
import time

import pandas as pd

from prefixscope.dashboard import figures
from prefixscope.store import db as store_db
from tests import dashboard_support as ds


def test_with_gaps_fills_windows_of_a_null_key_series():
    df = pd.DataFrame({"window_start_s": [0.0, 3600.0, 3 * 3600.0],
                       "instance": [None, None, None], "model": ["m", "m", "m"],
                       "hit_rate": [0.5, 0.6, 0.7]})
    out = figures.with_gaps(df, window_s=3600.0, keys=["model", "instance"])
    assert list(out.columns) == list(df.columns)
    assert out["window_start_s"].tolist() == [0.0, 3600.0, 7200.0, 10800.0]
    assert out["instance"].isna().all() and (out["model"] == "m").all()
    assert out["hit_rate"].isna().tolist() == [False, False, True, False]
    assert out["hit_rate"].dropna().tolist() == [0.5, 0.6, 0.7]


def test_overview_renders_usage_without_instance_with_an_empty_hour(tmp_path, use_db):
    from prefixscope.ingest.usage import ingest_usage_file

    now = time.time()
    lines = []
    for i, age_h in enumerate((1, 2, 3, 5)):  # no request 4 h ago: an empty hour
        for j in range(3):
            lines.append({"request_id": f"r{i}-{j}", "ts_unix_s": now - age_h * 3600 + j,
                          "model": "m",
                          "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                                    "prompt_tokens_details": {"cached_tokens": 64 * (j > 0)}}})
    src = tmp_path / "usage.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    db = str(tmp_path / "noinst.duckdb")
    with store_db.writer(db) as con:
        assert ingest_usage_file(con, src).rows_added == 12
        assert con.execute("SELECT count(*) FROM requests WHERE instance IS NULL").fetchone()[0] == 12
        con.execute("CHECKPOINT")
    at = ds.first_run(use_db(db))
    ds.assert_clean(at)
    assert any(k.startswith("m ·") for k in ds.metrics(at)), ds.metrics(at)
