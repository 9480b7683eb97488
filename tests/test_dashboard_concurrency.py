"""The dashboard keeps working while another process writes to the same DuckDB file.

DuckDB allows one writing process or several reading processes per file. The writer here is the
real ``prefixscope ingest metrics URL --every 0.2`` scraping a loopback ``/metrics`` whose
prefix-cache counters grow on every scrape (built from the real vLLM 0.32 capture); the readers
are the dashboard's pages, rendered over and over through AppTest (each data call opens and
closes one read-only connection). Also: a lock held for longer than the dashboard's retry budget
shows "database busy" (a warning, never a traceback).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests import dashboard_support as ds

MY_PAGES = ("views/overview.py", "views/requests.py", "views/savings.py", "views/data_sources.py")


def _rows_added(db: str) -> int:
    at = ds.run_app(db, "views/data_sources.py")
    ds.assert_clean(at)
    return int(ds.metrics(at)["Rows added"].replace(",", ""))


def _live_query_tokens(db: str, instance: str) -> int:
    def pick(a):
        a.radio(key="filter_range").set_value("all")
        a.multiselect(key="filter_instances").set_value([instance])

    at = ds.run_app(db, "views/overview.py", setup=pick)
    ds.assert_clean(at)
    return int(at.dataframe[0].value["Query tokens"].iloc[0].replace(",", ""))


def test_pages_render_while_a_writer_ingests(tmp_path, monkeypatch):
    from prefixscope.dashboard import data

    db = ds.build_real_db(tmp_path / "busy.duckdb")
    monkeypatch.setenv("PREFIXSCOPE_DB", db)
    with ds.GrowingMetrics() as endpoint, ds.metrics_writer(
            db, endpoint.url, every_s=0.2, log_path=tmp_path / "writer.log") as writer:
        instance = endpoint.url.split("//")[1].split("/")[0]  # host:port, the ingester's default
        deadline = time.monotonic() + 60
        while endpoint.scrapes < 3:
            assert writer.poll() is None, (tmp_path / "writer.log").read_text()
            assert time.monotonic() < deadline, "the writer never scraped"
            time.sleep(0.1)
        time.sleep(0.5)  # let the writer commit
        now = [time.time()]
        monkeypatch.setattr(data, "clock", lambda: now[0])  # the cache's clock: moved, not slept
        data.clear_cache()
        rows_before = _rows_added(db)
        tokens_before = _live_query_tokens(db, instance)

        renders = 0
        busy = 0
        while renders < 3 * len(MY_PAGES):
            for page in MY_PAGES:
                at = ds.run_app(db, page)
                ds.assert_clean(at)  # no exception box, no error alert: lock conflicts retried
                assert at.title
                busy += sum("Database busy" in w for w in ds.texts(at, "warning"))
                renders += 1
        assert writer.poll() is None, "the writer died while the dashboard read"
        scrapes_during = endpoint.scrapes

        # Within the TTL the cached results are shown although the writer committed more.
        assert _rows_added(db) == rows_before
        # New data shows once the cached results expire: one TTL later on the cache's clock.
        now[0] += data.CACHE_TTL_S
        rows_after = _rows_added(db)
        tokens_after = _live_query_tokens(db, instance)
    log = (tmp_path / "writer.log").read_text(errors="replace")
    assert "Traceback" not in log and "locked" not in log.lower(), log[-2000:]
    assert scrapes_during > 3
    assert busy == 0, f"{busy} 'Database busy' notices: a writer held the lock past the read timeout"
    assert rows_after > rows_before
    assert tokens_after > tokens_before
    print(f"renders={renders} busy_notices={busy} scrapes={endpoint.scrapes} "
          f"rows {rows_before}->{rows_after} live query tokens {tokens_before}->{tokens_after}")


HOLD_LOCK = """
import sys, time
from prefixscope.store import db as store_db
with store_db.writer(sys.argv[1]) as con:
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.mark.parametrize("page", MY_PAGES)
def test_a_long_write_lock_shows_database_busy_not_a_traceback(tmp_path, monkeypatch, page):
    from prefixscope.dashboard import data

    db = ds.build_real_db(tmp_path / "locked.duckdb")
    monkeypatch.setenv("PREFIXSCOPE_DB", db)
    monkeypatch.setattr(data, "LOCK_TIMEOUT_S", 0.3)
    monkeypatch.setattr(data, "BUSY_RETRIES", 1)
    monkeypatch.setattr(data, "BUSY_RETRY_DELAY_S", 0.1)
    data.clear_cache()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, db, "20"], cwd=str(ds.ROOT),
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        at = ds.run_app(db, page)
        assert not at.exception, [e.value for e in at.exception]
        assert not at.error, [e.value for e in at.error]
        warnings = " ".join(ds.texts(at, "warning"))
        assert "Database still busy" in warnings or "Database busy" in warnings
    finally:
        ds.stop_process_group(holder)
    # once the writer is gone the page reads again
    data.clear_cache()
    at = ds.run_app(db, page)
    ds.assert_clean(at)
    assert not any("busy" in w for w in ds.texts(at, "warning"))


