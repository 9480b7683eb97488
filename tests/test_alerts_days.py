"""Day-by-day statuses (Overview's strip, the Alerts page's opening day), the cost of a
regression, and the dashboard URL the email links to (issue 14: a, b, c, e)."""

from __future__ import annotations

from datetime import date

import pytest

from prefixscope.alerts.daily import (ALERT, NO_DATA, DayStatus, Figures, alert_since,
                                      opening_day, regression_cost)
from prefixscope.core.config import Settings, dashboard_url, served_url
from prefixscope.core.report import OK


def _day(d: int, status: str, model: str = "coder-7b", rate: float = 0.4) -> DayStatus:
    return DayStatus(day=date(2026, 11, d), model=model,
                     figures=Figures("metrics", 1000, int(rate * 1000), rate), threshold=0.5,
                     status=status)


def test_alert_since_is_the_first_day_of_the_latest_alert_run():
    days = [_day(24, ALERT), _day(25, OK), _day(26, OK), _day(27, ALERT), _day(28, NO_DATA),
            _day(29, ALERT), _day(25, OK, "agent-32b"), _day(29, OK, "agent-32b")]
    since = alert_since(days)
    assert set(since) == {"coder-7b"}  # agent-32b's last day is OK
    assert since["coder-7b"].day == date(2026, 11, 27)  # NO DATA inside the run does not break it


def test_alert_since_needs_the_last_counted_day_to_be_alert():
    assert alert_since([_day(27, ALERT), _day(28, OK), _day(29, NO_DATA)]) == {}


def test_opening_day_is_the_start_of_the_newest_alert_else_the_fallback():
    fallback = date(2026, 11, 30)
    days = [_day(25, OK), _day(26, ALERT), _day(27, ALERT), _day(28, ALERT),
            _day(25, ALERT, "agent-32b"), _day(26, OK, "agent-32b")]
    assert opening_day(days, fallback=fallback) == (date(2026, 11, 26), "coder-7b")
    # an alert that ended still opens the page on the day it began
    ended = [_day(25, OK), _day(26, ALERT), _day(27, ALERT), _day(28, OK)]
    assert opening_day(ended, fallback=fallback) == (date(2026, 11, 26), "coder-7b")
    assert opening_day([_day(25, OK), _day(26, NO_DATA)], fallback=fallback) == (fallback, None)
    assert opening_day([], fallback=fallback) == (fallback, None)


def test_regression_cost_worked_example():
    # docstring example: 1,000,000 prompt tokens since, 400,000 cached, baseline 75%, misses
    # USD 0.12 (600,000 missed tokens at USD 0.20 per million)
    rc = regression_cost(baseline_hit_rate=0.75, prompt_tokens=1_000_000, cached_tokens=400_000,
                         miss_cost=0.12)
    assert rc.extra_tokens == 350_000
    assert rc.cost == pytest.approx(0.07)
    assert rc.hit_rate == pytest.approx(0.4)
    better = regression_cost(baseline_hit_rate=0.3, prompt_tokens=100, cached_tokens=50,
                             miss_cost=1.0)
    assert (better.extra_tokens, better.cost) == (0, 0.0)  # no regression: nothing lost
    unpriced = regression_cost(baseline_hit_rate=0.75, prompt_tokens=100, cached_tokens=10,
                               miss_cost=None)
    assert unpriced.extra_tokens == 65 and unpriced.cost is None
    assert regression_cost(baseline_hit_rate=0.75, prompt_tokens=0, cached_tokens=0,
                           miss_cost=0.0) is None


def test_dashboard_url_precedence(monkeypatch):
    monkeypatch.delenv("PREFIXSCOPE_SERVED_URL", raising=False)
    default = Settings()
    assert dashboard_url(default) == "http://localhost:8501"
    monkeypatch.setenv("PREFIXSCOPE_SERVED_URL", "http://localhost:8642")
    assert dashboard_url(default) == "http://localhost:8642"  # the served port, not 8501
    explicit = Settings.model_validate({"alerts": {"dashboard_url": "http://alerts.example"}})
    assert dashboard_url(explicit) == "http://alerts.example"
    public = Settings.model_validate({"dashboard": {"public_url": "https://dash.example"},
                                      "alerts": {"dashboard_url": "http://alerts.example"}})
    assert dashboard_url(public) == "https://dash.example"
    assert dashboard_url(public, "https://flag.example") == "https://flag.example"


def test_dashboard_url_from_the_environment(monkeypatch, tmp_path):
    from prefixscope.core.config import load_settings

    cfg = tmp_path / "prefixscope.toml"
    cfg.write_text('[dashboard]\npublic_url = "https://file.example"\n')
    monkeypatch.setenv("PREFIXSCOPE_DASHBOARD_URL", "https://env.example")
    assert dashboard_url(load_settings(cfg)) == "https://env.example"


@pytest.mark.parametrize("host,port,url", [
    ("127.0.0.1", 8600, "http://localhost:8600"), ("0.0.0.0", 8501, "http://localhost:8501"),
    ("::", 9000, "http://localhost:9000"), ("dash.internal", 80, "http://dash.internal:80"),
    ("fd00::5", 8501, "http://[fd00::5]:8501")])
def test_served_url(host, port, url):
    assert served_url(host, port) == url


def test_the_dashboard_server_knows_its_own_address(tmp_path):
    from prefixscope.dashboard.server import streamlit_env

    env = streamlit_env(str(tmp_path / "x.duckdb"), port=8600, host="127.0.0.1")
    assert env["PREFIXSCOPE_SERVED_URL"] == "http://localhost:8600"
