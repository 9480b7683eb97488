"""Pure parts of the dashboard: figures (DataFrame in, figure out), formatting, filter rules."""

from __future__ import annotations

from datetime import date

import pandas as pd
import plotly.graph_objects as go
import pytest

from prefixscope.dashboard import figures
from prefixscope.dashboard.filters import (Filters, custom_range, default_range_label, quick_range, run_label,
                               selection)
from prefixscope.core.formatting import (fmt_age, fmt_int, fmt_money, fmt_ms, fmt_pct, fmt_time, fmt_tokens,
                                  fmt_window)

T0 = 1795860000.0  # 2026-11-28T10:00:00Z


def windows_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "window_start_s": [T0, T0 + 3600, T0, T0 + 3600],
        "window_end_s": [T0 + 3600, T0 + 7200, T0 + 3600, T0 + 7200],
        "model": ["m1", "m1", "m1", "m1"],
        "instance": ["a", "a", "b", "b"],
        "hit_tokens": [7136, 0, 100, 608000],
        "query_tokens": [11652, 0, 400, 644000],
        "hit_rate": [7136 / 11652, None, 0.25, 608000 / 644000],
        "restarts": [0, 0, 0, 1],
        "legacy": [False, False, True, True],
        "external_hit_tokens": [0, 0, 0, 0],
    })


def requests_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "run_id": ["", "", "", "r1"],
        "request_id": ["a", "b", "c", "d"],
        "ts_unix_s": [T0, T0 + 1, None, T0 + 3],
        "model": ["m1", "m1", "m2", "m2"],
        "instance": ["i", "i", "i", "j"],
        "endpoint": ["completions", "chat", "chat", "chat"],
        "prompt_tokens": [611, 612, 627, 320],
        "cached_tokens": [0, 576, 608, 288],
        "hit_rate": [0.0, 576 / 612, 608 / 627, 0.9],
        "ttft_ms": [None, None, None, None],
        "latency_ms": [139.4, 85.9, 90.0, 40.0],
        "scope": [None] * 4,
        "tenant_digest": [None] * 4,
    })


def test_hit_rate_over_time_one_line_per_series_plus_restart_markers():
    fig = figures.hit_rate_over_time(windows_frame(), by=("model", "instance"), threshold=0.5,
                                     window_s=3600)
    assert isinstance(fig, go.Figure)
    names = [t.name for t in fig.data]
    assert names == ["m1 / a", "m1 / b", "restart (counter drop)"]
    # the NULL hit rate (no queries) is a gap, not 0
    y = list(fig.data[0].y)
    assert y[0] == pytest.approx(7136 / 11652) and y[1] != y[1]
    assert fig.layout.yaxis.tickformat == ".0%"
    assert "per 1h window" in fig.layout.title.text
    # threshold line + one restart line
    assert len(fig.layout.shapes) == 2


def test_hit_rate_over_time_without_restarts_column():
    df = windows_frame().drop(columns=["restarts"])
    fig = figures.hit_rate_over_time(df, by=("model",), threshold=None)
    assert [t.name for t in fig.data] == ["m1"]
    assert len(fig.layout.shapes) == 0


def test_tokens_over_time_panels_per_series():
    fig = figures.tokens_over_time(windows_frame(), by=("model", "instance"), window_s=3600)
    assert len(fig.data) == 4  # query + hit bars per series
    assert {t.name for t in fig.data} == {"query tokens", "hit tokens"}
    assert list(fig.data[1].y) == [7136, 0]


def test_histogram_and_over_time():
    requests_frame()
    bins = pd.DataFrame({"bin_start": [0.0, 0.5], "bin_end": [0.5, 1.0], "requests": [15, 16]})
    h = figures.request_hit_rate_histogram(bins)
    assert list(h.data[0].y) == [15, 16] and list(h.data[0].x) == [0.25, 0.75]
    assert list(h.data[0].customdata) == ["0% to 50%", "50% to 100%"]
    assert h.layout.xaxis.tickformat == ".0%"
    assert len(figures.request_hit_rate_histogram(bins.assign(requests=0)).data) == 0
    win = pd.DataFrame({"window_start_s": [T0], "model": ["m1"], "hit_rate": [576 / 1223],
                        "requests": [2]})
    bands = pd.DataFrame({"window_start_s": [T0, T0 + 3600], "model": ["m1", "m1"],
                          "requests": [2, 5], "p10": [0.0, 0.1], "p25": [0.2, 0.3],
                          "p50": [0.5, 0.5], "p75": [0.7, 0.8], "p90": [0.9, 1.0]})
    o = figures.request_hit_rate_over_time(bands, win, window_s=3600)
    names = [t.name for t in o.data if t.name]
    assert names == ["m1: 10-90% of requests", "m1: 25-75% of requests", "m1: median request",
                     "m1: per 1h window"]
    # bands: one point per window (never one per request), filled between the quantiles
    assert all(len(t.x) == 2 for t in o.data[:5])
    assert list(o.data[1].y) == [0.9, 1.0] and o.data[1].fill == "tonexty"
    assert list(o.data[4].y) == [0.5, 0.5]