@pytest.mark.browser
def test_live_server_keeps_serving_while_a_writer_ingests_and_refreshes_after_the_ttl(tmp_path):
    """The real server (its own process) in Chromium, a writer process scraping every 0.2 s:
    every page renders clean, a reload within the cache TTL shows the cached figure, "Refresh
    now" shows the new rows (the expiry of the TTL itself is moved on the cache's clock in
    test_pages_render_while_a_writer_ingests, without sleeping)."""
    import os
    import re

    if not os.path.exists(ds.CHROMIUM):
        pytest.skip(f"{ds.CHROMIUM} is absent: install Debian's chromium (make test does, as root)")
    from playwright.sync_api import sync_playwright

    ttl_s = 1e9  # no cache period ends during the test: a second read is always cached
    config = tmp_path / "prefixscope.toml"
    config.write_text(f"[dashboard]\ncache_ttl_s = {ttl_s}\n", encoding="utf-8")
    db = ds.build_real_db(tmp_path / "live.duckdb")

    def rows_added(page) -> int:
        ds.wait_for_streamlit(page)
        card = page.locator('[data-testid="stMetric"]', has_text="Rows added")
        return int(re.sub(r"\D", "", card.locator('[data-testid="stMetricValue"]').inner_text()))

    def clean(page, where: str) -> None:
        for sel in ('[data-testid="stException"]', '[data-testid="stAlertContentError"]'):
            assert page.locator(sel).count() == 0, f"{where}: {page.locator(sel).first.inner_text()}"

    with ds.GrowingMetrics() as endpoint, ds.metrics_writer(
            db, endpoint.url, every_s=0.2, log_path=tmp_path / "writer.log") as writer, \
            ds.dashboard_server(db, env={"PREFIXSCOPE_CONFIG": str(config)},
                                log_path=tmp_path / "server.log") as url, \
            sync_playwright() as p:
        while endpoint.scrapes < 3:
            assert writer.poll() is None, (tmp_path / "writer.log").read_text()
            time.sleep(0.1)
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=ds.CHROMIUM, args=ds.CHROMIUM_ARGS,
            headless=True, viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            entries = ds.page_entries()
            for i, (rel, _title, _icon) in enumerate(entries):
                page.goto(f"{url}/{ds.page_url_path(rel, first=(i == 0))}")
                ds.wait_for_streamlit(page)
                clean(page, rel)
            page.goto(f"{url}/data_sources")
            first = rows_added(page)
            scrapes_at_first = endpoint.scrapes
            page.reload()
            second = rows_added(page)
            while endpoint.scrapes < scrapes_at_first + 3:  # the writer commits more rows
                assert writer.poll() is None, (tmp_path / "writer.log").read_text()
                time.sleep(0.1)
            page.get_by_role("button", name="Refresh now").click()
            third = rows_added(page)
            clean(page, "data_sources after Refresh now")
        finally:
            context.close()
        assert writer.poll() is None
    assert second == first, "a reload within the TTL read the database again"
    assert third > first, "no new rows after Refresh now"
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert ds.app_tracebacks(log) == [], [b[-600:] for b in ds.app_tracebacks(log)]
