"""The daily report model: statuses OK / ALERT / NO DATA / STALE, comparisons, scopes, falls,
day boundaries, on databases built through the real ingest functions (``tests/alerts_support``).
"""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from prefixscope.alerts.daily import DayWindow, build_daily_report, default_day, parse_day, resolve_tz
from prefixscope.core.report import ALERT, NO_DATA, OK, STALE
from prefixscope.core.config import AlertsConfig
from prefixscope.core.errors import ConfigError, UsageError
from tests.alerts_support import CounterSource, ingest_usage_lines, local_ts, requests_for

DAY = date(2026, 11, 28)  # a Saturday
MODEL = "tiny-llama"


def _after(day: date = DAY, tz: str = "UTC") -> float:
    """A "now" six hours after the end of ``day``."""
    return local_ts(day, 30, tz)


def _report(con, cfg: AlertsConfig | None = None, *, day: date = DAY, tz: str = "UTC",
            now: float | None = None):
    return build_daily_report(con, day=day, tz=tz, cfg=cfg or AlertsConfig(),
                              now_unix_s=_after(day, tz) if now is None else now)


def _line(report, model: str = MODEL, scope: str | None = None):
    found = [ln for ln in report.lines if ln.model == model and ln.scope == scope]
    assert len(found) == 1, [(ln.model, ln.scope) for ln in report.lines]
    return found[0]


def _source(tmp_path, instance: str = "vllm-a:8000", model: str = MODEL,
            created: date = DAY - timedelta(days=9)) -> CounterSource:
    folder = tmp_path / instance.replace(":", "_")
    folder.mkdir(exist_ok=True)
    return CounterSource(folder, instance, model, created_unix_s=local_ts(created, 0))


# --- the users' line ----------------------------------------------------------------------


def test_ok_day_reads_the_users_line(con, tmp_path):
    src = _source(tmp_path)
    src.day(con, DAY - timedelta(days=1), queries=600_000, hits=570_000, every_h=3)
    src.day(con, DAY, queries=644_000, hits=608_000, every_h=1)
    rep = _report(con)
    line = _line(rep)
    assert line.status == OK
    assert line.text == "608,000 of 644,000 prompt tokens from cache (94.4%): OK"
    assert line.figures.source == "metrics"
    assert (line.figures.cached_tokens, line.figures.prompt_tokens) == (608_000, 644_000)
    assert rep.status == OK


def test_alert_day_reads_the_users_line(con, tmp_path):
    src = _source(tmp_path)
    src.day(con, DAY - timedelta(days=1), queries=10_000, hits=9_000, every_h=6)
    src.day(con, DAY, queries=644_000, hits=0, every_h=2)
    line = _line(_report(con))
    assert line.status == ALERT
    assert line.text == "0 of 644,000 prompt tokens from cache (0.0%): ALERT: check the top of the prompt"


def test_ok_and_alert_lines_equal_the_report_command_lines(con, tmp_path):
    """The daily line for OK/ALERT is exactly what ``prefixscope report`` (H2) prints."""
    from prefixscope.store.queries.requests import report_lines

    src = _source(tmp_path)
    src.day(con, DAY - timedelta(days=1), queries=1_000, hits=0, every_h=12)
    src.day(con, DAY, queries=12_345, hits=6_172, every_h=4)  # 49.996%: ALERT, never printed 50.0% (fmt_share_vs)
    w = DayWindow.of(DAY, "UTC")
    theirs = [ln for ln in report_lines(con, start_s=w.start_s, end_s=w.end_s, threshold=0.5)
              if ln.model == MODEL]
    ours = _line(_report(con))
    assert ours.status == ALERT and "(49.996%)" in ours.text
    assert [ours.text] == [ln.text for ln in theirs]


def test_threshold_is_inclusive_and_per_model(con, tmp_path):
    a = _source(tmp_path, "a:8000", "model-a")
    b = _source(tmp_path, "b:8000", "model-b")
    for src in (a, b):
        src.day(con, DAY - timedelta(days=1), queries=0, hits=0, every_h=12)
        src.day(con, DAY, queries=10_000, hits=6_000, every_h=4)
    rep = _report(con, AlertsConfig(per_model_threshold={"model-b": 0.7}))
    assert _line(rep, "model-a").status == OK          # 60% >= 50%
    assert _line(rep, "model-b").status == ALERT       # 60% < 70%
    assert _line(rep, "model-b").threshold == 0.7
    exact = _report(con, AlertsConfig(hit_rate_threshold=0.6))
    assert _line(exact, "model-a").status == OK        # exactly at the threshold is OK