def test_coverage_bars_red_below_full():
    cov = pd.DataFrame({"model": ["m1", "m2"], "instance": ["i", "i"], "requests": [10, 4],
                        "reported_requests": [10, 1], "coverage": [1.0, 0.25]})
    fig = figures.coverage_bars(cov)
    bar = fig.data[0]
    colours = dict(zip(bar.y, bar.marker.color))
    assert colours["m1 / i"] == figures.HIT_COLOUR and colours["m2 / i"] == figures.MISS_COLOUR
    assert "25% (1 of 4)" in bar.text


def test_latency_by_band_draws_store_quantiles_without_points():
    q = pd.DataFrame({"band": ["warm", "cold"], "requests": [3, 1], "min_ms": [1.0, 9.0],
                      "p05_ms": [1.5, 9.0], "p25_ms": [2.0, 9.0], "p50_ms": [3.0, 9.0],
                      "p75_ms": [4.0, 9.0], "p95_ms": [5.0, 9.0], "max_ms": [6.0, 9.0],
                      "mean_ms": [3.1, 9.0]})
    fig = figures.latency_by_band(q, column="latency_ms")
    # the TTFT panels' bands and legend names, in band order (cold first), no partial box
    assert [t.name for t in fig.data] == ["cold (< 10% cached), 1 requests",
                                          "warm (≥ 80% cached), 3 requests"]
    assert [t.marker.color for t in fig.data] == [figures.BAND_COLOURS["cold"],
                                                  figures.BAND_COLOURS["warm"]]
    box = fig.data[1]
    assert (list(box.q1), list(box.median), list(box.q3)) == ([2.0], [3.0], [4.0])
    assert (list(box.lowerfence), list(box.upperfence)) == ([1.5], [5.0])
    assert box.boxpoints is False and box.y is None  # no per-request points are sent
    empty = figures.latency_by_band(q.iloc[0:0], column="ttft_ms")
    assert len(empty.data) == 0 and "no request has ttft_ms" in empty.layout.annotations[0].text


def test_savings_figures_label_shadow_prices():
    df = pd.DataFrame({"model": ["tiny", "gpt"], "currency": ["INR", "INR"], "shadow": [True, False],
                       "price_source": ["demo", "list"], "cost_without_cache": [68.4, None],
                       "cost_with_cache": [19.76, None], "saved": [48.64, None],
                       "saved_fraction": [0.711, None]})
    fig = figures.savings_by_model_bars(df)
    assert list(fig.data[0].y) == ["tiny (shadow price)"]
    assert fig.data[0].text[0] == "Rs 68.40" and fig.data[1].text[0] == "Rs 19.76"
    # "$" as Plotly text (plotly_text: a currency is data), drawn as "cost ($)"
    assert figures.savings_by_model_bars(df.assign(currency="USD")).layout.xaxis.title.text == "cost (&#36;)"
    assert fig.layout.xaxis.title.text == "cost (Rs)"
    w = pd.DataFrame({"window_start_s": [T0], "model": ["tiny"], "currency": ["INR"], "saved": [48.64],
                      "cost_without_cache": [68.4], "cost_with_cache": [19.76]})
    assert figures.savings_over_time(w).data[0].name == "tiny (Rs)"


