"""Hit rate per window from counter increases: restarts, gaps, window boundaries (5 min, 1 h,
1 day), engines summed, filters, and the relation to Prometheus' increase()."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscope.store.queries.metrics import (
    counter_increase_by_window,
    gauge_series,
    hit_rate_by_window,
    hit_rate_totals,
    insert_metric_samples,
    last_sample_ts,
    metric_filter_values,
)

Q = "vllm:prefix_cache_queries_total"
H = "vllm:prefix_cache_hits_total"
X = "vllm:external_prefix_cache_hits_total"


def _put(con, metric, points, *, instance="a:8000", model="m", engine="0", legacy=False,
         created_zero_at=None):
    labels = json.dumps({"engine": engine, "model_name": model}, separators=(",", ":"))
    rows = [(metric, labels, instance, model, engine, float(t), float(v), metric, legacy, False,
             "test") for t, v in points]
    if created_zero_at is not None:
        rows.append((metric, labels, instance, model, engine, float(created_zero_at), 0.0, metric,
                     legacy, True, "test"))
    return insert_metric_samples(con, rows)


# One engine of instance a. Samples (t, queries, hits); hand-computed increases:
#   t=1000  q=100 h=50   first sample: no increase
#   t=1150  q=300 h=150  +200/+100  -> window 900 (5 min: [900, 1200))
#   t=1290  q=600 h=300  +300/+150  -> window 1200
#   t=1500  q=700 h=350  +100/+50   -> window 1500 (a sample on a boundary starts the window)
#   (gap: nothing from 1500 to 2400)
#   t=2400  q=1000 h=500 +300/+150  -> window 2400 (the whole gap lands on the later sample)
#   t=2500  q=50 h=10    restart: +50/+10 (the new value), restarts=1 -> window 2400
#   t=2700  q=80 h=40    +30/+30    -> window 2700
SERIES = [(1000, 100, 50), (1150, 300, 150), (1290, 600, 300), (1500, 700, 350),
          (2400, 1000, 500), (2500, 50, 10), (2700, 80, 40)]


@pytest.fixture
def loaded(con):
    _put(con, Q, [(t, q) for t, q, _ in SERIES])
    _put(con, H, [(t, h) for t, _, h in SERIES])
    return con


def _rows(df, *cols):
    return [tuple(r[c] for c in cols) for r in df.to_dict("records")]


def test_five_minute_windows_hand_computed(loaded):
    df = hit_rate_by_window(loaded, window_s=300)
    assert _rows(df, "window_start_s", "window_end_s", "hit_tokens", "query_tokens", "restarts") == [
        (900.0, 1200.0, 100, 200, 0),
        (1200.0, 1500.0, 150, 300, 0),
        (1500.0, 1800.0, 50, 100, 0),
        (2400.0, 2700.0, 160, 350, 1),
        (2700.0, 3000.0, 30, 30, 0),
    ]
    assert df["hit_rate"].tolist() == pytest.approx([0.5, 0.5, 0.5, 160 / 350, 1.0])
    assert set(df["model"]) == {"m"} and set(df["instance"]) == {"a:8000"}
    assert not df["legacy"].any() and (df["external_hit_tokens"] == 0).all()


def test_hour_and_day_windows_sum_the_same_increases(loaded):
    for window_s in (3600, 86400):
        df = hit_rate_by_window(loaded, window_s=window_s)
        assert _rows(df, "window_start_s", "hit_tokens", "query_tokens", "restarts") == [
            (0.0, 490, 980, 1)]
        assert df["hit_rate"].iloc[0] == pytest.approx(0.5)


def test_origin_shifts_the_window_grid(loaded):
    df = hit_rate_by_window(loaded, window_s=1000, origin_s=250)
    # windows [250,1250) [1250,2250) [2250,3250)
    assert _rows(df, "window_start_s", "hit_tokens", "query_tokens") == [
        (250.0, 100, 200), (1250.0, 200, 400), (2250.0, 190, 380)]


def test_start_and_end_clip_on_the_later_sample(loaded):
    # start 1200 still counts 1150 -> 1290 (the earlier sample may lie before start)
    df = hit_rate_by_window(loaded, window_s=300, start_s=1200, end_s=2500)
    assert _rows(df, "window_start_s", "hit_tokens", "query_tokens") == [
        (1200.0, 150, 300), (1500.0, 50, 100), (2400.0, 150, 300)]  # 2500 excluded (end)
    tot = hit_rate_totals(loaded, start_s=1200, end_s=2500).to_dict("records")[0]
    assert (tot["hit_tokens"], tot["query_tokens"]) == (350, 700)
    assert (tot["first_ts_unix_s"], tot["last_ts_unix_s"]) == (1150.0, 2400.0)


def test_sum_over_windows_equals_total(loaded):
    for w in (60, 300, 3600):
        df = hit_rate_by_window(loaded, window_s=w)
        tot = hit_rate_totals(loaded).to_dict("records")[0]
        assert df["hit_tokens"].sum() == tot["hit_tokens"] == 490
        assert df["query_tokens"].sum() == tot["query_tokens"] == 980


def test_engines_are_summed_before_dividing(loaded):
    # engine 1: 0 -> 400 queries, 0 -> 100 hits inside window 900 (hit rate 0.25 alone)
    _put(loaded, Q, [(950, 0), (1100, 400)], engine="1")
    _put(loaded, H, [(950, 0), (1100, 100)], engine="1")
    df = hit_rate_by_window(loaded, window_s=300, by=("model",))
    first = df.to_dict("records")[0]
    assert (first["hit_tokens"], first["query_tokens"]) == (200, 600)
    assert first["hit_rate"] == pytest.approx(200 / 600)  # not mean(0.5, 0.25)
    by_engine = hit_rate_by_window(loaded, window_s=300, by=("engine",))
    assert _rows(by_engine, "window_start_s", "engine", "query_tokens")[:2] == [
        (900.0, "0", 200), (900.0, "1", 400)]


def test_group_by_instance_and_filters(loaded):
    _put(loaded, Q, [(1000, 0), (1100, 1000)], instance="b:8000", model="other")
    _put(loaded, H, [(1000, 0), (1100, 900)], instance="b:8000", model="other")
    df = hit_rate_by_window(loaded, window_s=3600, by=("instance",))
    assert _rows(df, "instance", "hit_tokens", "query_tokens") == [
        ("a:8000", 490, 980), ("b:8000", 900, 1000)]
    only_b = hit_rate_by_window(loaded, window_s=3600, by=("model",), instances=["b:8000"])
    assert _rows(only_b, "model", "query_tokens") == [("other", 1000)]
    only_m = hit_rate_totals(loaded, by=("model", "instance"), models=["m"])
    assert _rows(only_m, "model", "instance", "query_tokens") == [("m", "a:8000", 980)]
    overall = hit_rate_by_window(loaded, window_s=86400, by=())
    assert _rows(overall, "hit_tokens", "query_tokens") == [(1390, 1980)]


def test_zero_query_tokens_gives_null_hit_rate(con):
    _put(con, Q, [(10, 5), (20, 5)])
    _put(con, H, [(10, 0), (20, 0)])
    df = hit_rate_by_window(con, window_s=300)
    assert df["query_tokens"].tolist() == [0]
    assert df["hit_rate"].isna().all()


def test_created_zero_counts_the_first_scrape_and_reveals_a_restart_past_the_old_value(con):
    # process 1 created at 900, scraped at 1000 (q=100) and 1100 (q=150);
    # process 2 created at 1200 and already at q=400 > 150 when scraped at 1300
    _put(con, Q, [(1000, 100), (1100, 150)], created_zero_at=900)
    _put(con, Q, [(1300, 400)], created_zero_at=1200)
    df = counter_increase_by_window(con, metric=Q, window_s=3600, by=())
    assert df["increase"].tolist() == [550.0]  # 100 + 50 + 400, not 100 + 50 + 250
    win = hit_rate_by_window(con, window_s=3600)
    assert win["restarts"].tolist() == [1]


def test_legacy_flag_and_external_hits(con):
    _put(con, Q, [(10, 0), (20, 100)], legacy=True)
    _put(con, H, [(10, 0), (20, 40)], legacy=True)
    _put(con, X, [(10, 0), (20, 30)])
    r = hit_rate_by_window(con, window_s=300).to_dict("records")[0]
    assert bool(r["legacy"]) and r["external_hit_tokens"] == 30
    assert r["hit_rate"] == pytest.approx(0.4)  # local only; (40 + 30) / 100 with external


def test_bad_arguments(con):
    from prefixscope.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        hit_rate_by_window(con, by=("scope",))
    with pytest.raises(InvalidArgument):
        hit_rate_by_window(con, window_s=0)


def test_gauges_filters_and_staleness(con):
    rows = []
    for t, v in ((10, 0.1), (20, 0.5)):
        rows.append(("vllm:kv_cache_usage_perc", '{"engine":"0","model_name":"m"}', "a", "m",
                     "0", float(t), v, "vllm:kv_cache_usage_perc", False, False, "t"))
    insert_metric_samples(con, rows)
    _put(con, Q, [(30, 5)], created_zero_at=5)
    g = gauge_series(con, metric="vllm:kv_cache_usage_perc", start_s=15)
    assert _rows(g, "ts_unix_s", "value") == [(20.0, 0.5)]
    f = metric_filter_values(con)
    assert f == {"models": ["m"], "instances": ["a", "a:8000"], "run_ids": [""],
                 "production_instances": ["a", "a:8000"],
                 "min_ts_unix_s": 10.0, "max_ts_unix_s": 30.0, "production_max_ts_unix_s": 30.0}
    assert _rows(last_sample_ts(con), "instance", "last_ts_unix_s") == [("a", 20.0), ("a:8000", 30.0)]


# --- Relation to Prometheus' increase() -----------------------------------------------------

def prom_increase_no_extrapolation(values: list[float]) -> float:
    """Prometheus' extrapolatedRate(isCounter) for increase() minus the extrapolation step:
    last - first, plus the previous value at every drop (promql/functions.go)."""
    if len(values) < 2:
        return 0.0
    result = values[-1] - values[0]
    for prev, cur in zip(values, values[1:]):
        if cur < prev:
            result += prev
    return result


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 400), st.integers(0, 500), st.booleans()),
                   min_size=2, max_size=40),
    window_s=st.sampled_from([60, 300, 3600]),
)
def test_windows_equal_prometheus_increase_over_the_range_from_the_previous_sample(steps, window_s):
    from prefixscope.store import db as store_db

    # a counter that grows and sometimes restarts (drops to a smaller value)
    t, v, points = 1_000_000.0, 0.0, []
    for dt, dv, restart in steps:
        t += dt
        v = float(dv // 3) if restart else v + dv
        points.append((t, v))
    con = store_db.memory()
    try:
        _put(con, Q, points)
        df = counter_increase_by_window(con, metric=Q, window_s=window_s, by=())
        got = dict(zip(df["window_start_s"], df["increase"]))
    finally:
        con.close()
    # each window = increase() without extrapolation over [sample before window, last in window]
    expected: dict[float, float] = {}
    for i in range(1, len(points)):
        w = (points[i][0] // window_s) * window_s
        expected.setdefault(w, None)
    for w in expected:
        idx = [i for i in range(1, len(points)) if (points[i][0] // window_s) * window_s == w]
        lo, hi = idx[0] - 1, idx[-1]
        expected[w] = prom_increase_no_extrapolation([p[1] for p in points[lo:hi + 1]])
    assert got == pytest.approx(expected)
    assert sum(got.values()) == pytest.approx(
        prom_increase_no_extrapolation([p[1] for p in points]))