def test_bad_per_model_threshold_is_a_config_error(con):
    with pytest.raises(ConfigError, match="per_model_threshold.m"):
        _report(con, AlertsConfig(per_model_threshold={"m": 1.5}))


# --- NO DATA ------------------------------------------------------------------------------


def test_cold_restart_with_one_queried_token_is_no_data_not_alert(con, tmp_path):
    """A server started at 23:50 answers one 1-token query with no hit: 0 of 1 is not an alert."""
    src = _source(tmp_path, created=DAY)
    src.restart(local_ts(DAY, 23 + 50 / 60))
    src.scrape(con, local_ts(DAY, 23 + 51 / 60), queries=1, hits=0)
    for minute in range(52, 60):
        src.scrape(con, local_ts(DAY, 23 + minute / 60))
    line = _line(_report(con))
    assert line.status == NO_DATA
    assert line.text == ("0 of 1 prompt tokens from cache (0.0%): NO DATA: under 1,000 prompt "
                         "tokens in the day")
    assert _report(con).status == NO_DATA


def test_volume_guard_is_configurable(con, tmp_path):
    src = _source(tmp_path)
    src.day(con, DAY, queries=5_000, hits=100, every_h=4)
    assert _line(_report(con, AlertsConfig(min_query_tokens=10_000))).status == NO_DATA
    assert _line(_report(con, AlertsConfig(min_query_tokens=5_000))).status == ALERT


def test_model_named_in_config_without_data_reads_no_data(con):
    rep = _report(con, AlertsConfig(recipients_by_model={"llama-70b": ["a@example.com"]}))
    line = _line(rep, "llama-70b")
    assert line.status == NO_DATA and line.figures.source == "none"
    assert line.text.startswith("0 of 0 prompt tokens from cache: NO DATA")


def test_empty_database_has_no_lines_and_reads_no_data(con):
    rep = _report(con)
    assert rep.lines == () and rep.status == NO_DATA


# --- STALE --------------------------------------------------------------------------------


def test_source_that_stopped_mid_day_is_stale(con, tmp_path):
    """Scraped every 15 min until 14:00, then silent: STALE, naming the source and 14:00."""
    src = _source(tmp_path)
    src.day(con, DAY, queries=900_000, hits=850_000, every_h=0.25, first_h=9.0, last_h=14.0)
    rep = _report(con)
    line = _line(rep)
    assert line.status == STALE
    assert "no scrape from vllm-a:8000 after 2026-11-28 14:00, scraped every 900 s before" in line.text
    assert line.text.startswith("850,000 of 900,000 prompt tokens from cache (94.4%): STALE")
    (s,) = rep.stale_sources
    assert s.median_gap_s == 900 and s.stale_after_s == 3600  # max(900, 4 x 900)
    assert rep.status == STALE


@pytest.mark.parametrize(("last_minute", "stale"), [(45, False), (35, True)])
def test_stale_boundary_uses_the_scrape_interval(con, tmp_path, last_minute, stale):
    """Scrapes every 5 min: stale after max(900 s, 4 x 300 s) = 1200 s of silence before 24:00.
    Last scrape 23:45 (900 s before the end): not stale; 23:35 (1500 s): stale."""
    src = _source(tmp_path)
    src.day(con, DAY, queries=50_000, hits=40_000, every_h=1 / 12, first_h=21.0,
            last_h=23 + last_minute / 60)
    rep = _report(con)
    assert (_line(rep).status == STALE) is stale
    if stale:
        assert rep.stale_sources[0].stale_after_s == 1200


def test_source_silent_all_day_after_reporting_the_day_before_is_stale(con, tmp_path):
    src = _source(tmp_path)
    src.day(con, DAY - timedelta(days=1), queries=100_000, hits=90_000, every_h=1)
    rep = _report(con)
    line = _line(rep)
    assert line.status == STALE and line.figures.source == "none"
    assert "after 2026-11-27 23:30" in line.text


def test_stale_cutoff_is_now_for_a_day_not_over(con, tmp_path):
    """Reporting today at 12:10 with scrapes until 12:00: not stale (the day is not over)."""
    src = _source(tmp_path)
    src.day(con, DAY, queries=20_000, hits=19_000, every_h=0.25, first_h=9.0, last_h=12.0)
    rep = _report(con, now=local_ts(DAY, 12 + 10 / 60))
    assert _line(rep).status == OK


def test_one_stale_instance_makes_its_model_stale_but_not_others(con, tmp_path):
    a = _source(tmp_path, "a:8000", "model-a")
    b = _source(tmp_path, "b:8000", "model-b")
    a.day(con, DAY, queries=20_000, hits=19_000, every_h=1, first_h=0.0, last_h=10.0)
    b.day(con, DAY, queries=20_000, hits=19_000, every_h=1)
    rep = _report(con)
    assert _line(rep, "model-a").status == STALE
    assert _line(rep, "model-b").status == OK