@pytest.mark.parametrize("fn", [
    lambda d: figures.hit_rate_over_time(d),
    lambda d: figures.tokens_over_time(d),
    lambda d: figures.request_hit_rate_histogram(d),
    lambda d: figures.request_hit_rate_over_time(d),
    lambda d: figures.coverage_bars(d),
    lambda d: figures.latency_by_band(d),
    lambda d: figures.savings_by_model_bars(d),
    lambda d: figures.savings_over_time(d),
])
def test_empty_frames_give_a_no_data_figure(fn):
    fig = fn(pd.DataFrame())
    assert len(fig.data) == 0
    assert fig.layout.annotations and "no" in fig.layout.annotations[0].text


def test_every_figure_function_documents_its_columns():
    import inspect

    for name, fn in inspect.getmembers(figures, inspect.isfunction):
        if name.startswith("_") or fn.__module__ != figures.__name__ or name in ("series_label", "window_x", "window_from", "line_mode", "wrap_label", "stepped", "stepped_traces", "frame"):
            continue
        doc = inspect.getdoc(fn) or ""
        assert "df:" in doc or "requests:" in doc or "bands:" in doc, f"figures.{name} does not document its DataFrame"


def test_formatting_for_humans():
    assert fmt_pct(0.944) == "94.4%"
    assert fmt_pct(None) == "—" and fmt_pct(float("nan")) == "—"
    assert fmt_pct(0) == "0.0%"  # reported 0 is not missing
    assert fmt_int(608000) == "608,000"
    assert fmt_tokens(608000) == "608,000 tokens" and fmt_tokens(1) == "1 token"
    assert fmt_money(48.64, "INR") == "Rs 48.64"
    assert fmt_money(1234.5, "USD") == "$1,234.50"
    assert fmt_money(-2, "Rs") == "-Rs 2.00"
    assert fmt_money(None, "INR") == "—"
    assert fmt_money(0.000593, "USD") == "$0.000593"  # a small shadow cost never reads 0.00
    assert fmt_money(0.0, "USD") == "$0.00" and fmt_money(0.5, "INR") == "Rs 0.50"
    assert fmt_ms(1234.56) == "1,234.6"
    assert fmt_int("32") == "32" and fmt_int("None") == "—" and fmt_int(pd.NA) == "—"
    assert fmt_time(T0) == "2026-11-28 10:00 UTC"
    assert fmt_age(45) == "45 s" and fmt_age(3 * 86400) == "3 days"
    assert (fmt_window(300), fmt_window(3600), fmt_window(86400)) == ("5m", "1h", "1d")


def test_filter_rules():
    now = T0 + 10 * 86400
    assert quick_range("1h", now_s=now) == (now - 3600, None)
    assert quick_range("all", now_s=now) == (None, None)
    with pytest.raises(ValueError):
        quick_range("2h", now_s=now)
    # data older than 24 h (or none at all) opens on "all", fresh data on "24h"
    assert default_range_label(T0, now_s=now) == "all"
    assert default_range_label(None, now_s=now) == "all"
    assert default_range_label(now - 600, now_s=now) == "24h"
    assert default_range_label(now - 600, now_s=now, min_ts_unix_s=now - 3600) == "24h"
    assert default_range_label(now - 600, now_s=now, min_ts_unix_s=now - 6 * 86400) == "7d"
    assert custom_range(date(2026, 11, 28), date(2026, 11, 28)) == (1795824000.0, 1795910400.0)
    assert custom_range(date(2026, 11, 29), date(2026, 11, 28)) == (1795824000.0, 1795996800.0)
    assert selection([]) is None and selection(["a"]) == ("a",)
    assert run_label("") == "production" and run_label("r1") == "r1"
    f = Filters(start_s=None, end_s=None, range_label="all", models=("m",))
    assert f.describe() == "all time · 1 model · all instances"


# --- figures moved out of the Scopes, Rejections and Replay pages -------------------------


def test_scope_figures_one_trace_per_scope_in_scope_order():
    df = pd.DataFrame({"window_start_s": [T0, T0, T0 + 900, T0 + 900],
                       "scope": ["TENANT", "PUBLIC", "TENANT", "PUBLIC"],
                       "hit_rate": [0.5, 0.9, 0.6, 0.95],
                       "cached_tokens": [50, 90, 60, 95], "reported_prompt_tokens": [100] * 4,
                       "saved_prefill_tokens": [50, 90, 60, 95]})
    rate = figures.scope_rate_figure(df, series="scope", title="Hit rate by scope", window_s=900,
                                     colours=figures.SCOPE_COLOURS)
    assert [t.name for t in rate.data] == ["PUBLIC", "TENANT"]
    assert list(rate.data[0].y) == [0.9, 0.95]
    assert rate.data[0].line.color == figures.SCOPE_COLOURS["PUBLIC"]
    assert rate.layout.title.text == "Hit rate by scope per 15m"
    saved = figures.scope_saved_figure(df, window_s=900)
    assert [t.name for t in saved.data] == ["PUBLIC", "TENANT"]  # SCOPE_ORDER, not row order
    assert list(saved.data[1].y) == [50, 60]
    assert saved.layout.barmode == "stack"


