"""The Requests page's latency panel by cached-share band (migration 78): the bands of the TTFT
panels (cold < 10%, partial, warm >= 80% of the prompt from the cache), not cached_tokens > 0;
the daily rollup by band gives the numbers of the raw rows; a database made at migration 77
(rollup by hit) gets the band rollup in place."""

from __future__ import annotations

import pandas as pd
import pytest

from prefixscope.ingest.usage import save_usage_rows
from prefixscope.store import db as store_db
from prefixscope.store import schema
from prefixscope.store.queries import requests as qr
from prefixscope.store.queries import serving
from tests.store_support import insert_requests_without_rollups, older_schema, request_row

DAY = 1_795_046_400.0  # a UTC midnight

#: (prompt, cached, ttft ms, the band by the TTFT panels' rule): the band edges exactly
CASES = [
    (1000, 0, 300.0, "cold"),
    (1000, 99, 310.0, "cold"),       # 9.9%
    (1000, 100, 200.0, "partial"),   # exactly 10%
    (1000, 799, 190.0, "partial"),   # 79.9%
    (1000, 800, 60.0, "warm"),       # exactly 80%
    (16, 16, 40.0, "warm"),
    (1000, 16, 280.0, "cold"),       # one block of a broken prefix: a "hit", but cold
    (0, 0, 5.0, None),               # no prompt tokens: no share, left out
    (None, 0, 7.0, None),            # no prompt count: left out
    (500, None, 9.0, None),          # cached tokens not reported: left out
]


def _rows(day_offset_s: float = 0.0, run_id: str = ""):
    return [request_row(run_id, f"r{i}-{day_offset_s:g}", DAY + day_offset_s + 60.0 * i,
                        prompt=p, cached=c, ttft=t, latency=t * 10)
            for i, (p, c, t, _band) in enumerate(CASES)]


def _expected() -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for _p, _c, t, band in CASES:
        if band is not None:
            out.setdefault(band, []).append(t)
    return out


def test_the_band_rule_is_the_ttft_panels_rule():
    assert schema.LATENCY_BAND_SQL == (f"CASE WHEN prompt_tokens > 0 THEN "
                                       f"({serving.ttft_band_sql()}) END")
    assert schema.LATENCY_BANDS == tuple(n for n, _ in serving.TTFT_BANDS)


def test_quantiles_by_band_match_the_rows_and_the_ttft_panel(con):
    save_usage_rows(con, _rows())
    assert qr.latency_rollup_current(con)
    exp = _expected()
    for kw in ({}, {"start_s": DAY, "end_s": DAY + 86400.0}, {"start_s": DAY + 30.0}):
        got = qr.request_latency_quantiles(con, column="ttft_ms", **kw)
        raw = qr.request_latency_quantiles(con, column="ttft_ms", rollup=False, **kw)
        exact = qr.request_latency_quantiles(con, column="ttft_ms", exact=True, **kw)
        pd.testing.assert_frame_equal(got, raw, check_dtype=False)
        assert got["band"].tolist() == exact["band"].tolist()
        assert got["requests"].tolist() == exact["requests"].tolist()
        assert got["max_ms"].tolist() == exact["max_ms"].tolist()
        for col in ("p25_ms", "p50_ms", "p75_ms"):
            for est, true in zip(got[col], exact[col]):
                assert abs(est - true) <= (qr.LATENCY_QUANTILE_ERROR + 1e-9) * true
    got = qr.request_latency_quantiles(con, column="ttft_ms")
    assert got["band"].tolist() == ["cold", "partial", "warm"]
    assert got["requests"].tolist() == [len(exp["cold"]), len(exp["partial"]), len(exp["warm"])]
    assert got[["min_ms", "max_ms"]].values.tolist() == [[min(v), max(v)] for v in exp.values()]
    exact = qr.request_latency_quantiles(con, column="ttft_ms", exact=True)
    assert exact["p50_ms"].tolist() == [pd.Series(exp[b]).quantile(0.5) for b in exp]
    # the TTFT panel of the same range: the same bands, counts and exact medians
    panel = serving.ttft_by_band_window(con, start_s=DAY, end_s=DAY + 86400.0, window_s=86400.0,
                                        by=())
    assert panel[["band", "requests", "p50_ms"]].values.tolist() == \
        exact[["band", "requests", "p50_ms"]].values.tolist()
    lat = qr.request_latency_quantiles(con, column="latency_ms")
    assert lat["min_ms"].tolist() == [10 * min(v) for v in exp.values()]


@pytest.fixture
def db_at_77(db_path, monkeypatch):
    with older_schema(db_path, monkeypatch, before=78) as con:
        store_db.migrate(con)
        insert_requests_without_rollups(con, _rows() + _rows(86400.0 * 2, run_id="run-a"))
        qr.rebuild_request_rollup(con)
        # migration 77's rollup, by hit, as the code of that time kept it
        con.execute(f"INSERT INTO latency_rollup_1d ({schema._LATENCY_ROLLUP_77_COLUMNS}) "
                    + schema._LATENCY_ROLLUP_77_SELECT_SQL.format(where="TRUE"))
        assert "hit" in [r[0] for r in con.execute("DESCRIBE latency_rollup_1d").fetchall()]
    return db_path


def test_migration_78_rebuilds_the_rollup_by_band(db_at_77):
    con = store_db.connect(db_at_77)
    try:
        assert store_db.migrate(con)[:1] == [78]  # and any later ones
        cols = [r[0] for r in con.execute("DESCRIBE latency_rollup_1d").fetchall()]
        assert "band" in cols and "hit" not in cols
        assert sorted(r[0] for r in con.execute(
            "SELECT DISTINCT band FROM latency_rollup_1d WHERE band IS NOT NULL").fetchall()) \
            == ["cold", "partial", "warm"]
        assert qr.latency_rollup_current(con)
        stored = con.execute("SELECT * FROM latency_rollup_1d ORDER BY ALL").fetchall()
        qr.rebuild_latency_rollup(con)
        assert con.execute("SELECT * FROM latency_rollup_1d ORDER BY ALL").fetchall() == stored
        for kw in ({}, {"run_ids": ["run-a"]}, {"start_s": DAY, "end_s": DAY + 86400.0 * 3}):
            pd.testing.assert_frame_equal(
                qr.request_latency_quantiles(con, column="ttft_ms", rollup=True, **kw),
                qr.request_latency_quantiles(con, column="ttft_ms", rollup=False, **kw),
                check_dtype=False)
        both = qr.request_latency_quantiles(con, column="ttft_ms")
        assert both["requests"].tolist() == [2 * len(v) for v in _expected().values()]
        # ingest after the migration keeps the band rollup current and exact
        save_usage_rows(con, _rows(86400.0 * 4, run_id="run-b"))
        assert qr.latency_rollup_current(con)
        stored = con.execute("SELECT * FROM latency_rollup_1d ORDER BY ALL").fetchall()
        qr.rebuild_latency_rollup(con)
        assert con.execute("SELECT * FROM latency_rollup_1d ORDER BY ALL").fetchall() == stored
    finally:
        con.close()