# --- restarts, comparisons, scopes, namespaces ---------------------------------------------


def test_restart_during_the_day_counts_from_the_new_value(con, tmp_path):
    src = _source(tmp_path)
    src.day(con, DAY, queries=10_000, hits=9_000, every_h=1, first_h=0.5, last_h=11.5)
    src.restart(local_ts(DAY, 11.75))
    for k, h in enumerate((12.5, 13.5, 14.5)):
        src.scrape(con, local_ts(DAY, h), queries=2_000 + k, hits=0)
    src.day(con, DAY, queries=0, hits=0, every_h=1, first_h=15.5)
    line = _line(_report(con))
    assert line.figures.restarts == 1
    assert line.figures.prompt_tokens == 10_000 + 6_003
    assert line.figures.cached_tokens == 9_000


def test_changes_against_previous_day_and_same_weekday_a_week_earlier(con, tmp_path):
    src = _source(tmp_path, created=DAY - timedelta(days=10))
    src.day(con, DAY - timedelta(days=7), queries=100_000, hits=90_000, every_h=4)
    src.day(con, DAY - timedelta(days=1), queries=100_000, hits=80_000, every_h=4)
    src.day(con, DAY, queries=100_000, hits=30_000, every_h=4)
    rep = _report(con)
    line = _line(rep)
    assert line.prev_day.hit_rate == pytest.approx(0.8)
    assert line.prev_week.hit_rate == pytest.approx(0.9)
    assert line.change_prev_day == pytest.approx(-0.5)
    assert line.change_prev_week == pytest.approx(-0.6)
    assert [c.model for c in rep.fell_models] == [MODEL]


def test_change_is_none_against_a_no_data_day(con, tmp_path):
    src = _source(tmp_path)
    src.day(con, DAY - timedelta(days=1), queries=10, hits=10, every_h=12)
    src.day(con, DAY, queries=100_000, hits=30_000, every_h=4)
    line = _line(_report(con))
    assert line.prev_day is not None and line.change_prev_day is None


def test_scope_lines_and_namespaces_that_fell_most(con, tmp_path):
    lines = []
    for day, good, bad in ((DAY - timedelta(days=1), 900, 950), (DAY, 900, 100)):
        lines += requests_for(day, model=MODEL, n=4, prompt_tokens=1_000, cached_tokens=good,
                              scope="PUBLIC", tenant_digest="aaaa1111")
        lines += requests_for(day, model=MODEL, n=4, prompt_tokens=1_000, cached_tokens=bad,
                              scope="TENANT", tenant_digest="bbbb2222")
    ingest_usage_lines(con, tmp_path / "usage.jsonl", lines)
    rep = _report(con)
    model_line = _line(rep)
    assert model_line.figures.source == "requests"
    assert model_line.figures.prompt_tokens == 8_000
    assert _line(rep, scope="PUBLIC").status == OK
    tenant = _line(rep, scope="TENANT")
    assert tenant.status == ALERT
    assert tenant.text == "400 of 4,000 prompt tokens from cache (10.0%): ALERT: check the top of the prompt"
    assert tenant.change_prev_day == pytest.approx(-0.85)
    assert [(c.tenant_digest, round(c.change, 2)) for c in rep.fell_namespaces] == [("bbbb2222", -0.85)]
    # scope lines follow their model line
    keys = [(ln.model, ln.scope) for ln in rep.lines]
    assert keys == [(MODEL, None), (MODEL, "PUBLIC"), (MODEL, "TENANT")]


def test_counters_win_over_requests_for_the_model_line(con, tmp_path):
    src = _source(tmp_path)
    src.day(con, DAY, queries=100_000, hits=95_000, every_h=4)
    ingest_usage_lines(con, tmp_path / "u.jsonl", requests_for(
        DAY, model=MODEL, n=3, prompt_tokens=1_000, cached_tokens=0, scope="TENANT"))
    rep = _report(con)
    assert _line(rep).figures.source == "metrics" and _line(rep).status == OK
    assert _line(rep, scope="TENANT").figures.source == "requests"


