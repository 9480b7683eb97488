"""Overview says STALE for a day without data (issue 28 #3): at 00:01 after the scrapes stopped,
``report daily`` reads STALE; the daily strip runs to today (not to the last sample) with the
daily report's word for each day, the banner says STALE and when the data stopped, and the
latest window says its time and age. The clock is ``prefixscope.dashboard.data.clock``.
"""

from __future__ import annotations

import re
from datetime import date, timedelta

from prefixscope.alerts.daily import build_daily_report
from prefixscope.core.config import AlertsConfig
from prefixscope.core.report import ALERT, OK, STALE
from prefixscope.store import db as store_db
from tests import dashboard_support as ds
from tests.alerts_support import CounterSource, local_ts
from tests.hostile.support import fresh_db

TODAY = date(2026, 11, 30)
D1, D2, D3 = (TODAY - timedelta(days=k) for k in (3, 2, 1))
NOW = local_ts(TODAY, 0) + 60.0  # 00:01 UTC
LAST_SCRAPE = local_ts(D3, 17.5)  # hourly from 00:30, the last before 18:00


def _db(tmp_path) -> str:
    """coder-7b scraped hourly: D1 at 89% (OK), D2 and D3 at 30% (ALERT), the scrapes stopping
    after 17:30 on D3 (yesterday)."""
    db = fresh_db(tmp_path)
    with store_db.writer(db) as con:
        src = CounterSource(tmp_path, "vllm-a:8000", "coder-7b",
                            created_unix_s=local_ts(D1 - timedelta(days=9), 0))
        src.day(con, D1, queries=900_000, hits=800_000)
        src.day(con, D2, queries=900_000, hits=270_000)
        src.day(con, D3, queries=600_000, hits=180_000, first_h=0.5, last_h=18.0)
    return db


def test_the_daily_report_reads_stale_today(tmp_path):
    """The rule the page must follow: today's report (before any data today) says STALE."""
    db = _db(tmp_path)
    with store_db.reader(db) as con:
        report = build_daily_report(con, day=TODAY, tz="UTC", cfg=AlertsConfig(),
                                    now_unix_s=NOW)
    (line,) = [ln for ln in report.lines if ln.model == "coder-7b" and not ln.is_detail]
    assert line.status == STALE


def test_overview_says_stale_up_to_today(tmp_path, use_db, monkeypatch):
    from prefixscope.dashboard import data

    db = _db(tmp_path)
    monkeypatch.setattr(data, "clock", lambda: NOW)
    at = ds.run_app(use_db(db), setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    md = ds.texts(at, "markdown")
    # the strip: one column per day up to today, each the daily report's word
    heads = [c for c in ds.texts(at, "caption") if re.fullmatch(r"\w{3} \d\d-\d\d", c)]
    assert heads == [f"{d:%a %m-%d}" for d in (D1, D2, D3, TODAY)], heads
    cells = re.findall(r":\w+-badge\[(STALE|OK|ALERT|NO DATA)\]", "\n".join(
        m for m in md if "badge" in m and "window" not in m and "tokens" not in m))
    assert cells == [OK, ALERT, ALERT, STALE], cells
    assert "—  \n:orange-badge[STALE]" in md
    # the banner: STALE first, when the data stopped and how long ago, then the ALERT
    (banner,) = [w for w in ds.texts(at, "warning") if "coder-7b" in w]
    assert banner.startswith(":orange-badge[STALE] **coder-7b: no data since "
                             f"{D3.isoformat()} 17:30 UTC (7 h ago)**"), banner
    assert f"daily report of {TODAY.isoformat()} reads STALE" in banner
    assert f"below 50.0% since {D2.isoformat()}" in banner
    # the latest window: its time and its age
    (latest,) = [m for m in md if m.startswith("Latest 1h window")]
    assert latest.startswith(f"Latest 1h window, from {D3.isoformat()} 17:00 UTC, ended 6 h "
                             "ago: **"), latest
    assert ":red-badge[ALERT]" in latest


def test_the_strip_before_the_data_stopped(tmp_path, use_db, monkeypatch):
    """At 17:45 on D3, a quarter of an hour after the last scrape (the source not yet silent by the
    rule): no STALE anywhere, the strip ends on D3, the banner is the ALERT banner and the
    latest window (17:00-18:00) is in progress."""
    from prefixscope.dashboard import data

    db = _db(tmp_path)
    monkeypatch.setattr(data, "clock", lambda: LAST_SCRAPE + 900.0)
    at = ds.run_app(use_db(db), setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    md = "\n".join(ds.texts(at, "markdown"))
    assert "STALE" not in md and not any("STALE" in w for w in ds.texts(at, "warning"))
    heads = [c for c in ds.texts(at, "caption") if re.fullmatch(r"\w{3} \d\d-\d\d", c)]
    assert heads[-1] == f"{D3:%a %m-%d}", heads
    (banner,) = [w for w in ds.texts(at, "warning") if "coder-7b" in w]
    assert banner.startswith(":red-badge[ALERT] **coder-7b below 50.0% since"), banner
    assert f"Latest 1h window, from {D3.isoformat()} 17:00 UTC, in progress: **" in md
