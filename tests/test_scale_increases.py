"""Counter increases stored at ingest (issue 17 item 2, migration 70) and their 5-minute rollup
(item 3, migration 72): both give exactly the rows the window-function SQL computes from the
values, whatever the order the samples arrive in (resets, also inside a rollup bucket,
out-of-order samples, repeats, gaps, created-zero samples), and a database made before
migration 70 is migrated in place."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.store import db as store_db
from prefixscope.store.queries.metrics import (
    counter_increase_by_window,
    counter_rollup_current,
    hit_rate_by_window,
    hit_rate_totals,
    increases_stored,
    insert_metric_samples,
    recompute_increases,
)
from tests.store_support import older_schema

Q = "vllm:prefix_cache_queries_total"
H = "vllm:prefix_cache_hits_total"
X = "vllm:external_prefix_cache_hits_total"
T0 = 1_795_000_000.0


def _row(metric, instance, model, t, v, *, created_zero=False):
    labels = json.dumps({"engine": "0", "model_name": model}, separators=(",", ":"))
    return (metric, labels, instance, model, "0", float(t), float(v), metric, False, created_zero,
            "test")


def _stored_columns(con):
    return con.execute("SELECT run_id, metric, labels, instance, ts_unix_s, has_prev, increase, "
                       "is_reset, prev_ts_unix_s FROM metric_samples ORDER BY ALL").fetchall()


def _same(con, **kw):
    """Every counter query gives the same frame from the rollup, from stored and from computed
    increases."""
    for fn, extra in ((hit_rate_by_window, {"window_s": 300.0, "by": ("model", "instance")}),
                      (hit_rate_by_window, {"window_s": 3600.0, "by": ()}),
                      (hit_rate_totals, {"by": ("model",)}),
                      (counter_increase_by_window, {"metric": X, "window_s": 600.0,
                                                    "by": ("instance",)})):
        a = fn(con, stored=True, rollup=True, **extra, **kw)
        b = fn(con, stored=True, rollup=False, **extra, **kw)
        c = fn(con, stored=False, **extra, **kw)
        pd.testing.assert_frame_equal(a, c, check_dtype=False)
        pd.testing.assert_frame_equal(b, c, check_dtype=False)


# A series: a list of (dt, increment, reset) steps; the value counts up by increment and drops
# to the increment at a reset (a restart).
_steps = st.lists(st.tuples(st.integers(1, 400), st.integers(0, 5000), st.booleans()),
                  min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(series=st.lists(_steps, min_size=1, max_size=4), data=st.data())
def test_stored_increases_equal_computed_in_any_arrival_order(series, data):
    con = store_db.memory()
    try:
        rows = []
        for k, steps in enumerate(series):
            inst, model = f"i{k % 3}", f"m{k % 2}"
            t, q, h = T0 + k * 7, 0, 0
            if data.draw(st.booleans(), label="created zero"):
                rows += [_row(Q, inst, model, t - 5, 0, created_zero=True),
                         _row(H, inst, model, t - 5, 0, created_zero=True)]
            for dt, inc, reset in steps:  # restarts fall inside 5-minute buckets too
                t += dt
                q = inc if reset else q + inc
                h = inc // 2 if reset else h + inc // 2
                rows += [_row(Q, inst, model, t, q), _row(H, inst, model, t, h),
                         _row(X, inst, model, t, q // 7)]
        order = data.draw(st.permutations(range(len(rows))), label="arrival order")
        cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=5), label="batches"))
        bounds = [0, *cuts, len(rows)]
        for lo, hi in zip(bounds, bounds[1:]):
            batch = [rows[i] for i in order[lo:hi]]
            if batch and data.draw(st.booleans(), label="repeat a row"):
                batch.append(batch[0])  # a repeat inside a batch and of a stored row
            insert_metric_samples(con, batch)
        assert increases_stored(con) and counter_rollup_current(con)
        got = _stored_columns(con)
        rolled = con.execute("SELECT * FROM counter_rollup_5m ORDER BY ALL").fetchall()
        recompute_increases(con)
        assert _stored_columns(con) == got  # = computed over each whole series at once
        assert con.execute("SELECT * FROM counter_rollup_5m ORDER BY ALL").fetchall() == rolled
        span = max(r[5] for r in rows) - T0 + 10
        start = T0 + data.draw(st.floats(-50, span), label="start")
        end = start + data.draw(st.floats(1, span + 100), label="length")
        _same(con)
        _same(con, start_s=start, end_s=end)
        _same(con, start_s=start, models=["m1"], run_ids=[""])
        _same(con, end_s=T0 - 1e6)  # a range with no data
        _same(con, start_s=T0 + 200, end_s=T0 + 1100)  # whole 5-minute buckets (T0 % 300 = 100)
    finally:
        con.close()


def test_a_late_sample_recomputes_its_successor(con):
    insert_metric_samples(con, [_row(Q, "a", "m", T0, 100), _row(Q, "a", "m", T0 + 30, 400)])
    insert_metric_samples(con, [_row(Q, "a", "m", T0 + 15, 250)])  # arrives last
    inc = con.execute("SELECT ts_unix_s - ?, has_prev, increase, prev_ts_unix_s - ? "
                      "FROM metric_samples ORDER BY ts_unix_s", [T0, T0]).fetchall()
    assert inc == [(0.0, False, None, None), (15.0, True, 150.0, 0.0), (30.0, True, 150.0, 15.0)]
    # a sample older than the first: the old first sample now has a predecessor (a drop: reset)
    insert_metric_samples(con, [_row(Q, "a", "m", T0 - 15, 120)])
    first = con.execute("SELECT has_prev, increase, is_reset FROM metric_samples "
                        "WHERE ts_unix_s = ?", [T0]).fetchone()
    assert first == (True, 100.0, True)
    assert con.execute("SELECT ts_unix_s - ?, value FROM metric_series_head", [T0]).fetchall() == [
        (30.0, 400.0)]


def test_a_single_sample_has_no_increase_and_no_data(con):
    insert_metric_samples(con, [_row(Q, "a", "solo", T0, 100), _row(H, "a", "solo", T0, 10)])
    assert hit_rate_totals(con).empty
    assert hit_rate_by_window(con, window_s=60).empty
    _same(con)


def test_direct_sql_rows_fall_back_to_computed_increases(con):
    insert_metric_samples(con, [_row(Q, "a", "m", T0, 100), _row(H, "a", "m", T0, 10)])
    con.execute("INSERT INTO metric_samples (metric, labels, instance, model, engine, ts_unix_s, "
                "value, raw_metric, source_id) SELECT metric, labels, instance, model, engine, "
                "ts_unix_s + 60, value * 3, raw_metric, 'sql' FROM metric_samples")
    assert not increases_stored(con)
    t = hit_rate_totals(con, by=()).iloc[0]
    assert (t.hit_tokens, t.query_tokens) == (20, 200)
    recompute_increases(con)
    assert increases_stored(con)
    t = hit_rate_totals(con, by=()).iloc[0]
    assert (t.hit_tokens, t.query_tokens) == (20, 200)


@pytest.fixture
def db_at_60(db_path, monkeypatch):
    """A database at the migrations before 70 with samples written by that code."""
    with older_schema(db_path, monkeypatch, before=70) as con:
        store_db.migrate(con)
        rows = [_row(Q, "a", "m", T0 + 15 * k, v) for k, v in enumerate((0, 100, 250, 30, 90))]
        rows += [_row(H, "a", "m", T0 + 15 * k, v) for k, v in enumerate((0, 60, 200, 10, 50))]
        con.executemany("INSERT INTO metric_samples (metric, labels, instance, model, engine, "
                        "ts_unix_s, value, raw_metric, legacy, created_zero, source_id) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        before = hit_rate_by_window(con, window_s=30, by=("model",), stored=False)
    return db_path, before


def test_migration_70_stores_the_increases_of_existing_samples(db_at_60):
    path, before = db_at_60
    con = store_db.connect(path)
    try:
        assert 70 in store_db.migrate(con)
        assert increases_stored(con)
        after = hit_rate_by_window(con, window_s=30, by=("model",))
        pd.testing.assert_frame_equal(after, before, check_dtype=False)
        assert int(after["restarts"].sum()) == 1
        inc = con.execute("SELECT increase FROM metric_samples WHERE metric = ? "
                          "ORDER BY ts_unix_s", [Q]).fetchall()
        assert [r[0] for r in inc] == [None, 100.0, 150.0, 30.0, 60.0]
        # the next scrape continues from the migrated head
        insert_metric_samples(con, [_row(Q, "a", "m", T0 + 75, 190)])
        assert con.execute("SELECT increase FROM metric_samples WHERE metric = ? AND "
                           "ts_unix_s = ?", [Q, T0 + 75]).fetchone()[0] == 100.0
    finally:
        con.close()