def test_rejection_figures():
    reasons = pd.DataFrame({"window_start_s": [T0, T0, T0 + 300], "reason": ["model", "scope", "model"],
                            "rejects": [3, 1, 2], "lost_candidate_tokens": [300, 100, 200]})
    fig = figures.rejection_reasons_figure(reasons, window_s=300)
    assert [t.name for t in fig.data] == ["model", "scope"]
    assert list(fig.data[0].y) == [3, 2]
    assert str(fig.data[0].x[0]).startswith("2026-11-28T10:02:30")  # naive UTC, window middle
    misses = pd.DataFrame({"window_start_s": [T0], "ordinary_miss_requests": [5],
                           "version_mismatch_requests": [2], "other_reject_requests": [1]})
    fig = figures.miss_breakdown_figure(misses, window_s=300)
    assert [list(t.y) for t in fig.data] == [[5], [2], [1]]
    # side by side inside the window, the three centred on its middle (as every time chart)
    assert fig.layout.barmode == "overlay"
    w = 300 * 1000 * figures.BAR_FILL / 3
    assert [t.offset for t in fig.data] == [-1.5 * w, -0.5 * w, 0.5 * w]
    assert all(str(t.x[0]).startswith("2026-11-28T10:02:30") for t in fig.data)


def test_replay_run_figures():
    runs = pd.DataFrame({"label": ["a", "b"], "hit_rate": [0.869, 0.25],
                         "cost_without_cache": [1.0, 1.0], "cost_with_cache": [0.2, 0.8]})
    bars = figures.run_hit_rate_bars(runs)
    assert list(bars.data[0].x) == [0.869, 0.25] and list(bars.data[0].text) == ["86.9%", "25.0%"]
    cost = figures.run_cost_bars(runs, "USD")
    assert [t.name for t in cost.data] == ["without cache", "with cache"]
    assert cost.layout.title.text == "Cost per run (USD)"
    windows = pd.DataFrame({"run_id": ["r1", "r1", "r2"], "window_start_s": [0.0, 60.0, 0.0],
                            "hit_rate": [0.1, 0.5, 0.2]})
    fig = figures.run_windows_figure(windows, {"r1": "first"}, 60.0)
    assert [t.name for t in fig.data] == ["first", "r2"]
    # minutes since the run's first request, each point at its window's middle
    assert list(fig.data[0].x) == [0.5, 1.5]
    gap = figures.run_windows_figure(pd.DataFrame({"run_id": ["r1", "r1"],
                                                   "window_start_s": [0.0, 180.0],
                                                   "hit_rate": [0.1, 0.5]}), {}, 60.0)
    # the two missing windows break the line (NaN points, not connected)
    assert len(gap.data[0].y) == 4 and gap.data[0].connectgaps is False
    assert fig.layout.xaxis.title.text == "minutes since the run's first request"


def test_window_lengths_are_declared_once():
    from prefixscope.dashboard.filters import WINDOWS_S

    assert WINDOWS_S == {"10s": 10.0, "1m": 60.0, "5m": 300.0, "15m": 900.0, "1h": 3600.0,
                         "1d": 86400.0}


def test_short_runs_get_short_windows():
    """A gateway run of minutes gets 10 s / 1 m windows and starts on one giving at most 60
    windows; a run of an hour or more keeps the page's windows (read from the rollup)."""
    from prefixscope.dashboard.filters import run_windows

    page = ("5m", "15m", "1h", "1d")
    assert run_windows((0.0, 454.0), page, default="15m") == (("10s", "1m", *page), "10s")
    assert run_windows((0.0, 1800.0), page, default="15m") == (("10s", "1m", *page), "1m")
    assert run_windows((5.0, 5.0), page, default="15m") == (("10s", "1m", *page), "10s")
    assert run_windows((0.0, 3600.0), page, default="15m") == (page, "15m")
    assert run_windows(None, page, default="15m") == (page, "15m")


