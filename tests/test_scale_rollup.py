"""The per-minute request rollup (issue 17 item 3, migration 71): maintained by the transaction
that inserts the requests, it gives exactly the numbers the queries compute from ``requests``
for every range (whole minutes, part minutes at either end, inside one minute, no data),
grouping and filter, whatever the batches (repeats, rows already stored, requests without a
time); a database made before migration 71 gets its rollup in place."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.ingest.usage import save_usage_rows
from prefixscope.store import db as store_db
from prefixscope.store.queries import requests as q
from tests.store_support import (frames_equal, insert_requests_without_rollups, older_schema,
                                 request_row)

T0 = 1_795_000_020.0  # 20 s past a whole minute


def _row(i, ts, *, run_id="", **kw):
    return request_row(run_id, f"r{i}", ts, line=i, **kw)


_req = st.fixed_dictionaries({
    "ts": st.one_of(st.none(), st.floats(-200, 7400)),
    "model": st.sampled_from(["m1", "m2", None]),
    "instance": st.sampled_from(["a", "b"]),
    "run_id": st.sampled_from(["", "", "run-1"]),
    "scope": st.sampled_from([None, "PUBLIC", "TENANT"]),
    "prompt": st.one_of(st.none(), st.integers(0, 5000)),
    "cached": st.one_of(st.none(), st.integers(0, 5000)),
    "ttft": st.one_of(st.none(), st.floats(1, 500)),
    "latency": st.one_of(st.none(), st.floats(1, 5000)),
})


def _same(con, **kw):
    calls = [
        lambda r: q.request_hit_rate_by_window(con, window_s=300, by=("model",), rollup=r, **kw),
        lambda r: q.request_hit_rate_by_window(con, window_s=60, by=("run_id", "scope"),
                                               rollup=r, **kw),
        lambda r: q.request_hit_rate_by_window(con, window_s=3600, by=(), origin_s=120,
                                               rollup=r, **kw),
        lambda r: q.request_hit_rate_totals(con, by=("model", "instance"), rollup=r, **kw),
        lambda r: q.request_hit_rate_totals(con, by=(), rollup=r, **kw),
        lambda r: q.request_counts(con, rollup=r, **kw),
        lambda r: q.cached_tokens_coverage(con, rollup=r, **kw),
    ]
    for call in calls:
        frames_equal(call(True), call(False))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(reqs=st.lists(_req, min_size=0, max_size=40), data=st.data())
def test_rollup_gives_the_raw_numbers(reqs, data):
    with store_db.memory() as con:
        rows = [_row(i, None if r["ts"] is None else T0 + r["ts"], model=r["model"],
                     instance=r["instance"], run_id=r["run_id"], scope=r["scope"],
                     prompt=r["prompt"], cached=r["cached"], ttft=r["ttft"],
                     latency=r["latency"]) for i, r in enumerate(reqs)]
        cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=4), label="batches"))
        bounds = [0, *cuts, len(rows)]
        for lo, hi in zip(bounds, bounds[1:]):
            batch = rows[lo:hi]
            if batch and data.draw(st.booleans(), label="repeat stored rows"):
                batch = batch + rows[max(0, lo - 3):lo + 1]  # repeats and rows stored already
                save_usage_rows(con, batch)
            elif batch:
                save_usage_rows(con, batch, assume_new=True)
        assert q.rollup_current(con)
        stored = con.execute("SELECT * FROM request_rollup_1m ORDER BY ALL").fetchall()
        q.rebuild_request_rollup(con)
        assert con.execute("SELECT * FROM request_rollup_1m ORDER BY ALL").fetchall() == stored
        start = T0 + data.draw(st.floats(-300, 7500), label="start")
        length = data.draw(st.sampled_from([0.5, 30.0, 60.0, 61.5, 600.0, 9000.0]), label="len")
        _same(con)
        _same(con, start_s=start, end_s=start + length)
        _same(con, start_s=start)
        _same(con, end_s=start)
        _same(con, start_s=T0 - 40, end_s=T0 + 7260)  # aligned to minutes
        _same(con, start_s=start, models=["m2"], run_ids=[""], instances=["b"])
        _same(con, start_s=0.0, end_s=60.0)  # a range with no data
        from_rollup = q.request_filter_values(con)
        con.execute("DELETE FROM request_rollup_1m")  # not current: read from requests
        assert not rows or not q.rollup_current(con)
        assert q.request_filter_values(con) == from_rollup


def test_rows_written_with_sql_make_the_queries_read_requests(con):
    save_usage_rows(con, [_row(1, T0, cached=40), _row(2, T0 + 70, cached=0)])
    assert q.request_counts(con)["hit_requests"] == 1
    con.execute("INSERT INTO requests SELECT * REPLACE (request_id || 'x' AS request_id, "
                f"{q.REQUEST_KEY_SQL.replace('request_id', 'request_id || ' + repr('x'))} "
                "AS request_key) FROM requests")
    assert not q.rollup_current(con)
    assert q.request_counts(con)["hit_requests"] == 2  # from requests, not the stale rollup
    q.rebuild_request_rollup(con)
    assert q.rollup_current(con)
    assert q.request_counts(con)["requests"] == 4


def test_a_model_with_a_single_request(con):
    save_usage_rows(con, [_row(1, T0 + 5.5, model="solo", prompt=10, cached=4)])
    t = q.request_hit_rate_totals(con, by=("model",))
    assert t[["model", "requests", "hit_rate", "first_ts_unix_s"]].values.tolist() == [
        ["solo", 1, 0.4, T0 + 5.5]]
    _same(con)
    _same(con, start_s=T0 + 5, end_s=T0 + 6)


@pytest.fixture
def db_at_70(db_path, monkeypatch):
    with older_schema(db_path, monkeypatch, before=71) as con:
        store_db.migrate(con)
        insert_requests_without_rollups(con, [_row(i, T0 + 13 * i, cached=i) for i in range(20)]
                                        + [_row(99, None, cached=None)])
    return db_path


def test_migration_71_builds_the_rollup_of_stored_requests(db_at_70):
    con = store_db.connect(db_at_70)
    try:
        assert 71 in store_db.migrate(con)
        assert q.rollup_current(con)
        assert q.request_counts(con) == {"requests": 21, "reported_requests": 20,
                                         "hit_requests": 19, "with_ttft": 0, "with_latency": 0}
        _same(con)
    finally:
        con.close()
