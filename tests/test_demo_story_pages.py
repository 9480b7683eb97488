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
import time
from datetime import date

import pytest

from tests import dashboard_support as ds

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture
def story(demo_build):
    """The run's one demo build (tests/conftest.py ``demo_build``, 00:30 UTC today: the story's
    week is the seven full UTC days before today whatever the hour, so these pages read the
    same figures as a build at any hour would; session 7 finding 3: a build at 00:32 had a
    32-minute day 7) and its release day; the step line names the release as the story tells it."""
    line = next(s for s in demo_build.report.steps if "the week is in the database" in s)
    assert re.search(r"\(day 5, (\d{4}-\d\d-\d\d): the release adds a timestamp to "
                     r"coder-7b's system prompt at 07:00 UTC on gpu-a1, 09:30 UTC on "
                     r"gpu-a2\): built in \d+ s, ingested in \d+ s", line)
    return demo_build.path, demo_build.release_day


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


def test_the_story_week_is_seven_full_days_before_the_build_day_at_any_hour(story):
    """A build at 00:30 and one at 23:59 UTC make the same week: the seven full UTC days
    before the build's day (session 7 finding 3), so day 7 is never a few minutes long."""
    from prefixscope.replay.production_week import full_week_end, week_span
    from prefixscope.store import db as store_db

    day = 1796169600.0  # 2026-12-02 00:00 UTC
    for now in (day + 1800.0, day + 86340.0, day):
        assert full_week_end(now) == day
        assert week_span(full_week_end(now)) == (day - 7 * 86400, day)
    assert week_span(day + 1800.0) == (day - 6 * 86400, day + 1800.0)  # an explicit end
    db, release_day = story
    today = time.time() // 86400 * 86400
    with store_db.reader(db) as con:
        lo, hi, days = con.execute(
            "SELECT min(ts_unix_s), max(ts_unix_s), count(DISTINCT floor(ts_unix_s / 86400)) "
            "FROM requests WHERE run_id = ''").fetchone()
    assert today - 7 * 86400 <= lo < today - 7 * 86400 + 3600 and today - 3600 < hi < today
    assert days == 7


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
    # "Latest 1h window, from <time> UTC, ended <age> ago: **5.3%** ALERT" (issue 28 #3: the
    # latest window says when it was)
    assert any(re.search(r"Latest 1h window\b.*?: \*\*\d+\.\d%\*\* :red-badge\[ALERT\]", m)
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


def test_release_day_carries_a_normal_days_traffic_and_its_misses_step_up(story):
    """Issue 14 leftover 2: day 5 is no weekend-like low day whatever weekday the demo is built
    on (the generator's traffic curve is the same every day), so coder-7b's cost of the misses
    steps up on day 5 itself, not only from day 6."""
    from prefixscope.replay.production_week import rate_factor
    from prefixscope.store import db as store_db
    from prefixscope.store.queries import savings as q

    sunday_1430 = 1795962600.0  # 2026-11-29 14:30 UTC
    assert [rate_factor(sunday_1430 + d * 86400) for d in range(7)] == [rate_factor(sunday_1430)] * 7
    db, release_day = story
    with store_db.reader(db) as con:
        days = q.savings_by_window(con, start_s=None, end_s=None, window_s=86400.0,
                                   models=("coder-7b",), instances=None, run_ids=("",))
    # production traffic only, as the Savings page opens (the demo's diagnose run is a replay
    # placed at the build time: a build just before midnight puts it on an eighth day)
    days = days[days["model"] == "coder-7b"].sort_values("window_start_s")
    assert len(days) == 7
    traffic = [float(x) for x in days["cost_without_cache"]]  # every prompt token, priced
    miss = [float(x) for x in days["miss_cost"]]
    normal = sum(traffic[:4]) / 4
    assert 0.8 * normal < traffic[4] < 1.2 * normal  # day 5: a normal day's prompt tokens
    assert miss[4] > max(miss[:4])  # its misses cost more than any day before the release
    assert miss[5] > miss[4] and miss[6] > 0  # day 6: the whole day after the release


def _counter_badges(at) -> list[tuple[int, int]]:
    """Overview's per-model ``hits of queries tokens (vLLM counters)`` badges, sorted by model."""
    return [tuple(int(g.replace(",", "")) for g in got.groups())
            for got in (re.search(r"-badge\[\w+\] ([\d,]+) of ([\d,]+) tokens "
                                  r"\(vLLM counters\)$", m) for m in ds.texts(at, "markdown"))
            if got]


def _all_range(at) -> None:
    at.radio(key="filter_range").set_value("all")


def test_overview_and_savings_name_their_token_sources_and_differ_only_by_the_last_scrape(
        story, use_db):
    """Issue 14 leftover 1: Overview's per-model tokens are the counters', Savings' the usage
    log's; each page says so, and over the whole range ("all") the difference is exactly the
    requests logged after the last scrape (a counter counts a request at the first scrape after
    it). The range is pinned: the default ``7d`` ends now and so starts inside day 1 at any hour
    but midnight, where the first scrape in the range also counts the requests just before it
    (the next test; this one failed in CI at 07:32 UTC when it read the default range)."""
    from prefixscope.store import db as store_db

    db, _ = story
    use_db(db)
    ov = ds.run_app(db, None, timeout_s=180, setup=_all_range)
    counters = _counter_badges(ov)
    assert len(counters) == 2  # agent-32b, coder-7b (sorted by model)
    sv = ds.run_app(db, "views/savings.py", timeout_s=180, setup=_all_range)
    ds.assert_clean(sv)
    assert any(c.startswith("Tokens from the usage log") for c in ds.texts(sv, "caption"))
    table = sv.dataframe[0].value.set_index("Model")
    with store_db.reader(db) as con:
        for k, model in enumerate(("agent-32b", "coder-7b")):
            late = con.execute(
                "SELECT coalesce(sum(r.prompt_tokens), 0), coalesce(sum(r.cached_tokens), 0) "
                "FROM requests r WHERE r.run_id = '' AND r.model = ? AND r.ts_unix_s > ("
                " SELECT max(m.ts_unix_s) FROM metric_samples m WHERE m.run_id = '' "
                " AND m.instance = r.instance AND m.metric = 'vllm:prefix_cache_queries_total')",
                [model]).fetchone()
            log_prompt = int(table.loc[model, "Prompt tokens"].replace(",", ""))
            log_cached = int(table.loc[model, "Cached tokens"].replace(",", ""))
            hits, queries = counters[k]
            assert (log_prompt - queries, log_cached - hits) == late, model


def test_overview_default_range_counts_from_the_scrape_before_its_start(story, use_db):
    """On the default range (``7d``, ending now, so starting inside the story's day 1 at any
    hour but midnight) Overview's counter figure is the requests after each instance's last
    scrape before the range's start up to its last scrape: the first scrape in the range counts
    the requests just before the start (docs/metrics.md#two-sources-of-token-counts). The
    range is the one the page itself used (read back from its session)."""
    from prefixscope.store import db as store_db

    db, _ = story
    use_db(db)
    ov = ds.first_run(db, timeout_s=180)
    f = ov.session_state["prefixscope.filters"]
    assert f.range_label == "7d" and f.start_s is not None and f.end_s is None
    counters = _counter_badges(ov)
    assert len(counters) == 2
    with store_db.reader(db) as con:
        for k, model in enumerate(("agent-32b", "coder-7b")):
            counted = con.execute(
                "WITH s AS (SELECT instance, max(ts_unix_s) FILTER (WHERE ts_unix_s < ?) AS lo,"
                " max(ts_unix_s) AS hi FROM metric_samples WHERE run_id = '' AND model = ? "
                " AND metric = 'vllm:prefix_cache_queries_total' GROUP BY instance) "
                "SELECT coalesce(sum(r.cached_tokens), 0), coalesce(sum(r.prompt_tokens), 0) "
                "FROM requests r JOIN s USING (instance) WHERE r.run_id = '' AND r.model = ? "
                "AND r.ts_unix_s > coalesce(s.lo, -1e18) AND r.ts_unix_s <= s.hi",
                [f.start_s, model, model]).fetchone()
            assert counters[k] == counted, model
