"""The dashboard's Alerts page (Streamlit AppTest): the day's report and the sends log."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from prefixscope.alerts.job import run_daily
from prefixscope.core.config import AlertsConfig, Settings
from prefixscope.store import db as store_db
from tests.alerts_support import CounterSource, free_port, local_ts, start_smtp

DAY = date(2026, 11, 28)


@pytest.fixture
def alerts_db(db_path, tmp_path, monkeypatch):
    folder = tmp_path / "scrapes"
    folder.mkdir()
    with store_db.writer(db_path) as con:
        a = CounterSource(folder, "vllm-a:8000", "tiny-llama", local_ts(DAY - timedelta(days=3), 0))
        a.day(con, DAY - timedelta(days=1), queries=100_000, hits=95_000, every_h=6)
        a.day(con, DAY, queries=100_000, hits=12_000, every_h=3)
        b = CounterSource(folder, "vllm-b:8000", "qwen-small", local_ts(DAY - timedelta(days=3), 0))
        b.day(con, DAY, queries=50_000, hits=45_000, every_h=1, first_h=0.5, last_h=9.5)
    server = start_smtp()
    try:
        ok = Settings(alerts=AlertsConfig(recipients=["oncall@example.com"], smtp_host="127.0.0.1",
                                          smtp_port=server.port))
        run_daily(db_path, settings=ok, day=DAY, tz="UTC", send=True, env={},
                  now_unix_s=local_ts(DAY, 30))
    finally:
        server.stop()
    down = Settings(alerts=AlertsConfig(recipients=["team@example.com"], smtp_host="127.0.0.1",
                                        smtp_port=free_port(), smtp_attempts=2))
    run_daily(db_path, settings=down, day=DAY, tz="UTC", send=True, env={},
              now_unix_s=local_ts(DAY, 30), sleep=lambda s: None)
    cfg = tmp_path / "prefixscope.toml"
    cfg.write_text("[alerts]\ntimezone = \"UTC\"\n")
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(cfg))
    monkeypatch.setenv("PREFIXSCOPE_DB", db_path)
    return db_path


def _open(db: str, day: date = DAY):
    from tests.dashboard_support import run_app

    at = run_app(db, "views/alerts.py")
    at.date_input(key="alerts_day").set_value(day)
    at.run()
    return at


def test_alerts_page_shows_the_report_and_the_sends(alerts_db):
    from tests.dashboard_support import metrics, texts

    at = _open(alerts_db)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    m = metrics(at)
    assert m["Status"] == "ALERT"  # coloured text, no emoji (fonts)
    assert m["ALERT lines"] == "1" and m["Stale sources"] == "1"
    report = at.dataframe[0].value
    assert "12,000 of 100,000 prompt tokens from cache (12.0%): ALERT: check the top of the prompt" \
        in report["Report line"].tolist()
    assert "STALE" in report["Status"].tolist()
    # the sentence, hidden in the grid (it was cut at 1400 px), is shown whole under it
    import re

    shown = [ln for ln in texts(at, "markdown") if ln.startswith("- :")]
    assert len(shown) == 1, shown  # one list, a bullet per line, values escaped
    lines = re.sub(r"\\(.)", r"\1", shown[0]).split("\n")
    assert lines == [
        "- :orange-badge[STALE] **qwen-small**: 45,000 of 50,000 prompt tokens from cache (90.0%): "
        "STALE: no scrape from vllm-b:8000 after 2026-11-28 09:30, scraped every 3600 s before",
        "- :red-badge[ALERT] **tiny-llama**: 12,000 of 100,000 prompt tokens from cache (12.0%): "
        "ALERT: check the top of the prompt"], lines
    warnings = texts(at, "warning")
    assert any("STALE: no scrape from `vllm-b:8000` (qwen-small)" in w for w in warnings)
    # md_text puts an invisible word joiner after the @: no mailto link from the data
    assert any("1 send(s) failed" in w
               and "team@\u2060example.com: connection refused" in w for w in warnings)
    sends = at.dataframe[-1].value
    assert sorted(sends["Status"].tolist()) == ["failed", "sent"]
    assert set(sends["Recipients"]) == {"oncall@example.com", "team@example.com"}
    assert all(s.startswith("[prefixscope] ALERT tiny-llama 12.0% hit rate") for s in sends["Subject"])


def test_alerts_page_on_a_day_without_data(alerts_db):
    from tests.dashboard_support import metrics, texts

    at = _open(alerts_db, DAY - timedelta(days=30))
    assert not at.exception and not at.error
    assert metrics(at)["Status"] == "NO DATA"
    assert any("No prefix-cache data for this day" in t for t in texts(at, "info"))


def test_alerts_page_on_an_empty_database(db_path, tmp_path, monkeypatch):
    from tests.dashboard_support import build_empty_db, run_app, texts

    build_empty_db(db_path)
    monkeypatch.setenv("PREFIXSCOPE_DB", db_path)
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    at = run_app(db_path, "views/alerts.py")
    assert not at.exception and not at.error
    assert any("No report email recorded yet" in t for t in texts(at, "caption"))
