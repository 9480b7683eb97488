"""``prefixscope.store.sqlhelpers.window_start_sql``: the one window cut of every per-window query."""

from __future__ import annotations

import math

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixscope.store.sqlhelpers import window_start_sql


def _start(ts: float, window_s: float, origin_s: float = 0.0) -> float:
    sql, params = window_start_sql("ts_unix_s", window_s=window_s, origin_s=origin_s)
    return duckdb.execute(f"SELECT {sql} FROM (SELECT ?::DOUBLE AS ts_unix_s)",
                          [*params, ts]).fetchone()[0]


@pytest.mark.parametrize(("ts", "window_s", "origin_s", "start"), [
    (1795960920.0, 300, 0, 1795960800.0),   # 14:02 -> 14:00
    (1795960800.0, 300, 0, 1795960800.0),   # a boundary starts its window
    (1795960799.5, 300, 0, 1795960500.0),
    (40.0, 60, 30, 30.0),                   # origin 30: windows [30, 90) ...
    (29.0, 60, 30, -30.0),                  # ... and before it [-30, 30)
    (-1.0, 86400, 0, -86400.0),
])
def test_windows(ts, window_s, origin_s, start):
    assert _start(ts, window_s, origin_s) == start


@given(st.floats(-1e9, 3e9, allow_nan=False), st.sampled_from([1.0, 15.0, 300.0, 3600.0, 86400.0]),
       st.floats(-1e6, 1e6, allow_nan=False))
def test_matches_the_formula(ts, window_s, origin_s):
    assert _start(ts, window_s, origin_s) == origin_s + math.floor((ts - origin_s) / window_s) * window_s


def test_values_are_parameters_and_columns_are_names():
    sql, params = window_start_sql("q.rel_s", window_s=300, origin_s=5)
    assert sql == "(? + floor((q.rel_s - ?) / ?) * ?)" and params == [5.0, 5.0, 300.0, 300.0]
    with pytest.raises(AssertionError):
        window_start_sql("ts_unix_s); DROP TABLE requests; --", window_s=300)


def test_bucket_split_whole_buckets_and_the_parts_at_either_end():
    from prefixscope.store.sqlhelpers import bucket_split

    s = bucket_split(90.0, 610.0, 60.0)
    assert (s.lo, s.hi, s.head, s.tail) == (120.0, 600.0, (90.0, 120.0), (600.0, 610.0))
    assert s.whole_where("bucket_start_s") == ("bucket_start_s >= ? AND bucket_start_s < ?",
                                               [120.0, 600.0])
    aligned = bucket_split(120.0, 600.0, 60.0)
    assert (aligned.head, aligned.tail) == (None, None)
    open_ = bucket_split(None, None, 300.0)
    assert (open_.lo, open_.hi, open_.head, open_.tail) == (None, None, None, None)
    assert open_.whole_where() == ("TRUE", [])
    assert bucket_split(61.0, 119.0, 60.0) is None  # inside one bucket
    assert bucket_split(60.0, 60.0, 60.0).lo == 60.0  # empty, but whole: no parts
    # a rollup dropped before 3600: the whole buckets start there, raw rows before it
    f = bucket_split(None, 7230.0, 60.0, floor_s=3600.0)
    assert (f.lo, f.hi, f.head, f.tail) == (3600.0, 7200.0, (None, 3600.0), (7200.0, 7230.0))
    assert f.whole_where(null_below=True)[0] == ("(bucket_start_s >= ? OR bucket_start_s IS "
                                                 "NULL) AND bucket_start_s < ?")
    g = bucket_split(1000.0, 7230.0, 60.0, floor_s=3600.0)
    assert (g.lo, g.head) == (3600.0, (1000.0, 3600.0))
    assert bucket_split(0.0, 3600.0, 60.0, floor_s=3600.0) is None  # wholly before the floor
