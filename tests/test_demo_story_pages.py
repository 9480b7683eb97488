"""The demo's story on the pages it concerns, in AppTest (issue 14, gaps a-e): a demo built
now (the default range shows it), without the replay runs (not needed here).

- Overview: the regression is visible without a click: a banner "coder-7b below 50.0% since
  <day 5>" and a daily status strip with ALERT from day 5, while the KPI stays the range's
  total (item 4) and the latest window its own labelled figure.
- Alerts: opens on day 5 (the day the latest alert began) and says so; a bad ``?day=`` or
  ``?tz=`` is named in a warning, not silently replaced.
- Savings: what the regression cost since day 5, against the hit rate before it.
- The daily report links to the dashboard URL it is given (``--dashboard-url``).
"""

from __future__ import annotations

import re
from datetime import date

import pytest

from tests import dashboard_support as ds

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    from prefixscope.cli.demo import build_demo

    path = tmp_path_factory.mktemp("story") / "demo.duckdb"
    report = build_demo(str(path), with_replay=False)
    release_day = next(s for s in report.steps if "release: built" in s).split()[2]
    return str(path), release_day


@pytest.fixture
def use_db(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no ./prefixscope.toml of the repository
    monkeypatch.delenv("PREFIXSCOPE_CONFIG", raising=False)

    def _use(db: str) -> str:
        monkeypatch.setenv("PREFIXSCOPE_DB", db)
        return db
    return _use


def _alerts(db: str, params: dict[str, str] | None = None):
    at = ds.run_app(db, None, timeout_s=180)
    for k, v in (params or {}).items():
        at.query_params[k] = v
    ds.switch(at, "views/alerts.py")
    at.run()
    return at


def test_daily_statuses_of_the_demo_read_alert_from_day_5(story):
    from prefixscope.alerts.daily import alert_since, daily_statuses
    from prefixscope.core.config import AlertsConfig
    from prefixscope.store import db as store_db

    db, release_day = story
    day5 = date.fromisoformat(release_day)
    with store_db.reader(db) as con:
        rows = daily_statuses(con, first_day=date.fromordinal(day5.toordinal() - 4),
                              last_day=date.fromordinal(day5.toordinal() + 2), tz="UTC",
                              cfg=AlertsConfig())
    coder = {s.day: s for s in rows if s.model == "coder-7b"}
    assert all(coder[d].status == "OK" for d in coder if d < day5)
    assert all(coder[d].status == "ALERT" for d in coder if d >= day5)
    assert len([d for d in coder if d >= day5]) == 3
    assert {s.status for s in rows if s.model == "agent-32b"} == {"OK"}
    assert {m: s.day for m, s in alert_since(rows).items()} == {"coder-7b": day5}
    # the same figures as the daily report of day 5 (counters, Δhits / Δqueries)
    from prefixscope.alerts.daily import build_daily_report

    with store_db.reader(db) as con:
        rep = build_daily_report(con, day=day5, tz="UTC", cfg=AlertsConfig())
    line = next(ln for ln in rep.lines if ln.model == "coder-7b" and not ln.is_detail)
    assert (line.figures.cached_tokens, line.figures.prompt_tokens) == (
        coder[day5].figures.cached_tokens, coder[day5].figures.prompt_tokens)


def test_overview_shows_the_regression_without_a_click(story, use_db):
    db, release_day = story
    use_db(db)
    at = ds.first_run(db, timeout_s=180)
    ds.assert_clean(at)
    banner = [w for w in ds.texts(at, "warning") if "below" in w]
    assert len(banner) == 1, ds.texts(at, "warning")
    assert f"**coder-7b below 50.0% since {release_day}**" in banner[0]
    assert ":red-badge[ALERT]" in banner[0]
    strip = [m for m in ds.texts(at, "markdown") if "-badge[" in m and "%" in m
             and "window" not in m]
    alerts = [m for m in strip if ":red-badge[ALERT]" in m]
    assert len(alerts) == 3 and len(strip) >= 10  # days 5-7 of coder-7b; days 1-7 of agent-32b
    kpi = ds.metrics(at)
    whole = float(kpi["coder-7b · whole range"].rstrip("%"))
    assert 50.0 < whole < 70.0  # item 4: the KPI is the range's total (five good days in it)
    assert any(re.search(r"Latest 1h window: \*\*\d+\.\d%\*\* :red-badge\[ALERT\]", m)
               for m in ds.texts(at, "markdown"))


def test_alerts_opens_on_the_day_the_alert_began(story, use_db):
    db, release_day = story
    use_db(db)
    at = _alerts(db)
    ds.assert_clean(at)
    assert at.date_input(key="alerts_day").value == date.fromisoformat(release_day)
    assert any(c.startswith(f"Showing {release_day}, the day the latest alert began: "
                            "coder-7b") for c in ds.texts(at, "caption"))
    assert any(f"Daily report {release_day} (UTC)" in s for s in ds.texts(at, "subheader"))
    assert ds.metrics(at)["Status"] == "ALERT"


@pytest.mark.parametrize("params,named", [({"day": "9999-99-99"}, "`day`"),
                                          ({"day": "2026-11-29", "tz": "Mars/Olympus"}, "`tz`")])
def test_alerts_names_a_bad_link_parameter(story, use_db, params, named):
    db, release_day = story
    use_db(db)
    at = _alerts(db, params)
    ds.assert_clean(at)
    warnings = ds.texts(at, "warning")
    assert any(f"The link's {named} parameter" in w for w in warnings), warnings
    page_text = " ".join(ds.texts(at, "warning") + ds.texts(at, "caption")
                         + ds.texts(at, "markdown"))
    assert "--tz" not in page_text
    if named == "`day`":  # the default day: the day the alert began
        assert at.date_input(key="alerts_day").value == date.fromisoformat(release_day)


def test_savings_says_what_the_regression_cost(story, use_db):
    db, release_day = story
    use_db(db)
    at = ds.run_app(db, "views/savings.py", timeout_s=180)
    ds.assert_clean(at)
    assert ds.texts(at, "subheader").count("What the regression cost") == 1
    assert len([m for m in at.metric if m.label.startswith("coder-7b: cost since")]) == 1
    kpi = ds.metrics(at)
    cost = kpi[f"coder-7b: cost since {release_day}"]
    assert re.fullmatch(r"\$\d+\.\d\d", cost) and float(cost[1:]) > 0
    before, since = (float(x.rstrip("%")) for x in kpi["Hit rate: before → since"].split(" → "))
    assert before > 70.0 and since < 50.0
    assert int(kpi["Tokens recomputed beyond the baseline"].replace(",", "")) > 1_000_000
    assert len([c for c in at.get("plotly_chart")]) >= 4  # one miss-cost chart per model


def test_report_daily_links_to_the_given_dashboard_url(story, cli, tmp_path):
    db, release_day = story
    config = tmp_path / "prefixscope.toml"
    config.write_text("")
    code, out, _ = cli(["report", "daily", "--db", db, "--date", release_day, "--tz", "UTC",
                        "--config", str(config), "--dashboard-url", "http://dash.test:8600"])
    assert code == 0, out
    assert f"Dashboard: http://dash.test:8600/alerts?day={release_day}&tz=UTC" in out
    assert "Definitions: http://dash.test:8600/alerts" in out
    assert "localhost:8501" not in out
