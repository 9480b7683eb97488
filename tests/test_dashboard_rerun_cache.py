"""A rerun inside one cache period asks the same queries (so it reads the cache): the quick
picks of the time range start from the cache period's start, not from the second of the run.

With Live on the page re-runs every ``[dashboard] cache_ttl_s``; before this, "last 24h"
started at ``time.time() - 86400`` of each run, so every rerun missed the cache and recomputed
the whole page (benchmarks/dashboard_rerun.py measures it on the demo database).
"""

from __future__ import annotations

import pytest

from tests import dashboard_support as ds


@pytest.fixture(scope="module")
def real_db(tmp_path_factory) -> str:
    return ds.build_real_db(tmp_path_factory.mktemp("rerun") / "real.duckdb")


def _start(at) -> float | None:
    from prefixscope.dashboard import filters

    return at.session_state[filters._STATE_KEY].start_s


def test_quick_pick_starts_at_the_cache_period(real_db, use_db, monkeypatch):
    from prefixscope.dashboard import data

    monkeypatch.setattr(data, "CACHE_TTL_S", 15.0)
    t0 = 1_796_100_007.0  # 7 s into a 15 s period
    monkeypatch.setattr(data, "clock", lambda: t0)
    at = ds.run_app(use_db(real_db), "views/overview.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("24h"))
    ds.assert_clean(at)
    period = 1_796_100_000.0 - 1_796_100_000.0 % 15.0
    assert _start(at) == period - 86400.0
    monkeypatch.setattr(data, "clock", lambda: t0 + 7.0)  # same period: same query
    at.run()
    assert _start(at) == period - 86400.0
    monkeypatch.setattr(data, "clock", lambda: t0 + 8.0)  # the next period moves it by one TTL
    at.run()
    assert _start(at) == period + 15.0 - 86400.0


def test_a_rerun_in_the_period_reads_the_cache(real_db, use_db, monkeypatch):
    """The second run of one period computes no query: the store file is moved away between
    the runs, and the page still draws the same figures from the cache."""
    import shutil

    from prefixscope.dashboard import data

    monkeypatch.setattr(data, "CACHE_TTL_S", 3600.0)
    t0 = 1_796_100_007.0
    monkeypatch.setattr(data, "clock", lambda: t0)
    copy = real_db + ".copy.duckdb"
    shutil.copy(real_db, copy)
    data.clear_cache()
    at = ds.run_app(use_db(copy), "views/overview.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("7d"))
    ds.assert_clean(at)
    before = ds.metrics(at)
    charts = ds.chart_count(at)
    assert charts > 0
    monkeypatch.setattr(data, "clock", lambda: t0 + 60.0)
    shutil.move(copy, copy + ".gone")
    at.run()
    ds.assert_clean(at)
    assert ds.metrics(at) == before and ds.chart_count(at) == charts


def test_store_version_moves_with_a_commit_not_with_a_read(tmp_path):
    from prefixscope.dashboard import data
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    db = ds.build_empty_db(tmp_path / "v.duckdb")
    v0 = data.store_version(db)
    assert v0[0] is not None
    with store_db.reader(db) as con:
        con.execute("SELECT count(*) FROM requests").fetchone()
    assert data.store_version(db) == v0
    with store_db.writer(db) as con:
        ingest_usage_file(con, ds.PROBE_REQUESTS, instance=ds.BS32)
    assert data.store_version(db) != v0
    assert data.store_version(str(tmp_path / "none.duckdb")) == (None, None)


def test_live_tick_reruns_only_for_new_data_or_after_the_idle_interval():
    from prefixscope.dashboard.app import LIVE_IDLE_RERUN_S, live_rerun_due

    v, w = ((1, 2), None), ((1, 3), None)
    assert live_rerun_due(since_full_run_s=15.0, every_s=15.0, version=w, last_version=v)
    assert not live_rerun_due(since_full_run_s=15.0, every_s=15.0, version=v, last_version=v)
    assert not live_rerun_due(since_full_run_s=5.0, every_s=15.0, version=w, last_version=v)
    assert live_rerun_due(since_full_run_s=LIVE_IDLE_RERUN_S, every_s=15.0, version=v,
                          last_version=v)