def test_long_lines_are_drawn_without_markers():
    """A 30-day range at a 15-minute window is 2,880 points a series: no marker on each."""
    import pandas as pd

    assert figures.line_mode(figures.MAX_MARKERS) == "lines+markers"
    assert figures.line_mode(figures.MAX_MARKERS + 1) == "lines"
    n = 2880
    df = pd.DataFrame({"window_start_s": [1.8e9 + 900 * i for i in range(n)], "scope": "TENANT",
                       "hit_rate": 0.5, "requests": 1, "cached_tokens": 1, "prompt_tokens": 2,
                       "reported_prompt_tokens": 2, "saved_prefill_tokens": 1})
    fig = figures.scope_rate_figure(df, series="scope", title="t", window_s=900)
    assert [t.mode for t in fig.data] == ["lines"]
    fig = figures.scope_rate_figure(df.head(10), series="scope", title="t", window_s=900)
    assert [t.mode for t in fig.data] == ["lines+markers"]


def test_a_change_that_rounds_to_zero_has_no_sign():
    """The Alerts page showed "-0 pp" for a fall of 0.4 points."""
    from prefixscope.alerts.render import _fmt_pp
    from prefixscope.core.formatting import fmt_pp

    assert fmt_pp(-0.0004) == "0.0 pp" and fmt_pp(0.0004) == "0.0 pp"
    assert fmt_pp(0.0123) == "+1.2 pp" and fmt_pp(-0.05) == "-5.0 pp"
    # The email's changes are the dashboard's one decimal (never "-0.0 pp").
    assert _fmt_pp(-0.0004) == "0.0 pp" and _fmt_pp(-0.004) == "-0.4 pp"
    assert _fmt_pp(-0.33) == "-33.0 pp" and _fmt_pp(0.33) == "+33.0 pp"


def test_low_volume_windows_are_hollow_and_off_the_line():
    """A 707-token window on a good day is not a dip of the line: it is a hollow grey marker
    in its own legend entry (fewer than min_query_tokens query tokens)."""
    df = pd.DataFrame({
        "window_start_s": [T0, T0 + 3600, T0 + 7200],
        "model": ["m1"] * 3, "instance": ["a"] * 3,
        "hit_tokens": [9000, 100, 9100],
        "query_tokens": [10000, 707, 10000],
        "hit_rate": [0.9, 100 / 707, 0.91],
        "restarts": [0, 0, 0],
    })
    fig = figures.hit_rate_over_time(df, by=("model", "instance"), threshold=0.5,
                                     window_s=3600, min_query_tokens=1000)
    line, low = fig.data
    assert line.name == "m1 / a"
    assert [v for v in line.y] == [pytest.approx(0.9), pytest.approx(0.91)]
    assert low.name == "fewer than 1,000 query tokens (not on the line)"
    assert low.mode == "markers" and low.marker.symbol == "circle-open"
    assert low.marker.color == figures.LOW_VOLUME_COLOUR
    assert list(low.y) == [pytest.approx(100 / 707)]
    assert list(low.customdata[0][:2]) == [100.0, 707.0]
    # 0 marks none: the same frame draws one line through all three windows
    plain = figures.hit_rate_over_time(df, by=("model", "instance"), window_s=3600)
    assert [t.name for t in plain.data] == ["m1 / a"] and len(plain.data[0].y) == 3


def test_threshold_label_sits_outside_the_plot_area():
    fig = figures.hit_rate_over_time(windows_frame(), by=("model", "instance"), threshold=0.5,
                                     window_s=3600)
    (label,) = [a for a in fig.layout.annotations if "alert" in a.text]
    assert label.text == "alert<br>below<br>50%"
    assert (label.xref, label.x, label.xanchor) == ("paper", 1.0, "left")  # right of the plot
    assert (label.yref, label.y) == ("y", 0.5)
    assert fig.layout.margin.r >= 50  # room for it
    assert [s.y0 for s in fig.layout.shapes if s.line.dash == "dash"] == [0.5]


