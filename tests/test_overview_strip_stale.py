"""Overview's daily strip reads STALE where the Alerts page does (session 8: it showed "—" for
a model whose scrapes stopped while another model still had data that day), by the one rule
(``prefixscope.alerts.daily.stale_sources``, definition 4); and the ALERT banner's whole-range
sentence says what the range holds ("the days before still count in it" only when there are
days before)."""

from __future__ import annotations

import re
from datetime import date, timedelta

from prefixscope.alerts.daily import build_daily_report, daily_statuses
from prefixscope.core.config import AlertsConfig
from prefixscope.core.report import ALERT, OK, STALE
from prefixscope.store import db as store_db
from tests import dashboard_support as ds
from tests.alerts_support import CounterSource, ingest_usage_lines, local_ts, requests_for
from tests.hostile.support import fresh_db

D1 = date(2026, 11, 27)
D2, D3 = D1 + timedelta(days=1), D1 + timedelta(days=2)
NOW = local_ts(D3 + timedelta(days=5), 0)  # every day is over


def _db(tmp_path) -> str:
    """coder-7b scraped hourly on D1 and D2 until 06:00, then silent; tiny (usage log only)
    has requests on D1, D2 and D3, at 40% (ALERT)."""
    db = fresh_db(tmp_path)
    with store_db.writer(db) as con:
        src = CounterSource(tmp_path, "vllm-a:8000", "coder-7b",
                            created_unix_s=local_ts(D1 - timedelta(days=9), 0))
        src.day(con, D1, queries=900_000, hits=800_000)
        src.day(con, D2, queries=90_000, hits=80_000, first_h=0.5, last_h=6.0)
        ingest_usage_lines(con, tmp_path / "usage.jsonl", [
            ln for d in (D1, D2, D3)
            for ln in requests_for(d, model="tiny", n=20, prompt_tokens=1000, cached_tokens=400)])
    return db


def test_strip_statuses_are_the_daily_reports(tmp_path):
    db = _db(tmp_path)
    cfg = AlertsConfig()
    with store_db.reader(db) as con:
        rows = daily_statuses(con, first_day=D1, last_day=D3, tz="UTC", cfg=cfg, now_unix_s=NOW)
        old = daily_statuses(con, first_day=D1, last_day=D3, tz="UTC", cfg=cfg)
        reports = {d: build_daily_report(con, day=d, tz="UTC", cfg=cfg, now_unix_s=NOW)
                   for d in (D1, D2, D3)}
    got = {(s.model, s.day): s.status for s in rows}
    assert got == {("coder-7b", D1): OK, ("coder-7b", D2): STALE, ("coder-7b", D3): STALE,
                   ("tiny", D1): ALERT, ("tiny", D2): ALERT, ("tiny", D3): ALERT}
    for (model, day), status in got.items():  # the Alerts page's word of that day
        (line,) = [ln for ln in reports[day].lines if ln.model == model and not ln.is_detail]
        assert line.status == status, (model, day)
    # without "now", the old statuses from the tokens only: no row for coder-7b on D3
    assert {(s.model, s.day): s.status for s in old} == {
        **{k: v for k, v in got.items() if k != ("coder-7b", D3)}, ("coder-7b", D2): OK}


def test_overview_strip_and_banner(tmp_path, use_db, monkeypatch):
    from prefixscope.dashboard import data

    db = _db(tmp_path)
    monkeypatch.setattr(data, "clock", lambda: NOW)  # the strip runs to "today": NOW's day

    def whole(at):
        at.radio(key="filter_range").set_value("all")

    at = ds.run_app(use_db(db), setup=whole)
    ds.assert_clean(at)
    md = " ".join(ds.texts(at, "markdown"))
    # coder-7b's D3 cell: the Alerts page's STALE, not "—"
    cells = re.findall(r":(\w+)-badge\[(STALE|OK|ALERT|NO DATA)\]", md)
    assert cells.count(("orange", "STALE")) == 2, cells
    assert "—  \n:orange-badge[STALE]" in "\n".join(ds.texts(at, "markdown"))
    (banner,) = [w for w in ds.texts(at, "warning") if "tiny below 50.0% since" in w]
    assert f"since {D1.isoformat()}" in banner
    assert "the days before still count in it" not in banner
    assert "the same days, pooled (the range holds no day before them)" in banner