def test_requests_without_cached_tokens_and_replay_runs_do_not_count(con, tmp_path):
    lines = requests_for(DAY, model=MODEL, n=4, prompt_tokens=1_000, cached_tokens=800)
    lines += [ln.replace('"prompt_tokens_details": {"cached_tokens": 800}',
                         '"prompt_tokens_details": null')
              for ln in requests_for(DAY, model=MODEL, n=4, prompt_tokens=1_000,
                                     cached_tokens=800, prefix="unreported-")]
    lines += requests_for(DAY, model=MODEL, n=4, prompt_tokens=1_000, cached_tokens=0,
                          prefix="replay-", run_id="replay-sim-1")
    ingest_usage_lines(con, tmp_path / "u.jsonl", lines)
    line = _line(_report(con))
    assert (line.figures.cached_tokens, line.figures.prompt_tokens) == (3_200, 4_000)
    assert line.figures.requests == 8 and line.figures.coverage == pytest.approx(0.5)


# --- the day --------------------------------------------------------------------------------


def test_day_window_across_dst_is_23_hours_and_holds_the_last_local_hour(con, tmp_path):
    tz = "Europe/Berlin"
    spring = date(2026, 3, 29)
    w = DayWindow.of(spring, tz)
    assert w.length_s == 23 * 3600
    assert w.start_s == local_ts(spring, 0, tz)
    lines = [ln for ln in requests_for(spring, model=MODEL, n=2, prompt_tokens=1_000,
                                       cached_tokens=900, tz=tz)]
    from tests.alerts_support import usage_line

    lines.append(usage_line(request_id="late", ts_unix_s=local_ts(spring, 23.9, tz), model=MODEL,
                            prompt_tokens=1_000, cached_tokens=0))
    lines.append(usage_line(request_id="next", ts_unix_s=local_ts(spring, 24.1, tz), model=MODEL,
                            prompt_tokens=5_000, cached_tokens=0))
    ingest_usage_lines(con, tmp_path / "u.jsonl", lines)
    line = _line(_report(con, day=spring, tz=tz))
    assert line.figures.prompt_tokens == 3_000 and line.figures.cached_tokens == 1_800


def test_default_day_is_yesterday_in_the_zone():
    now = local_ts(DAY, 0.5, "UTC")  # 00:30 UTC on the 28th = 19:30 on the 27th in New York
    assert default_day("UTC", now_unix_s=now) == DAY - timedelta(days=1)
    assert default_day("America/New_York", now_unix_s=now) == DAY - timedelta(days=2)


def test_bad_zone_and_bad_date_are_usage_errors():
    with pytest.raises(UsageError, match="unknown time zone 'Mars/Olympus'"):
        resolve_tz("Mars/Olympus")
    with pytest.raises(UsageError, match="YYYY-MM-DD"):
        parse_day("28.11.2026")


def test_report_json_has_no_raw_tenant_ids(con, tmp_path):
    """Only digests reach the report: a raw tenant id in a usage line is never stored."""
    from tests.alerts_support import usage_line

    raw = usage_line(request_id="r1", ts_unix_s=local_ts(DAY, 3), model=MODEL,
                     prompt_tokens=2_000, cached_tokens=100, scope="TENANT")
    raw = raw[:-1] + ', "tenant": "acme-corp-secret"}'
    ingest_usage_lines(con, tmp_path / "u.jsonl", [raw])
    import json

    text = json.dumps(_report(con).as_dict(), default=str)
    assert "acme-corp-secret" not in text


def test_legal_research_example_line_and_savings(con, tmp_path):
    """The product brief's example: a 32,000-token prefix, 20 questions of 200 tokens, 500-token
    answers, the first a miss; Rs 0.10 / 0.02 / 0.40 per 1,000 input / cached / output tokens.
    The day reads 608,000 of 644,000 (94.4%): OK, and saves Rs 68.40 - Rs 19.76 = Rs 48.64."""
    from prefixscope.ingest.prices import load_prices
    from tests.alerts_support import usage_line

    prices = tmp_path / "prices.toml"
    prices.write_text('[models."legal-research"]\ncurrency = "INR"\ninput = 100.0\n'
                      'cached_input = 20.0\noutput = 400.0\nsource = "product brief example"\n')
    load_prices(con, prices)
    lines = [usage_line(request_id=f"q{i}", ts_unix_s=local_ts(DAY, 9 + i / 10),
                        model="legal-research", prompt_tokens=32_200,
                        cached_tokens=0 if i == 0 else 32_000, completion_tokens=500)
             for i in range(20)]
    ingest_usage_lines(con, tmp_path / "legal.jsonl", lines)
    line = _line(_report(con), "legal-research")
    assert line.text == "608,000 of 644,000 prompt tokens from cache (94.4%): OK"
    assert line.currency == "INR" and line.shadow_price is False
    assert line.cost_without_cache == pytest.approx(68.40)
    assert line.saved == pytest.approx(48.64)
    from prefixscope.alerts.render import render_text

    assert "saved INR 48.64 (list price)" in render_text(_report(con))