def test_log_axis_leaves_zero_windows_out():
    df = pd.DataFrame({"window_start_s": [T0, T0 + 60, T0 + 120],
                       "per_s": [120.0, 0.0, 95.0]})
    fig = figures.window_lines(df, series={"per_s": ""}, window_s=60, title="Prompt tokens",
                               y_title="tokens/s (log)", log_y=True)
    assert fig.layout.yaxis.type == "log"
    assert list(fig.data[0].y) == [120.0, None, 95.0]
    lin = figures.window_lines(df, series={"per_s": ""}, window_s=60, title="Prompt tokens",
                               y_title="tokens/s")
    assert list(lin.data[0].y) == [120.0, 0.0, 95.0]  # a linear axis keeps its 0


def test_long_bar_charts_are_drawn_stepped_with_the_same_numbers():
    """A 30-day range at a 15-minute window: no SVG bar per window (17,000 on the Rejections
    page at 10 M requests), one stepped path per series, the same value in every window and 0
    in a window without a row; a short chart keeps its bars."""
    n = 2880
    t0 = 1.8e9
    starts = [t0 + 900 * i for i in range(n) if i % 7 != 3]  # windows 3, 10, ...: no row
    reasons = pd.DataFrame({"window_start_s": starts * 2,
                            "reason": ["model_digest"] * len(starts) + ["cache_epoch"] * len(starts),
                            "rejects": list(range(len(starts))) * 2,
                            "lost_candidate_tokens": [10 * i for i in range(len(starts))] * 2})
    fig = figures.rejection_reasons_figure(reasons, window_s=900)
    assert [t.type for t in fig.data] == ["scatter", "scatter"]
    assert [t.name for t in fig.data] == ["cache_epoch", "model_digest"]
    assert all(t.stackgroup == "bars" and t.line.shape == "hvh" for t in fig.data)
    tr = fig.data[1]
    assert len(tr.y) == n and sum(tr.y) == reasons["rejects"].sum() / 2
    assert list(tr.y[:6]) == [0, 1, 2, 0, 3, 4] and tr.y[10] == 0  # windows 3 and 10: no row
    assert list(tr.customdata[4]) == [30, pd.Timestamp(t0 + 4 * 900, unit="s").strftime("%Y-%m-%d %H:%M")]
    assert pd.Timestamp(tr.x[4]) == pd.Timestamp(t0 + 4 * 900 + 450, unit="s")  # the middle
    misses = pd.DataFrame({"window_start_s": starts, "ordinary_miss_requests": 5,
                           "version_mismatch_requests": 2, "other_reject_requests": 1})
    fig = figures.miss_breakdown_figure(misses, window_s=900)
    assert [t.type for t in fig.data] == ["scatter"] * 3
    assert all(t.stackgroup is None and len(t.y) == n for t in fig.data)
    assert [sum(t.y) for t in fig.data] == [5 * len(starts), 2 * len(starts), len(starts)]
    scoped = pd.DataFrame({"window_start_s": starts, "scope": "TENANT", "saved_prefill_tokens": 3})
    fig = figures.scope_saved_figure(scoped, window_s=900)
    assert [(t.type, t.name, sum(t.y)) for t in fig.data] == [("scatter", "TENANT", 3 * len(starts))]
    assert fig.data[0].fillcolor == figures.SCOPE_COLOURS["TENANT"]
    # at most MAX_BARS windows: bars, as before
    short = reasons[reasons["window_start_s"] < t0 + 900 * 300]
    assert {t.type for t in figures.rejection_reasons_figure(short, window_s=900).data} == {"bar"}
    assert figures.stepped(figures.MAX_BARS + 1) and not figures.stepped(figures.MAX_BARS)


def test_a_band_of_one_window_is_drawn_as_markers():
    """A model whose requests all fall in one window (the new user's gateway model, session 8)
    drew empty axes: a line of one point draws nothing. Each point now has a marker."""
    df = pd.DataFrame({"window_start_s": [T0, T0], "model": ["tiny", "tiny"],
                       "band": ["cold", "warm"], "requests": [8, 7],
                       "p50_ms": [40.0, 12.0], "p90_ms": [55.0, 20.0]})
    fig = figures.ttft_by_band(df, window_s=3600)
    assert len(fig.data) == 4
    assert all("markers" in t.mode for t in fig.data)
    assert sorted(v for t in fig.data for v in t.y) == [12.0, 20.0, 40.0, 55.0]


