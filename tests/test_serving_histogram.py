"""TTFT from vLLM's histogram sums the increases stored at ingest grouped by ``le``
(``counter_increase_by_window(by=(..., "le"))``, migration 70's per-sample increase), and
equals the earlier per-query computation from the values (kept here as the reference) on a
scrape series with a restart through the real ingest path, and on the demo database
(:func:`check_demo`, run by tests/test_demo.py on the demo it builds once)."""

from __future__ import annotations

import math

import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries.metrics import counter_increase_by_window, increases_stored
from prefixscope.store.queries.serving import (
    TTFT_FAMILY,
    histogram_quantile,
    ttft_histogram_by_window,
)
from prefixscope.store.sqlhelpers import window_start_sql

from tests.conftest import DEMO_END_S as STORY_END  # the run's one demo build (tests/conftest.py)


def _reference(con, *, window_s: float, by: tuple[str, ...], start_s=None, end_s=None):
    """The per-query rule serving.py used before: bucket increases from the values (lag per
    series, a drop counts as the new value), summed per window, group and ``le``."""
    ws, wp = window_start_sql("ts_unix_s", window_s=window_s)
    group = "".join(f", {c}" for c in by)
    where, params = "", []
    if start_s is not None:
        where, params = " AND ts_unix_s >= ?", [float(start_s)]
    end, end_params = "", []
    if end_s is not None:
        end, end_params = " AND ts_unix_s < ?", [float(end_s)]
    rows = con.execute(f"""
        WITH base AS (
            SELECT run_id, labels, instance, model, engine, ts_unix_s, value,
                   json_extract_string(labels, '$.le') AS le
            FROM metric_samples WHERE metric = ? AND run_id = ''{end}
        ),
        steps AS (
            SELECT *, lag(value) OVER (PARTITION BY run_id, labels, instance
                                       ORDER BY ts_unix_s) AS prev
            FROM base
        )
        SELECT {ws} AS window_start_s{group}, le,
               sum(CASE WHEN value < prev THEN value ELSE value - prev END) AS increase
        FROM steps WHERE prev IS NOT NULL{where}
        GROUP BY ALL ORDER BY ALL
    """, [TTFT_FAMILY + "_bucket", *end_params, *wp, *params]).fetchall()
    out: dict[tuple, list] = {}
    for row in rows:
        le = row[1 + len(by)]
        bound = math.inf if le == "+Inf" else float(le)
        out.setdefault(tuple(row[:1 + len(by)]), []).append((bound, float(row[-1])))
    records = []
    for key, buckets in sorted(out.items(), key=lambda kv: tuple(str(k) for k in kv[0])):
        buckets.sort()
        if buckets[-1][1] <= 0:
            continue
        records.append((key, buckets[-1][1], histogram_quantile(buckets, 0.5),
                        histogram_quantile(buckets, 0.9)))
    return records


def _new(con, *, window_s: float, by: tuple[str, ...], start_s=None, end_s=None):
    df = ttft_histogram_by_window(con, start_s=start_s, end_s=end_s, window_s=window_s, by=by,
                                  run_ids=[""])
    df = df.astype(object).where(df.notna(), None)
    recs = [((r["window_start_s"], *[r[c] for c in by]), r["requests"], r["p50_s"], r["p90_s"])
            for r in df.to_dict("records")]
    return sorted(recs, key=lambda rec: tuple(str(k) for k in rec[0]))


def check_demo(db: str, *, window_s: float, by: tuple[str, ...]) -> None:
    """On the demo database (tests/test_demo.py builds it once): the stored-increase TTFT
    equals the reference, over the whole week and over a range cut inside it (the previous
    sample of the first window lies before the range)."""
    with store_db.reader(db) as con:
        assert increases_stored(con)
        new = _new(con, window_s=window_s, by=by)
        ref = _reference(con, window_s=window_s, by=by)
        cut = dict(start_s=STORY_END - 2.5 * 86400 + 123.0, end_s=STORY_END - 86400 + 7.0)
        new_cut = _new(con, window_s=window_s, by=by, **cut)
        ref_cut = _reference(con, window_s=window_s, by=by, **cut)
    assert len(new) >= 7 and new == ref
    assert 0 < len(new_cut) < len(new) and new_cut == ref_cut


def _exposition(counts: list[float], total: float) -> str:
    bounds = ["0.01", "0.1", "1.0", "+Inf"]
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for le, c in zip(bounds, counts, strict=True):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",'
                     f'model_name="m"}} {c}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {counts[-1]}')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {total}')
    return "\n".join(lines) + "\n"


def test_a_restart_counts_the_new_values(tmp_path):
    """Three scrapes in one hour, the engine restarted before the third (every bucket dropped):
    the increases are (second - first) + third, the new values counted from 0."""
    from prefixscope.ingest.exposition import ingest_exposition

    db = str(tmp_path / "restart.duckdb")
    scrapes = [([1, 4, 9, 10], 2.0), ([3, 10, 19, 20], 5.0), ([0, 2, 4, 4], 1.0)]
    with store_db.writer(db) as con:
        for i, (counts, total) in enumerate(scrapes):
            path = tmp_path / f"scrape{i}.txt"
            path.write_text(_exposition([float(c) for c in counts], total), encoding="utf-8")
            ingest_exposition(con, str(path), instance="gpu-0", at_unix_s=1_796_000_000.0 + 600 * i)
    with store_db.reader(db) as con:
        assert increases_stored(con)
        inc = counter_increase_by_window(con, metric=TTFT_FAMILY + "_bucket", window_s=86400.0,
                                         by=("le",), run_ids=[""])
        assert dict(zip(inc["le"], inc["increase"])) == {"0.01": 2.0, "0.1": 8.0, "1.0": 14.0,
                                                         "+Inf": 14.0}
        new = _new(con, window_s=86400.0, by=("model",))
        ref = _reference(con, window_s=86400.0, by=("model",))
    assert new == ref
    ((key, requests, p50, p90),) = new
    assert key[1] == "m" and requests == 14.0
    # 14 observations: rank 7 (p50) lies in (0.01, 0.1] (2 below, 8 up to its top), rank 12.6
    # (p90) in (0.1, 1.0]: Prometheus' linear interpolation inside the bucket
    assert p50 == pytest.approx(0.01 + 0.09 * (7 - 2) / (8 - 2))
    assert p90 == pytest.approx(0.1 + 0.9 * (12.6 - 8) / (14 - 8))


def test_le_grouping_is_checked():
    import duckdb

    from prefixscope.core.errors import InvalidArgument

    con = duckdb.connect()
    with pytest.raises(InvalidArgument, match="cannot group counters by 'labels'"):
        counter_increase_by_window(con, metric="x", by=("le", "labels"))
    with pytest.raises(InvalidArgument, match="repeated"):
        counter_increase_by_window(con, metric="x", by=("le", "le"))
