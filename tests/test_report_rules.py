"""The report rules of prefixscope.core.report: one owner of the status, the thresholds and the
line for ``prefixscope report``, the daily report/email and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from zoneinfo import ZoneInfo

import pytest

from prefixscope.core import report
from prefixscope.core.config import AlertsConfig
from prefixscope.core.errors import ConfigError


def test_ok_at_the_threshold_alert_just_below_in_tokens():
    assert report.hit_status(5_000, 10_000, 0.5) == report.OK
    assert report.hit_status(4_999, 10_000, 0.5) == report.ALERT
    assert report.hit_status(0, 0, 0.5) == report.NO_DATA


def test_status_order_stale_then_volume_then_threshold():
    # STALE never hides ALERT (issue 11 item 8): under the threshold and silent reads ALERT
    assert report.status_of(0, 644_000, threshold=0.5, stale=True) == report.ALERT
    assert report.status_of(600_000, 644_000, threshold=0.5, stale=True) == report.STALE
    assert report.status_of(0, 0, threshold=0.5, stale=True) == report.STALE
    assert report.status_of(0, 999, threshold=0.5, min_query_tokens=1_000) == report.NO_DATA
    assert report.status_of(0, 1_000, threshold=0.5, min_query_tokens=1_000) == report.ALERT
    assert report.status_of(900, 1_000, threshold=0.5, min_query_tokens=1_000) == report.OK
    assert report.worst([report.OK, report.NO_DATA, report.STALE]) == report.STALE
    assert report.worst([report.STALE, report.ALERT]) == report.ALERT
    assert report.worst([]) == report.NO_DATA


def test_threshold_per_model_then_global():
    cfg = AlertsConfig(hit_rate_threshold=0.6, per_model_threshold={"big": 0.8})
    assert report.threshold_for(cfg, "big") == 0.8
    assert report.threshold_for(cfg, "small") == 0.6
    assert report.threshold_for(cfg) == 0.6
    assert report.threshold_for(AlertsConfig()) == report.DEFAULT_THRESHOLD
    with pytest.raises(ConfigError, match="per_model_threshold.bad"):
        report.threshold_for(AlertsConfig(per_model_threshold={"bad": 1.5}), "bad")


def test_the_line_of_each_status():
    assert report.report_line(608_000, 644_000, report.OK, threshold=0.5) == (
        "608,000 of 644,000 prompt tokens from cache (94.4%): OK")
    assert report.report_line(0, 644_000, report.ALERT, threshold=0.5) == (
        "0 of 644,000 prompt tokens from cache (0.0%): ALERT: check the top of the prompt")
    assert report.report_line(0, 1, report.NO_DATA, threshold=0.5, min_query_tokens=1_000) == (
        "0 of 1 prompt tokens from cache (0.0%): NO DATA: under 1,000 prompt tokens in the day")
    assert report.report_line(0, 0, report.NO_DATA, threshold=0.5, min_query_tokens=1_000) == (
        "0 of 0 prompt tokens from cache: NO DATA: under 1,000 prompt tokens in the day")

    @dataclass
    class Silent:
        instance: str
        last_ts_unix_s: float
        median_gap_s: float | None

    line = report.report_line(850_000, 900_000, report.STALE, threshold=0.5,
                              stale=[Silent("vllm-b:8000", 1_795_960_800.0, 900.0)],
                              zone=ZoneInfo("Europe/Berlin"))
    assert line == ("850,000 of 900,000 prompt tokens from cache (94.4%): STALE: no scrape from "
                    "vllm-b:8000 after 2026-11-29 15:00, scraped every 900 s before")


def test_alert_and_stale_are_both_shown():
    @dataclass
    class Silent:
        instance: str
        last_ts_unix_s: float
        median_gap_s: float | None

    line = report.report_line(450_000, 900_000 + 1, report.ALERT, threshold=0.5,
                              stale=[Silent("gpu-a2", 1_795_960_800.0, 15.0)])
    assert line == ("450,000 of 900,001 prompt tokens from cache (49.9999%): ALERT: check the top of "
                    "the prompt; also STALE: no scrape from gpu-a2 after 2026-11-29 14:00, "
                    "scraped every 15 s before")


def test_a_status_that_disagrees_with_the_figures_is_refused():
    with pytest.raises(AssertionError):
        report.report_line(0, 644_000, report.OK, threshold=0.5)


def test_percent_is_rounded_to_one_decimal_as_the_pages():
    # one decimal, rounded, except where that would read on the threshold's other side
    assert report.report_line(4_999, 10_000, report.ALERT, threshold=0.5).startswith(
        "4,999 of 10,000 prompt tokens from cache (49.99%): ALERT")
    assert report.report_line(6_432, 10_380, report.OK, threshold=0.5).startswith(
        "6,432 of 10,380 prompt tokens from cache (62.0%): OK")
    assert report.report_line(29, 100, report.OK, threshold=0.2).startswith(
        "29 of 100 prompt tokens from cache (29.0%): OK")