def test_many_panels_fit_with_a_smaller_gap():
    """22 model x instance panels raised Plotly's "Vertical spacing cannot be greater than
    (1 / (rows - 1))" on Overview and Requests (the second attack on issue 27): the gap
    shrinks with the number of panels, in both stacked figures."""
    panels = [(f"m{i}", f"i{i}") for i in range(22)]
    ttft = pd.DataFrame([{"window_start_s": T0, "model": m, "instance": i, "band": "cold",
                          "requests": 3, "p50_ms": 40.0, "p90_ms": 55.0} for m, i in panels])
    fig = figures.ttft_by_band(ttft, window_s=3600, by=("model", "instance"))
    assert len(fig.data) == 2 * 22
    tokens = pd.DataFrame([{"window_start_s": T0, "model": m, "instance": i,
                            "query_tokens": 10, "hit_tokens": 5} for m, i in panels])
    assert len(figures.tokens_over_time(tokens, window_s=3600).data) == 2 * 22
    assert figures._panel_spacing(22, 0.08) < 1 / 21 and figures._panel_spacing(2, 0.08) == 0.08


def test_scope_lines_break_at_windows_without_requests():
    """Scopes drew a diagonal across windows with no requests: the line now has a gap (a None
    point, connectgaps off) in each empty window between two with data."""
    df = pd.DataFrame({"window_start_s": [T0, T0 + 900, T0 + 4 * 900], "scope": "TENANT",
                       "hit_rate": [0.5, 0.6, 0.9], "cached_tokens": [5, 6, 9],
                       "reported_prompt_tokens": [10] * 3})
    fig = figures.scope_rate_figure(df, series="scope", title="t", window_s=900)
    (tr,) = fig.data
    assert tr.connectgaps is False
    ys = [None if v != v else v for v in tr.y]
    assert ys == [0.5, 0.6, None, None, 0.9]
    assert tr.mode == "lines+markers"


def test_a_log_axis_with_nothing_above_zero_is_an_explained_empty_figure():
    """Overview's "Prompt tokens per second (log)" on windows that are all 0 drew a bare log
    axis with ticks "2, 1, 0, 0, 0, 0": now the empty figure with a note that says why."""
    df = pd.DataFrame({"window_start_s": [T0, T0 + 60], "per_s": [0.0, 0.0]})
    fig = figures.window_lines(df, series={"per_s": ""}, window_s=60,
                               title="Prompt tokens per second", y_title="tokens/s (log)",
                               log_y=True)
    assert len(fig.data) == 0
    assert fig.layout.annotations[0].text == figures.LOG_EMPTY_NOTE
    assert fig.layout.annotations[0].text.startswith("no ")
    assert fig.layout.title.text == "Prompt tokens per second per 1m window"


def test_one_small_window_on_a_log_axis_is_drawn_with_readable_ticks():
    """The new user's hostile DB: one window of 0.32 prompt tokens/s drew nothing (a line of
    one point) on a log axis whose ",.0f" ticks read "2, 1, 0, 0, 0, 0"."""
    df = pd.DataFrame({"window_start_s": [T0], "per_s": [0.3222]})
    fig = figures.window_lines(df, series={"per_s": ""}, window_s=3600,
                               title="Prompt tokens per second", y_title="tokens/s (log)",
                               log_y=True)
    (tr,) = fig.data
    assert list(tr.y) == [0.3222] and "markers" in tr.mode
    assert fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis.tickformat == figures.LOG_SMALL_TICKFORMAT
    big = figures.window_lines(df.assign(per_s=[120.0]), series={"per_s": ""}, window_s=3600,
                               title="t", y_title="y", log_y=True)
    assert big.layout.yaxis.tickformat == ",.0f"


def test_partial_windows_note_names_the_cut_windows():
    from prefixscope.dashboard.filters import partial_windows_note

    day = 86400.0
    assert partial_windows_note(10 * day, 12 * day, day, now_s=20 * day) == ""
    assert partial_windows_note(None, None, day, now_s=20 * day) == ""
    one = partial_windows_note(10 * day + 3600, 12 * day, day, now_s=20 * day)
    assert one.startswith("Bars are 1d windows (UTC); the first starts at the range's start (")
    assert one.endswith(": it holds part of a window.")
    both = partial_windows_note(10 * day + 3600, None, day, now_s=20 * day + 60)
    assert "and the last ends now: both hold part of a window." in both
