"""The daily email's chart (matplotlib) draws model names from the data as literal text: a
``$`` is never mathtext, an unbalanced one is no parse error (the Alerts page showed
``ValueError: ... ParseException`` for a model named ``$\\frac{a}{b}$ $$x^2$$``; the second
attack on issue 27), control characters have no glyph warnings."""

from __future__ import annotations

import warnings
from datetime import date, timedelta

import pytest

from prefixscope.alerts.daily import build_daily_report
from prefixscope.alerts.render import chart_text, render_chart_png
from prefixscope.core.config import AlertsConfig
from tests.alerts_support import ingest_usage_lines, local_ts, requests_for

DAY = date(2026, 11, 28)


@pytest.mark.parametrize("name", ["$\\frac{a}{b}$ $$x^2$$", "cost $5", "$x^2$",
                                  "\\$ already"])
def test_a_model_name_is_drawn_as_written(con, tmp_path, name):
    lines = (requests_for(DAY, model=name, n=4, prompt_tokens=1_000, cached_tokens=100)
             + requests_for(DAY - timedelta(days=1), model=name, n=4, prompt_tokens=1_000,
                            cached_tokens=900))
    ingest_usage_lines(con, tmp_path / "u.jsonl", lines)
    report = build_daily_report(con, day=DAY, tz="UTC", cfg=AlertsConfig(),
                                now_unix_s=local_ts(DAY, 30))
    assert [ln.model for ln in report.lines] == [name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Glyph ... missing" for a control character
        png = render_chart_png(report)
    assert png is not None and png.startswith(b"\x89PNG")


def test_chart_text_escapes_dollars_and_replaces_control_characters():
    assert chart_text("$x^2$") == "\\$x^2\\$"
    assert chart_text("a\x00b\x7f\x9bc") == "a\ufffdb\ufffd\ufffdc"
    assert chart_text("plain name") == "plain name"
