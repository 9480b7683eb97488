"""CSV files people open in a spreadsheet: a cell starting with ``= + - @``, tab or CR is
written with a leading apostrophe (OWASP CSV injection), in ``prefixscope export --format csv``
(DuckDB COPY, real store file, real ingest path) and in the frames the dashboard downloads; the
Parquet export keeps the values as stored."""

from __future__ import annotations

import csv
import json

import duckdb
import pandas as pd

from prefixscope.core.formatting import FORMULA_STARTS, csv_cell, csv_safe_frame
from prefixscope.store import db as store_db
from tests.alerts_support import ingest_usage_lines, usage_line

HOSTILE = ["=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2+3", "@SUM(A1:A2)", "\tx", "\rx",
           "-1+cmd|' /C calc'!A0"]


def test_csv_cell_rule():
    assert FORMULA_STARTS == ("=", "+", "-", "@", "\t", "\r")
    assert [csv_cell(v) for v in HOSTILE] == ["'" + v for v in HOSTILE]
    # numbers, negative numbers as text (formatted table cells) and other text are kept
    kept = ("ok", "a=b", "", None, -5, 1.5, "'=x", "-1,234.50", "-3.5%", "-1e-05", "-7")
    assert [csv_cell(v) for v in kept] == list(kept)
    df = pd.DataFrame({"model": ["=cmd", "gpt-4o", None],
                       "tokens": [-1, 2, 3],
                       "name": pd.array(["@x", "y", None], dtype="string")})
    safe = csv_safe_frame(df)
    assert safe["model"].tolist()[:2] == ["'=cmd", "gpt-4o"] and pd.isna(safe["model"].iloc[2])
    assert safe["tokens"].tolist() == [-1, 2, 3]  # numbers are not text: untouched
    assert safe["name"].tolist()[:2] == ["'@x", "y"] and pd.isna(safe["name"].iloc[2])
    assert df["model"].iloc[0] == "=cmd"  # the caller's frame is not changed


def test_export_csv_neutralises_formulas_parquet_keeps_values(cli, tmp_path):
    """Ids and names starting with a formula character are stored as given and exported with a
    leading quote in CSV, as written in Parquet. An id starting with a tab or a CR is no id at
    all since the second attack on issue 27 (quarantined: no whitespace around an id), so the
    export sees the other five; ``csv_cell`` still neutralises both (test above)."""
    db = str(tmp_path / "store.duckdb")
    ids = [v for v in HOSTILE if not v[0].isspace()]
    lines = [usage_line(request_id=rid, ts_unix_s=1_767_225_600.0 + i, model=f"m{rid}",
                        prompt_tokens=100, cached_tokens=50)
             for i, rid in enumerate(HOSTILE + ["plain", "-42"])]
    with store_db.writer(db) as con:
        summary = ingest_usage_lines(con, tmp_path / "usage.jsonl", lines)
    assert (summary.rows_added, summary.rows_quarantined) == (7, 2), summary
    code, out, _ = cli(["export", "requests", "--format", "csv", "--out", tmp_path / "csv",
                        "--db", db, "--json"])
    assert code == 0 and json.loads(out)["exports"][0]["rows"] == 7
    with open(tmp_path / "csv" / "requests.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["request_id"] for r in rows) == \
        sorted(["'" + v for v in ids] + ["plain", "-42"])
    # not at the start of the cell: as stored
    assert sorted(r["model"] for r in rows) == \
        sorted(["m" + v for v in ids] + ["mplain", "m-42"])
    assert sorted(int(r["prompt_tokens"]) for r in rows) == [100] * 7
    code, out, _ = cli(["export", "requests", "--format", "parquet", "--out", tmp_path / "pq",
                        "--db", db, "--json"])
    assert code == 0
    got = duckdb.connect().execute(
        f"SELECT request_id FROM read_parquet('{tmp_path}/pq/requests/**/*.parquet')").fetchall()
    assert sorted(r for (r,) in got) == sorted(ids + ["plain", "-42"])


def test_dashboard_downloads_neutralise_formulas():
    """The dashboard's CSV download (the table as shown) follows the same rule as export."""
    import pandas as pd

    from prefixscope.dashboard.downloads import csv_bytes

    df = pd.DataFrame({"Model": ["=HYPERLINK(\"http://x\")", "+1+1", "@SUM(A1)", "tiny"],
                       "Requests": ["1,234", "-1,234.50", "0", "5"]})
    lines = csv_bytes(df).decode("utf-8").splitlines()
    assert lines[0] == "Model,Requests"
    assert lines[1].startswith("\"'=HYPERLINK(") and lines[2] == "'+1+1,\"-1,234.50\""
    assert lines[3] == "'@SUM(A1),0" and lines[4] == "tiny,5"
