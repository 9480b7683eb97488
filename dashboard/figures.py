"""Plotly figures of the dashboard: pure functions, DataFrame in, figure out.

No function here reads the store, Streamlit state or the clock; each documents the columns it
expects (the columns the matching ``prefixscope.store.queries`` function returns) and returns a
``plotly.graph_objects.Figure``. None computes a hit rate: rates arrive computed by the store's
queries (formulas in ``docs/metrics.md``) and are only drawn. Times are Unix seconds in, UTC on
the axes; fractions in [0, 1] are drawn on percent axes.

Every time chart places a window the same way (:func:`window_x`): its points, and the middle of
its bars, at the window's middle (start + half the window, UTC), so the hit rate, the token
rate and the serving panels of one window line up under a shared x-axis; the hover names the
window's start (``docs/metrics.md#window-placement``).

An empty frame gives an empty figure with a "no data" note (pages normally show their own empty
state before calling these).

Text from the data (model, instance, run, reason, namespace digest, currency...) reaches a
figure's text fields (titles, ticks, legend names, bar text, hover templates and the
``customdata`` they show) only through :func:`prefixscope.core.formatting.plotly_text`, applied
here where the data becomes figure text (:func:`series_label`, :func:`wrap_label`...); a
``title`` argument is Plotly text already: a page escapes the data it puts in one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefixscope.core.formatting import (breaker_position, currency_prefix, fmt_money, fmt_pct,
                                         fmt_window, plotly_text, utc_times)

# A fixed qualitative palette so that one series keeps its colour across figures of a page.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
    "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#d62728",
)
HIT_COLOUR = "#2ca02c"
QUERY_COLOUR = "#9ecae1"
MISS_COLOUR = "#d62728"
THRESHOLD_COLOUR = "#d62728"
#: Hollow markers of low-volume windows (:func:`hit_rate_over_time`).
LOW_VOLUME_COLOUR = "#8c8c8c"
_LAYOUT = dict(
    margin=dict(l=10, r=10, t=60, b=10),
    legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0),
    hovermode="closest",
)


def _time_range(starts_s: pd.Series, window_s: float | None) -> list | None:
    """An x range (naive UTC datetimes) from half a window before the first start to one and a
    half windows after the last, so a single window is not drawn on a millisecond axis."""
    if starts_s.empty or not window_s:
        return None
    lo = float(starts_s.min()) - 0.5 * float(window_s)
    hi = float(starts_s.max()) + 1.5 * float(window_s)
    return [pd.Timestamp(lo, unit="s").to_pydatetime(), pd.Timestamp(hi, unit="s").to_pydatetime()]


def _span_range(starts_s: pd.Series, window_s: float, span_s: tuple[float, float] | None
               ) -> list | None:
    """The x range of a chart of one run (or of the runs picked to compare): the windows from
    the one holding the span's first time to the one holding its last (and any window of
    ``starts_s`` beyond), half a window of margin either side, as naive UTC datetimes; so a
    run is drawn over its own span, not the store's, and a span of seconds on its windows'
    axis (not ``00:37:29.999 … 00:37:30.0005``). Without ``span_s``, :func:`_time_range`.

    Args:
        starts_s: the chart's window starts, Unix seconds (may be empty).
        window_s: the window length, seconds.
        span_s: (first, last) time of the run(s), Unix seconds (``run_list`` with decisions).
    """
    if span_s is None or not window_s:
        return _time_range(starts_s, window_s)
    w = float(window_s)
    lo = math.floor(float(span_s[0]) / w) * w
    hi = math.floor(float(span_s[1]) / w) * w
    if not starts_s.empty:
        lo, hi = min(lo, float(starts_s.min())), max(hi, float(starts_s.max()))
    return [pd.Timestamp(lo - 0.5 * w, unit="s").to_pydatetime(),
            pd.Timestamp(hi + 1.5 * w, unit="s").to_pydatetime()]


#: Most points of one line drawn with a marker on each; a longer line is drawn as a line only
#: (thousands of SVG markers made a 30-day page at a 15-minute window take seconds to draw in the
#: browser: benchmarks/dashboard_scale.py).
MAX_MARKERS = 400


def line_mode(points: int) -> str:
    """Plotly ``mode`` of a line of ``points`` windows: ``lines+markers`` up to
    :data:`MAX_MARKERS`, else ``lines`` (the hover still names each window)."""
    return "lines+markers" if points <= MAX_MARKERS else "lines"


#: Most windows of one bar chart drawn as bars (one SVG shape per bar and series); a chart of
#: more windows (30 days at 15 minutes are 2,880) draws each series as a stepped area (stacked
#: bars) or a stepped line (bars side by side): one SVG path a series, the same value in every
#: window, a window without a row drawn as 0 (:func:`stepped_traces`; 17,000 bars made the
#: Rejections page of a 10 M-request month take seconds to draw: benchmarks/dashboard_scale.py).
MAX_BARS = 400


def _cells(*columns) -> np.ndarray:
    """``customdata`` of a trace: one row per point, one column per argument (an object array:
    plotly validates it in one step, a list of tuples element by element)."""
    n = len(columns[0]) if columns else 0
    out = np.empty((n, len(columns)), dtype=object)
    for k, col in enumerate(columns):
        out[:, k] = np.asarray(col, dtype=object)
    return out


def stepped(windows: int) -> bool:
    """Whether a bar chart of ``windows`` distinct windows is drawn stepped
    (:data:`MAX_BARS`)."""
    return windows > MAX_BARS


def window_grid(df: pd.DataFrame, *, series: str | None, columns: Sequence[str],
                window_s: float) -> tuple[pd.Series, dict[str, pd.DataFrame]]:
    """Rows of ``df`` (``window_start_s``, ``series``, ``columns``) on every window from the first
    to the last start, ``window_s`` apart, a window without a row 0.

    Args:
        df: rows with ``window_start_s`` (Unix seconds, whole windows apart), ``series`` and
            ``columns`` (numbers; several rows of one window and series are summed).

    Returns:
        (window starts, Unix seconds; ``{column: frame}``, one frame per column with a column
        per value of ``series`` (the one column ``""`` when ``series`` is None), one row per
        window).
    """
    starts = df["window_start_s"].astype("float64")
    lo = float(starts.min())
    k = ((starts - lo) / float(window_s)).round().astype("int64")
    n = int(k.max()) + 1 if len(k) else 0
    keys = df[series].astype(str) if series is not None else pd.Series("", index=df.index)
    codes, names = pd.factorize(keys, sort=True)
    grid = pd.Series(lo + float(window_s) * np.arange(n), name="window_start_s")
    out = {}
    for col in columns:
        v = pd.to_numeric(df[col]).fillna(0).to_numpy()
        wide = np.zeros((n, len(names)), dtype=v.dtype)
        np.add.at(wide, (k.to_numpy(), codes), v)
        out[col] = pd.DataFrame(wide, columns=[str(x) for x in names])
    return grid, out


def stepped_traces(starts_s: pd.Series, values: pd.DataFrame, *, window_s: float,
                   stack: bool, names: dict[str, str] | None = None,
                   colours: dict[str, str] | None = None,
                   custom: dict[str, Sequence[pd.DataFrame]] | None = None,
                   hovertemplate: str, order: Sequence[str] | None = None) -> list[go.Scatter]:
    """The stepped form of a bar chart (:data:`MAX_BARS`): one ``go.Scatter`` per column of
    ``values`` (in ``order``, default the columns' order), points at the windows' middles
    (:func:`window_x`) joined by steps that change half-way between two middles, i.e. at the
    windows' edges (``line_shape="hvh"``); ``stack``: stacked areas (``stackgroup``), else
    lines. Each point's hover as the bars': ``customdata`` = the frames of ``custom[column]``
    (their column of the same name) then the window's start (:func:`window_from`).

    Args:
        starts_s: window starts, Unix seconds, one per row of ``values`` (from
            :func:`window_grid`).
        values: the bar heights, one column per series.
        names: column -> legend name (Plotly text); a column not in it is named by its own
            value as Plotly text (:func:`plotly_text`: a reason, a scope from the data).
    """
    x = window_x(starts_s, window_s)
    start_text = window_from(starts_s)
    traces = []
    for col in (order if order is not None else list(values.columns)):
        colour = (colours or {}).get(col)
        extra = [f[col] if col in f.columns else 0 for f in (custom or {}).get(col, ())]
        traces.append(go.Scatter(
            x=x, y=values[col], name=(names or {}).get(col, plotly_text(col)), mode="lines",
            line=dict(shape="hvh", color=colour, width=1 if stack else 1.5),
            fillcolor=colour if stack else None, stackgroup="bars" if stack else None,
            hoveron="points", customdata=_cells(*extra, start_text),
            hovertemplate=hovertemplate))
    return traces


def window_x(starts_s: pd.Series, window_s: float | None) -> pd.Series:
    """THE x of a window on every time chart: its middle, ``start + window_s / 2``, as naive
    UTC datetimes (``window_s`` None or 0: the start itself). Points sit there; bars are drawn
    centred on it (:data:`BAR_FILL` of the window wide), so every chart of one window shares
    its x values.

    Args:
        starts_s: window starts, Unix seconds (``window_start_s`` of the store's queries).
        window_s: the window length, seconds.
    """
    half = 0.5 * float(window_s) if window_s else 0.0
    return utc_times(starts_s.astype("float64") + half)


def window_from(starts_s: pd.Series) -> list[str]:
    """The hover text of a window: its start, ``2026-11-28 10:00`` (UTC)."""
    return utc_times(starts_s).dt.strftime("%Y-%m-%d %H:%M").tolist()


#: The share of its window a bar (or a group of bars) covers, centred on :func:`window_x`.
BAR_FILL = 0.9


def series_label(df: pd.DataFrame, by: Sequence[str]) -> pd.Series:
    """One text label per row joining the ``by`` columns: ``'tiny-llama / server-a'``, each
    value as Plotly text (:func:`plotly_text`): the label is a legend name, tick or hover text.

    Missing values read ``'(none)'``. With no ``by`` columns every row is ``'all'``.
    """
    cols = [c for c in by if c in df.columns]
    if not cols:
        return pd.Series(["all"] * len(df), index=df.index, dtype="object")
    parts = [df[c].astype("object").where(df[c].notna(), "(none)").astype(str).map(plotly_text)
             for c in cols]
    label = parts[0]
    for p in parts[1:]:
        label = label + " / " + p
    return label


def _bar_width_ms(window_s: float) -> float:
    """A window's bar width on a date axis (milliseconds): :data:`BAR_FILL` of the window."""
    return float(window_s) * 1000.0 * BAR_FILL


def _colour_map(labels: Sequence[str]) -> dict[str, str]:
    return {lab: PALETTE[i % len(PALETTE)] for i, lab in enumerate(sorted(set(labels)))}


def _empty(title: str, note: str = "no data in this range") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, **_LAYOUT)
    fig.add_annotation(text=note, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font=dict(size=16, color="#888"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def hit_rate_over_time(df: pd.DataFrame, *, by: Sequence[str] = ("model", "instance"),
                       threshold: float | None = 0.5, window_s: float | None = None,
                       title: str = "Prefix-cache hit rate",
                       min_query_tokens: int = 0) -> go.Figure:
    """Token hit rate per window, one line per series, with the alert threshold and restarts.

    Args:
        df: rows of ``prefixscope.store.queries.metrics.hit_rate_by_window``: ``window_start_s`` (Unix s),
            ``window_end_s``, the ``by`` columns, ``hit_tokens``, ``query_tokens`` (tokens),
            ``hit_rate`` (fraction in [0, 1], NULL when no queries: drawn as a gap) and
            ``restarts`` (counter drops in the window: marked with a red x and a dotted line).
            Oldest first or any order (sorted here).
        by: columns that name a series (``model``, ``instance``...).
        threshold: fraction drawn as a dashed line (the OK/ALERT boundary), or None.
        window_s: window length in seconds, for the title.
        title: figure title.
        min_query_tokens: a window with more than 0 and fewer query tokens than this is low
            volume: left out of its line (which joins its neighbours) and drawn as a hollow
            grey marker in the trace ``fewer than N query tokens (not on the line)``; 0 marks
            none. The Overview passes ``[alerts] min_query_tokens`` (docs/metrics.md).

    Returns:
        A line chart, one point per window drawn at the window's middle (UTC), y = hit rate on
        a 0-100% axis; the threshold's label sits right of the plot area, on its y.
    """
    suffix = f" per {fmt_window(window_s)} window" if window_s else ""
    if df.empty:
        return _empty(title + suffix)
    d = df.sort_values("window_start_s").copy()
    if window_s:  # a missing window breaks the line instead of bridging the gap
        d = with_gaps(d, window_s=window_s, keys=[c for c in by if c in d.columns])
        d = d.sort_values("window_start_s")
    d["series"] = series_label(d, by)
    # A point stands for its whole window: drawn at the window's middle (window_x)
    d["t"] = window_x(d["window_start_s"], window_s)
    d["from"] = window_from(d["window_start_s"])
    colours = _colour_map(d["series"].tolist())
    q = pd.to_numeric(d["query_tokens"], errors="coerce").astype("float64")
    d["low"] = (q > 0) & (q < float(min_query_tokens)) if min_query_tokens else False
    fig = go.Figure()
    for label, all_g in d.groupby("series", sort=True):
        g = all_g[~all_g["low"]]
        fig.add_trace(go.Scatter(
            x=g["t"], y=g["hit_rate"].astype("float64"), mode=line_mode(len(g)), name=str(label),
            line=dict(color=colours[label], width=2), marker=dict(size=8),
            connectgaps=False,
            customdata=list(zip(g["hit_tokens"].astype("float64"), g["query_tokens"].astype("float64"),
                                g["from"])),
            hovertemplate=("window from %{customdata[2]} UTC<br>hit rate %{y:.1%}<br>"
                           "%{customdata[0]:,.0f} of %{customdata[1]:,.0f} tokens"
                           f"<extra>{label}</extra>"),
        ))
    low = d[d["low"]]
    if not low.empty:
        fig.add_trace(go.Scatter(
            x=low["t"], y=low["hit_rate"].astype("float64"), mode="markers",
            name=f"fewer than {int(min_query_tokens):,} query tokens (not on the line)",
            marker=dict(symbol="circle-open", size=9, color=LOW_VOLUME_COLOUR,
                        line=dict(width=2)),
            customdata=list(zip(low["hit_tokens"].astype("float64"),
                                low["query_tokens"].astype("float64"), low["from"],
                                low["series"].astype(str))),
            hovertemplate=("%{customdata[3]}<br>window from %{customdata[2]} UTC<br>hit rate "
                           "%{y:.1%}<br>%{customdata[0]:,.0f} of %{customdata[1]:,.0f} tokens"
                           " (low volume)<extra>low volume</extra>"),
        ))
    if "restarts" in d.columns:
        r = d[d["restarts"].fillna(0) > 0]
        if not r.empty:
            fig.add_trace(go.Scatter(
                x=r["t"], y=[1.04] * len(r), mode="markers", name="restart (counter drop)",
                marker=dict(symbol="x", size=11, color=MISS_COLOUR),
                customdata=list(zip(r["restarts"].astype("float64"), r["from"])),
                hovertemplate="window from %{customdata[1]} UTC<br>%{customdata[0]:.0f} "
                              "restart(s)<extra>restart</extra>",
            ))
            for t in r["t"].unique():
                fig.add_vline(x=pd.Timestamp(t).to_pydatetime(), line=dict(color=MISS_COLOUR,
                              width=1, dash="dot"))
    if threshold is not None:
        fig.add_hline(y=float(threshold), line=dict(color=THRESHOLD_COLOUR, width=1, dash="dash"))
        # the label outside the plot area, right of it on the threshold's y (never on the data)
        fig.add_annotation(xref="paper", x=1.0, xanchor="left", yref="y", y=float(threshold),
                           yanchor="middle", showarrow=False, align="left",
                           text=f"alert<br>below<br>{float(threshold):.0%}",
                           font=dict(size=11, color=THRESHOLD_COLOUR))
    fig.update_layout(title=title + suffix, height=420, **_LAYOUT)
    if threshold is not None:
        fig.update_layout(margin={**_LAYOUT["margin"], "r": 60})
    fig.update_yaxes(title="hit rate", range=[0, 1.08], tickformat=".0%")
    fig.update_xaxes(title="time (UTC)", range=_time_range(d["window_start_s"], window_s))
    return fig


def _panel_spacing(n: int, most: float) -> float:
    """The vertical gap between ``n`` stacked subplots, a fraction of the figure's height: at
    most ``most``, and small enough that ``n`` panels fit (Plotly refuses a gap over
    ``1 / (n - 1)``: ``ValueError: Vertical spacing cannot be greater than ...``, seen with 22
    model x instance panels)."""
    return min(most, 0.3 / max(n, 1))


def tokens_over_time(df: pd.DataFrame, *, by: Sequence[str] = ("model", "instance"),
                     window_s: float = 3600.0, title: str = "Query and hit tokens") -> go.Figure:
    """Query tokens and hit tokens per window as bars, one panel per series.

    Args:
        df: rows of ``hit_rate_by_window``: ``window_start_s`` (Unix s), the ``by`` columns,
            ``query_tokens`` and ``hit_tokens`` (tokens; counter increases in the window).
        by: columns that name a series; each series gets its own panel (rows).
        window_s: window length in seconds (bar width).
        title: figure title.

    Returns:
        Bars drawn inside their window, the pair centred on its middle (:func:`window_x`, UTC),
        y = tokens; query tokens light, hit tokens green, side by side.
    """
    if df.empty:
        return _empty(title)
    d = df.sort_values("window_start_s").copy()
    d["series"] = series_label(d, by)
    d["t"] = window_x(d["window_start_s"], window_s)
    d["from"] = window_from(d["window_start_s"])
    labels = sorted(d["series"].unique().tolist())
    n = len(labels)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, subplot_titles=labels,
                        vertical_spacing=_panel_spacing(n, 0.12))
    width_ms = float(window_s) * 1000.0 * BAR_FILL / 2  # two bars side by side in their window
    for i, label in enumerate(labels, start=1):
        g = d[d["series"] == label]
        common = dict(x=g["t"], width=width_ms, showlegend=(i == 1), customdata=g["from"])
        fig.add_trace(go.Bar(
            y=g["query_tokens"].astype("float64"), name="query tokens", marker_color=QUERY_COLOUR,
            offset=-width_ms, hovertemplate="window from %{customdata} UTC<br>%{y:,.0f} query tokens"
            f"<extra>{label}</extra>", **common), row=i, col=1)
        fig.add_trace(go.Bar(
            y=g["hit_tokens"].astype("float64"), name="hit tokens", marker_color=HIT_COLOUR,
            offset=0.0, hovertemplate="window from %{customdata} UTC<br>%{y:,.0f} hit tokens"
            f"<extra>{label}</extra>", **common), row=i, col=1)
        fig.update_yaxes(title_text="tokens", tickformat=",.0f", rangemode="tozero", row=i, col=1)
    fig.update_layout(title=title + f" per {fmt_window(window_s)} window", barmode="overlay",
                      height=max(320, 230 * n + 90), **_LAYOUT)
    fig.update_xaxes(range=_time_range(d["window_start_s"], window_s))
    fig.update_xaxes(title_text="time (UTC)", row=n, col=1)
    return fig


def request_hit_rate_histogram(df: pd.DataFrame, *,
                               title: str = "Per-request hit rate") -> go.Figure:
    """Distribution of per-request hit rates (requests that reported cached tokens), as counted
    by the store.

    Args:
        df: rows of ``prefixscope.store.queries.requests.request_hit_rate_histogram``: ``bin_start``,
            ``bin_end`` (fractions; bins ``[start, end)``, the last one closed) and ``requests``
            (count of requests whose cached_tokens / prompt_tokens falls in the bin). Lowest
            bin first.
        title: figure title.

    Returns:
        Bars, x = hit rate (0-100%), y = number of requests.
    """
    if df.empty or int(df["requests"].fillna(0).sum()) == 0:
        return _empty(title, "no request reported cached tokens in this range")
    d = df.sort_values("bin_start")
    start = d["bin_start"].astype("float64")
    end = d["bin_end"].astype("float64")
    labels = [f"{a:.0%} to {b:.0%}" for a, b in zip(start, end)]
    fig = go.Figure(go.Bar(
        x=(start + end) / 2.0, y=d["requests"].astype("float64"), width=(end - start) * 0.95,
        marker_color=PALETTE[0], customdata=labels, name="requests",
        hovertemplate="hit rate %{customdata}<br>%{y:,.0f} requests<extra></extra>",
    ))
    fig.update_layout(title=title, showlegend=False,
                      **{k: v for k, v in _LAYOUT.items() if k != "legend"})
    fig.update_xaxes(title="hit rate of the request", tickformat=".0%", range=[0, 1.0])
    fig.update_yaxes(title="requests", rangemode="tozero")
    return fig


def request_hit_rate_over_time(bands: pd.DataFrame, windows: pd.DataFrame | None = None, *,
                               color: str = "model", window_s: float | None = None,
                               threshold: float | None = 0.5,
                               title: str = "Per-request hit rate over time") -> go.Figure:
    """The spread of per-request hit rates per window as bands (10th-90th and 25th-75th
    percentile, median line) and the token-weighted hit rate per window as a line. The browser
    gets a few points per window, never one per request.

    Args:
        bands: rows of ``request_hit_rate_bands``: ``window_start_s`` (Unix s), the ``color``
            column, ``requests``, ``p10``, ``p25``, ``p50``, ``p75``, ``p90`` (fractions).
        windows: rows of ``request_hit_rate_by_window`` (``window_start_s``, the ``color`` column,
            ``hit_rate`` = Σ cached / Σ reported prompt tokens, ``requests``), or None.
        color: column naming the series.
        window_s: window length in seconds (points at the window's middle; legend).
        threshold: fraction drawn as a dashed line, or None.
        title: figure title.

    Returns:
        Per series: a light 10-90% band, a darker 25-75% band, a dotted median and the
        token-weighted line, y on a 0-100% axis.
    """
    have_band = bands is not None and not bands.empty
    have_win = windows is not None and not windows.empty
    if not have_band and not have_win:
        return _empty(title, "no request with a time and cached tokens in this range")
    fig = go.Figure()
    labels: list[str] = []
    b = w = None
    if have_band:
        b = bands.sort_values("window_start_s").copy()
        b["series"] = series_label(b, [color])
        b["t"] = window_x(b["window_start_s"], window_s)
        labels += b["series"].tolist()
    if have_win:
        w = windows.sort_values("window_start_s").copy()
        w["series"] = series_label(w, [color])
        w["t"] = window_x(w["window_start_s"], window_s)
        labels += w["series"].tolist()
    colours = _colour_map(labels)
    name = f"per {fmt_window(window_s)} window" if window_s else "per window"
    if b is not None:
        for label, g in b.groupby("series", sort=True):
            c = colours[label]
            for lo, hi, alpha, what in (("p10", "p90", 0.15, "10-90% of requests"),
                                        ("p25", "p75", 0.3, "25-75% of requests")):
                fig.add_trace(go.Scatter(x=g["t"], y=g[lo].astype("float64"), mode="lines",
                                         line=dict(width=0, color=c), showlegend=False,
                                         hoverinfo="skip", legendgroup=f"{label}{what}"))
                fig.add_trace(go.Scatter(
                    x=g["t"], y=g[hi].astype("float64"), mode="lines", fill="tonexty",
                    line=dict(width=0, color=c), fillcolor=_rgba(c, alpha),
                    name=f"{label}: {what}", legendgroup=f"{label}{what}",
                    customdata=g[[lo, "requests"]].astype("float64").to_numpy(),
                    hovertemplate=(f"{what}<br>%{{customdata[0]:.1%}} to %{{y:.1%}}<br>"
                                   "%{customdata[1]:,.0f} requests" f"<extra>{label}</extra>")))
            fig.add_trace(go.Scatter(
                x=g["t"], y=g["p50"].astype("float64"), mode="lines",
                name=f"{label}: median request", line=dict(color=c, width=1, dash="dot"),
                hovertemplate="median request %{y:.1%}" f"<extra>{label}</extra>"))
    if w is not None:
        for label, g in w.groupby("series", sort=True):
            fig.add_trace(go.Scatter(
                x=g["t"], y=g["hit_rate"].astype("float64"), mode=line_mode(len(g)),
                name=f"{label}: {name}", line=dict(color=colours[label], width=2),
                marker=dict(size=5),
                hovertemplate="window %{x|%Y-%m-%d %H:%M} UTC<br>hit rate %{y:.1%}"
                              f"<extra>{label}</extra>",
            ))
    if threshold is not None:
        fig.add_hline(y=float(threshold), line=dict(color=THRESHOLD_COLOUR, width=1, dash="dash"))
    fig.update_layout(title=title + (f" ({name})" if window_s else ""), **_LAYOUT)
    fig.update_yaxes(title="hit rate", range=[-0.03, 1.05], tickformat=".0%")
    fig.update_xaxes(title="time (UTC)")
    return fig


def _rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def coverage_bars(df: pd.DataFrame, *, title: str = "Requests reporting cached_tokens") -> go.Figure:
    """Share of requests whose usage reported ``cached_tokens``, per model and instance.

    Args:
        df: rows of ``prefixscope.store.queries.requests.cached_tokens_coverage``: ``model``, ``instance``,
            ``requests``, ``reported_requests`` (counts) and ``coverage`` (fraction in [0, 1]).
        title: figure title.

    Returns:
        Horizontal bars, x = coverage (0-100%); bars under 100% are red.
    """
    if df.empty:
        return _empty(title, "no requests in this range")
    d = df.copy()
    d["series"] = series_label(d, ["model", "instance"])
    d = d.sort_values("series", ascending=False)
    cov = d["coverage"].astype("float64")
    colours = [HIT_COLOUR if c >= 0.999999 else MISS_COLOUR for c in cov.fillna(0.0)]
    text = [f"{c:.0%} ({int(rq):,} of {int(n):,})" for c, rq, n in
            zip(cov.fillna(0.0), d["reported_requests"], d["requests"])]
    fig = go.Figure(go.Bar(
        x=cov, y=d["series"], orientation="h", marker_color=colours, text=text,
        textposition="auto", hovertemplate="%{y}<br>%{text}<extra></extra>",
    ))
    fig.update_layout(title=title, height=max(220, 60 * len(d) + 120), showlegend=False,
                      **{k: v for k, v in _LAYOUT.items() if k != "legend"})
    fig.update_xaxes(title="requests that reported cached_tokens", range=[0, 1.0], tickformat=".0%")
    fig.update_yaxes(title=None, automargin=True)
    return fig


def latency_by_band(df: pd.DataFrame, *, column: str = "ttft_ms",
                    title: str = "Time to first token by cached share") -> go.Figure:
    """Latency per cached-share band (cold / partial / warm, the bands of :func:`ttft_by_band`):
    box plots drawn from quantiles the store computed (no points: the browser never gets the
    requests).

    Args:
        df: rows of ``prefixscope.store.queries.requests.request_latency_quantiles``: ``band``
            (``cold``, ``partial``, ``warm``), ``requests``, ``p05_ms``, ``p25_ms``,
            ``p50_ms``, ``p75_ms``, ``p95_ms``, ``mean_ms`` (milliseconds).
        column: ``ttft_ms`` or ``latency_ms`` (axis title and the empty note).
        title: figure title.

    Returns:
        Up to three boxes, cold, partial, warm, each named with its rule and request count
        (``warm (≥ 80% cached), 1,234 requests``): box = 25th-75th percentile, line = median,
        whiskers = 5th and 95th percentile, dashed = mean; y in milliseconds. The title is
        ``title`` alone (the whisker rule is :data:`BOX_RULE`, for the page's caption: in the
        title it was cut in a half-width column at 1400 px).
    """
    from prefixscope.store.queries.serving import TTFT_BANDS, ttft_band_label

    if df.empty or "band" not in df.columns:
        return _empty(title, f"no request has {column} in this range")
    fig = go.Figure()
    for band, _share in TTFT_BANDS:
        g = df[df["band"] == band]
        if g.empty:
            continue
        r = g.iloc[0]
        label = f"{ttft_band_label(band)}, {int(r['requests']):,} requests"
        fig.add_trace(go.Box(
            x=[label], name=label, q1=[float(r["p25_ms"])], median=[float(r["p50_ms"])],
            q3=[float(r["p75_ms"])], lowerfence=[float(r["p05_ms"])],
            upperfence=[float(r["p95_ms"])], mean=[float(r["mean_ms"])], boxpoints=False,
            marker_color=BAND_COLOURS.get(band, PALETTE[0])))
    fig.update_layout(title=title, showlegend=False,
                      **{k: v for k, v in _LAYOUT.items() if k != "legend"})
    fig.update_yaxes(title=f"{column.removesuffix('_ms')} (ms)", rangemode="tozero",
                     tickformat=",.0f")
    return fig


#: What the boxes of :func:`latency_by_band` draw (a caption under the figures).
BOX_RULE = ("Box: 25th to 75th percentile, line: median, dashed: mean, whiskers: 5th and "
            "95th percentile.")
#: Colour of each TTFT band (:data:`prefixscope.store.queries.serving.TTFT_BANDS`).
BAND_COLOURS = {"cold": MISS_COLOUR, "partial": "#ff7f0e", "warm": HIT_COLOUR}
#: Title of the usage-log TTFT panel (the rule is in each legend entry).
TTFT_BANDS_TITLE = "TTFT by cached share (usage log)"


def ttft_by_band(df: pd.DataFrame, *, window_s: float, by: Sequence[str] = ("model",),
                 title: str = TTFT_BANDS_TITLE) -> go.Figure:
    """Time to first token per window from the usage log, one panel per model (shared time
    axis, each its own ms axis), a colour per cached-share band (cold / partial / warm), p50
    solid and p90 dotted; each point at its window's middle (:func:`window_x`), lines broken
    at windows without requests of that band; a marker on each point (:func:`line_mode`), so a
    band of one window (all of a model's requests in one window) is drawn, not empty axes.

    Args:
        df: rows of ``prefixscope.store.queries.serving.ttft_by_band_window``:
            ``window_start_s`` (Unix s), the ``by`` columns, ``band``, ``requests``,
            ``p50_ms``, ``p90_ms`` (milliseconds).
        window_s: window length, seconds.
        by: the columns naming a panel (``model``).
        title: figure title (the window is appended).

    Returns:
        A figure whose legend names every band with its rule (``warm (≥ 80% cached)``; one
        entry per band, toggling its p50 and p90 lines) under the title "p50 solid, p90
        dotted".
    """
    from prefixscope.store.queries.serving import TTFT_BANDS, ttft_band_label

    suffix = f" per {fmt_window(window_s)} window"
    if df.empty:
        return _empty(title + suffix, "no request with ttft_ms and cached_tokens in this range")
    d = df.copy()
    d["panel"] = series_label(d, by)
    panels = sorted(d["panel"].unique().tolist())
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True,
                        vertical_spacing=_panel_spacing(len(panels), 0.08),
                        subplot_titles=panels if len(panels) > 1 else None)
    in_legend: set[str] = set()  # one legend entry per band, at its first line
    for row, panel in enumerate(panels, start=1):
        g0 = d[d["panel"] == panel]
        for band, _share in TTFT_BANDS:
            g = g0[g0["band"] == band]
            if g.empty:
                continue
            g = with_gaps(g[["window_start_s", "requests", "p50_ms", "p90_ms"]],
                          window_s=window_s).sort_values("window_start_s")
            x = window_x(g["window_start_s"], window_s)
            frm = window_from(g["window_start_s"])
            label = ttft_band_label(band)
            for col, q, dash in (("p50_ms", "p50", "solid"), ("p90_ms", "p90", "dot")):
                fig.add_trace(go.Scatter(
                    x=x, y=g[col].astype("float64"), mode=line_mode(len(g)),
                    connectgaps=False, marker=dict(size=7), name=label, legendgroup=band, showlegend=band not in in_legend,
                    line=dict(color=BAND_COLOURS.get(band, PALETTE[0]), width=2, dash=dash),
                    customdata=list(zip(frm, g["requests"].astype("float64"))),
                    hovertemplate=(f"{panel}<br>window from %{{customdata[0]}} UTC<br>"
                                   f"{q} %{{y:,.1f}} ms of %{{customdata[1]:,.0f}} requests"
                                   f"<extra>{label}</extra>")), row=row, col=1)
                in_legend.add(band)
        fig.update_yaxes(title_text="ms", rangemode="tozero", tickformat=",.0f", row=row, col=1)
    fig.update_layout(title=title + suffix, height=200 + 180 * len(panels), **_LAYOUT)
    fig.update_layout(legend_title_text="p50 solid, p90 dotted:")
    fig.update_xaxes(range=_time_range(d["window_start_s"], window_s))
    return fig


def _model_label(row: pd.Series) -> str:
    label = plotly_text(row["model"])
    if bool(row.get("shadow", False)):
        label += " (shadow price)"
    return label


def savings_by_model_bars(df: pd.DataFrame, *, title: str = "Cost without and with the prefix cache"
                          ) -> go.Figure:
    """Cost without the cache beside cost with it, per model (models without a price left out).

    Args:
        df: rows of ``prefixscope.store.queries.savings.savings_by_model``: ``model``, ``currency``,
            ``shadow`` (bool: a self-hosted shadow price), ``cost_without_cache``,
            ``cost_with_cache``, ``saved`` (currency amounts), ``saved_fraction`` (fraction).
        title: figure title.

    Returns:
        Grouped horizontal bars; the x axis names the currency when there is only one.
    """
    d = df[df["cost_without_cache"].notna()].copy() if not df.empty else df
    if d.empty:
        return _empty(title, "no priced model in this range")
    d["label"] = d.apply(_model_label, axis=1)
    currencies = sorted({str(c) for c in d["currency"].dropna()})
    cur = currencies[0] if len(currencies) == 1 else None
    unit = plotly_text(currency_prefix(cur)) if cur else "currency"
    fig = go.Figure()
    for col, name, colour in (("cost_without_cache", "without cache", QUERY_COLOUR),
                              ("cost_with_cache", "with cache", HIT_COLOUR)):
        fig.add_trace(go.Bar(
            y=d["label"], x=d[col].astype("float64"), name=name, orientation="h",
            marker_color=colour,
            text=[plotly_text(fmt_money(v, c)) for c, v in zip(d["currency"], d[col])],
            textposition="auto",
            hovertemplate="%{y}<br>" + name + ": %{text}<extra></extra>",
        ))
    fig.update_layout(title=title, barmode="group", height=max(260, 90 * len(d) + 140), **_LAYOUT)
    fig.update_xaxes(title=f"cost ({unit})", rangemode="tozero", tickformat="~r")
    fig.update_yaxes(title=None, automargin=True)
    return fig


def savings_over_time(df: pd.DataFrame, *, window_s: float = 86400.0,
                      title: str = "Saved by the prefix cache") -> go.Figure:
    """Amount saved per window and model.

    Args:
        df: rows of ``prefixscope.store.queries.savings.savings_by_window``: ``window_start_s`` (Unix s),
            ``model``, ``currency``, ``saved`` (currency amount; rows without are not drawn).
        window_s: window length in seconds, for the title and bar width.
        title: figure title.

    Returns:
        Bars centred on their window's middle (:func:`window_x`, UTC), y = amount saved, one
        colour per model and currency.
    """
    d = df[df["saved"].notna()].copy() if not df.empty else df
    if d.empty:
        return _empty(title, "no priced requests in this range")
    d["series"] = (d["model"].astype(str) + " (" + d["currency"].map(currency_prefix) + ")"
                   ).map(plotly_text)
    d["t"] = window_x(d["window_start_s"], window_s)
    d["from"] = window_from(d["window_start_s"])
    colours = _colour_map(d["series"].tolist())
    fig = go.Figure()
    for label, g in d.groupby("series", sort=True):
        fig.add_trace(go.Bar(x=g["t"], y=g["saved"].astype("float64"), name=str(label),
                             marker_color=colours[label], width=_bar_width_ms(window_s),
                             customdata=g["from"],
                             hovertemplate="window from %{customdata} UTC<br>saved %{y:~r}"
                                           f"<extra>{label}</extra>"))
    fig.update_layout(title=title + f" per {fmt_window(window_s)} window", barmode="stack",
                      **_LAYOUT)
    fig.update_yaxes(title="saved", tickformat="~r", rangemode="tozero")
    fig.update_xaxes(title="time (UTC)", range=_time_range(d["window_start_s"], window_s))
    return fig


# Scopes page (prefixscope.store.queries.scopes)

SCOPE_ORDER = ["PUBLIC", "TENANT", "PRINCIPAL", "UNSCOPED"]
SCOPE_COLOURS = {"PUBLIC": "#2ca02c", "TENANT": "#1f77b4", "PRINCIPAL": "#9467bd",
                 "UNSCOPED": "#7f7f7f"}


def scope_rate_figure(df: pd.DataFrame, *, series: str, title: str, window_s: float,
                      colours: dict[str, str] | None = None,
                      span_s: tuple[float, float] | None = None) -> go.Figure:
    """Hit rate per window, one line per value of ``series``, broken at a window without
    requests of that series (:func:`with_gaps`: no diagonal joins two windows across an empty
    one).

    Args:
        df: ``hit_rate_by_scope_window`` rows: ``window_start_s``, ``series``, ``hit_rate``,
            ``cached_tokens``, ``reported_prompt_tokens``.
        span_s: the shown run's (first, last) time, Unix s: the x range (:func:`_span_range`).
    """
    fig = go.Figure()
    for name, g in df.sort_values("window_start_s").groupby(series, sort=True):
        g = with_gaps(g, window_s=window_s, keys=[series]).sort_values("window_start_s")
        fig.add_trace(go.Scatter(
            x=window_x(g["window_start_s"], window_s), y=g["hit_rate"].astype("float64"),
            mode=line_mode(int(g["hit_rate"].notna().sum())), connectgaps=False,
            name=plotly_text(name), line=dict(color=(colours or {}).get(str(name))),
            customdata=_cells(g["cached_tokens"], g["reported_prompt_tokens"],
                              window_from(g["window_start_s"])),
            hovertemplate="window from %{customdata[2]} UTC<br>%{y:.1%} "
                          "(%{customdata[0]:,} of %{customdata[1]:,} tokens)"
                          "<extra>%{fullData.name}</extra>"))
    fig.update_layout(title=f"{title} per {fmt_window(window_s)}", yaxis=dict(
        title="hit rate", tickformat=".0%", range=[0, 1.02]), xaxis_title="time (UTC)",
        margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.22),
        showlegend=True)  # one series (one reason) is named too
    fig.update_xaxes(range=_span_range(df["window_start_s"] if not df.empty else
                                      pd.Series(dtype="float64"), window_s, span_s))
    return fig


def scope_saved_figure(df: pd.DataFrame, *, window_s: float,
                       span_s: tuple[float, float] | None = None) -> go.Figure:
    """Saved prefill tokens (= cached tokens) per window, stacked by scope in
    :data:`SCOPE_ORDER`.

    Args:
        df: ``hit_rate_by_scope_window`` rows: ``window_start_s``, ``scope``,
            ``saved_prefill_tokens``.
        span_s: the shown run's (first, last) time, Unix s: the x range (:func:`_span_range`).
    """
    fig = go.Figure()
    scopes = [s for s in SCOPE_ORDER if s in set(df["scope"])]
    if stepped(df["window_start_s"].nunique()):
        starts, wide = window_grid(df, series="scope", columns=("saved_prefill_tokens",),
                                   window_s=window_s)
        fig.add_traces(stepped_traces(
            starts, wide["saved_prefill_tokens"], window_s=window_s, stack=True,
            colours=SCOPE_COLOURS, order=scopes,
            hovertemplate="window from %{customdata[0]} UTC<br>%{y:,} tokens"
                          "<extra>%{fullData.name}</extra>"))
    for scope in scopes if not fig.data else ():
        g = df[df["scope"] == scope].sort_values("window_start_s")
        fig.add_trace(go.Bar(x=window_x(g["window_start_s"], window_s),
                             y=g["saved_prefill_tokens"], name=scope,
                             width=_bar_width_ms(window_s), customdata=window_from(g["window_start_s"]),
                             marker_color=SCOPE_COLOURS[scope],
                             hovertemplate="window from %{customdata} UTC<br>%{y:,} tokens"
                                           "<extra>%{fullData.name}</extra>"))
    fig.update_layout(barmode="stack", title=f"Saved prefill tokens per {fmt_window(window_s)}",
                      yaxis_title="tokens", xaxis_title="time (UTC)",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.22),
        showlegend=True)  # one series (one reason) is named too
    fig.update_xaxes(range=_span_range(df["window_start_s"] if not df.empty else
                                      pd.Series(dtype="float64"), window_s, span_s))
    return fig


# Rejections page

def rejection_reasons_figure(df: pd.DataFrame, *, window_s: float,
                             span_s: tuple[float, float] | None = None) -> go.Figure:
    """Rejected requests per window, stacked by first mismatching field.

    Args:
        df: ``rejections_by_reason_window`` rows: ``window_start_s``, ``reason``, ``rejects``,
            ``lost_candidate_tokens``.
        span_s: the shown run's (first, last) time, Unix s: the x range (:func:`_span_range`).
    """
    fig = go.Figure()
    hover = ("window from %{customdata[1]} UTC<br>%{y:,} rejects, %{customdata[0]:,} candidate "
             "tokens<extra>%{fullData.name}</extra>")
    if not df.empty and stepped(df["window_start_s"].nunique()):
        starts, wide = window_grid(df, series="reason",
                                   columns=("rejects", "lost_candidate_tokens"), window_s=window_s)
        names = sorted(wide["rejects"].columns)
        fig.add_traces(stepped_traces(
            starts, wide["rejects"], window_s=window_s, stack=True, order=names,
            custom={n: [wide["lost_candidate_tokens"]] for n in names}, hovertemplate=hover))
    for reason, g in (() if fig.data else
                      df.sort_values("window_start_s").groupby("reason", sort=True)):
        fig.add_trace(go.Bar(x=window_x(g["window_start_s"], window_s), y=g["rejects"],
                             name=plotly_text(reason), width=_bar_width_ms(window_s),
                             customdata=_cells(g["lost_candidate_tokens"],
                                               window_from(g["window_start_s"])),
                             hovertemplate="window from %{customdata[1]} UTC<br>%{y:,} rejects, "
                                           "%{customdata[0]:,} candidate tokens"
                                           "<extra>%{fullData.name}</extra>"))
    fig.update_layout(barmode="stack", title=f"Rejections by reason per {fmt_window(window_s)}",
                      yaxis_title="requests", xaxis_title="time (UTC)",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.22),
        showlegend=True)  # one series (one reason) is named too
    fig.update_xaxes(range=_span_range(df["window_start_s"] if not df.empty else
                                      pd.Series(dtype="float64"), window_s, span_s))
    return fig


def miss_breakdown_figure(df: pd.DataFrame, *, window_s: float,
                          span_s: tuple[float, float] | None = None) -> go.Figure:
    """Ordinary misses, version-mismatch misses and other rejections per window.

    Args:
        df: ``miss_breakdown_by_window`` rows: ``window_start_s``, ``ordinary_miss_requests``,
            ``version_mismatch_requests``, ``other_reject_requests``.
        span_s: the shown run's (first, last) time, Unix s: the x range (:func:`_span_range`).
    """
    fig = go.Figure()
    kinds = (("ordinary_miss_requests", "ordinary miss (no candidate)", "#9ecae1"),
             ("version_mismatch_requests", "version-mismatch miss", "#ff7f0e"),
             ("other_reject_requests", "other rejection", "#d62728"))
    if not df.empty and stepped(df["window_start_s"].nunique()):
        cols = [c for c, _, _ in kinds]
        starts, wide = window_grid(df, series=None, columns=cols, window_s=window_s)
        values = pd.DataFrame({c: wide[c][""] for c in cols})
        for trace, (_, name, _) in zip(stepped_traces(
                starts, values, window_s=window_s, stack=False,
                names={c: n for c, n, _ in kinds}, colours={c: k for c, _, k in kinds},
                hovertemplate="window from %{customdata[0]} UTC<br>%{y:,} requests"), kinds):
            trace.hovertemplate += f"<extra>{name}</extra>"
            fig.add_trace(trace)
    else:
        x = window_x(df["window_start_s"], window_s)
        start_text = window_from(df["window_start_s"])
        width = _bar_width_ms(window_s) / 3  # three bars side by side, centred on the middle
    for k, (col, name, colour) in enumerate(() if fig.data else kinds):
        fig.add_trace(go.Bar(x=x, y=df[col], name=name, marker_color=colour, width=width,
                             offset=(k - 1.5) * width, customdata=start_text,
                             hovertemplate="window from %{customdata} UTC<br>%{y:,} requests"
                                           f"<extra>{name}</extra>"))
    fig.update_layout(barmode="overlay",
                      title=f"Version-mismatch misses beside ordinary misses per {fmt_window(window_s)}",
                      yaxis_title="requests", xaxis_title="time (UTC)",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.22),
        showlegend=True)  # one series (one reason) is named too
    fig.update_xaxes(range=_span_range(df["window_start_s"] if not df.empty else
                                      pd.Series(dtype="float64"), window_s, span_s))
    return fig


# Replay page (prefixscope.store.queries.replay)

def wrap_label(text: object, width: int = 28) -> str:
    """A bar label on lines of at most ``width`` characters (``<br>`` between words), so long
    run labels do not take the plot's width away from the bars (Replay page at 1400 px); each
    line as Plotly text (:func:`plotly_text`: the ``<br>`` are the only markup)."""
    words, lines, line = str(text).split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    lines.append(line)
    return "<br>".join(plotly_text(x) for x in lines)


def run_hit_rate_bars(df: pd.DataFrame) -> go.Figure:
    """Hit rate per run, one horizontal bar each (first run on top), labels wrapped
    (:func:`wrap_label`).

    Args:
        df: ``replay_runs`` rows: ``label``, ``hit_rate``.
    """
    fig = go.Figure(go.Bar(y=[wrap_label(v) for v in df["label"]], x=df["hit_rate"],
                           orientation="h", text=[fmt_pct(v) for v in df["hit_rate"]],
                           textposition="auto"))
    fig.update_layout(title="Hit rate per run (Σ cached ÷ Σ prompt tokens)",
                      xaxis=dict(range=[0, 1], tickformat=".0%", nticks=6),
                      yaxis=dict(autorange="reversed", automargin=True),
                      height=140 + 50 * len(df), margin=dict(t=50, b=10))
    return fig


def run_cost_bars(df: pd.DataFrame, currency: str) -> go.Figure:
    """Cost without and with the cache per run, in ``currency``, horizontal bars; labels
    wrapped (:func:`wrap_label`), at most 4 x ticks with the currency symbol (they overlapped
    at half of 1400 px), the legend above the plot.

    Args:
        df: ``replay_runs`` rows priced: ``label``, ``cost_without_cache``, ``cost_with_cache``.
    """
    labels = [wrap_label(v) for v in df["label"]]
    fig = go.Figure([
        go.Bar(name="without cache", y=labels, x=df["cost_without_cache"], orientation="h"),
        go.Bar(name="with cache", y=labels, x=df["cost_with_cache"], orientation="h"),
    ])
    top = float(pd.concat([df["cost_without_cache"], df["cost_with_cache"]]).max() or 0.0)
    decimals = 2 if top >= 1 else max(2, 1 - math.floor(math.log10(top))) if top > 0 else 2
    fig.update_layout(barmode="group", title=f"Cost per run ({plotly_text(currency)})",
                      xaxis=dict(nticks=4, tickprefix=plotly_text(currency_prefix(currency)),
                                 tickformat=f",.{decimals}f", rangemode="tozero"),
                      yaxis=dict(autorange="reversed", automargin=True),
                      height=140 + 70 * len(df), margin=dict(t=80, b=10),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0))
    return fig


def run_windows_figure(df: pd.DataFrame, labels: dict[str, str], window_s: float) -> go.Figure:
    """Hit rate per window of run time (since each run's first request; minutes, or hours for
    runs longer than 10 hours), each point at its window's middle, lines broken at windows
    without requests.

    Args:
        df: ``replay_run_windows`` rows: ``run_id``, ``window_start_s`` (seconds since the
            run's first request), ``hit_rate``.
        labels: run id -> label in the legend.
    """
    hours = float(df["window_start_s"].max()) > 36_000
    unit_s, unit = (3600.0, "hours") if hours else (60.0, "minutes")
    # each point at its window's middle; a window without requests breaks the run's line
    d = with_gaps(df, window_s=window_s, keys=["run_id"]).sort_values("window_start_s")
    fig = go.Figure()
    for run_id, g in d.groupby("run_id", sort=False):
        fig.add_trace(go.Scatter(x=(g["window_start_s"] + window_s / 2) / unit_s,
                                 y=g["hit_rate"], mode=line_mode(len(g)), connectgaps=False,
                                 name=plotly_text(labels.get(run_id, run_id))))
    fig.update_layout(title=f"Hit rate over the run ({window_s / 60:g}-minute windows)",
                      xaxis_title=f"{unit} since the run's first request",
                      yaxis=dict(range=[0, 1.05], tickformat=".0%"), height=420,
                      margin=dict(t=50, b=10), legend=dict(orientation="h", y=-0.25))
    return fig


# Breakers page (prefixscope.store.queries.breakers)

def breakers_lost_figure(df: pd.DataFrame) -> go.Figure:
    """Lost tokens per breaker, rank 1 on top.

    Args:
        df: ``breakers_of`` rows: ``rank``, ``kind``, ``lost_tokens``, ``lost_tokens_measured``
            and the position columns of
            :func:`prefixscope.core.formatting.breaker_position`.
    """
    d = df.sort_values("rank", ascending=False)
    names = [plotly_text(f"#{int(r['rank'])} {r['kind']} · {breaker_position(r)}")
             for _, r in d.iterrows()]
    fig = go.Figure(go.Bar(
        x=d["lost_tokens"], y=names, orientation="h",
        marker_color=["#1f77b4" if m else "#aec7e8" for m in d["lost_tokens_measured"]],
        hovertemplate="%{x:,} lost tokens<extra></extra>"))
    fig.update_layout(title="Lost tokens per breaker (light: upper bound, not measured)",
                      xaxis_title="tokens", height=120 + 36 * len(d),
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


#: The miss ledger's waterfall steps after the prompt tokens (``store.queries.ledger``
#: columns, in the ledger's test order) and the words on the axis.
LEDGER_STEPS = (("granularity_tokens", "engine granularity"), ("routing_tokens", "routing"),
                ("capacity_tokens", "capacity"), ("isolation_tokens", "isolation"),
                ("prompt_change_tokens", "prompt change"), ("cold_tokens", "cold"))


def ledger_waterfall_figure(df: pd.DataFrame, *, title: str = "Where the prompt tokens went"
                            ) -> go.Figure:
    """The miss ledger as a waterfall, one group of bars per routing policy: prompt tokens,
    minus each loss class (:data:`LEDGER_STEPS`), equals the tokens from cache.

    Args:
        df: ``store.queries.ledger.ledger_totals(..., by=("router",))`` rows (``router``,
            ``prompt_tokens``, ``hit_tokens`` and the class columns; tokens), one per policy,
            in rank order.
        title: the figure's title.
    """
    fig = go.Figure()
    if df.empty:
        fig.update_layout(title=title, annotations=[dict(text="no data", showarrow=False)])
        return fig
    labels = ["prompt tokens", *(w for _, w in LEDGER_STEPS), "from cache"]
    for k, (_, r) in enumerate(df.iterrows()):
        p = int(r["prompt_tokens"])
        ys = [p, *(-int(r[c]) for c, _ in LEDGER_STEPS), int(r["hit_tokens"])]
        texts = [f"{abs(v):,}" + (f" ({100 * abs(v) / p:.1f}%)" if p else "") for v in ys]
        fig.add_trace(go.Waterfall(
            name=plotly_text(str(r["router"])), x=labels, y=ys, text=texts,
            textposition="outside",
            measure=["absolute", *["relative"] * len(LEDGER_STEPS), "total"],
            decreasing=dict(marker_color=MISS_COLOUR),
            totals=dict(marker_color=HIT_COLOUR if k == 0 else PALETTE[(k + 1) % len(PALETTE)]),
            increasing=dict(marker_color=QUERY_COLOUR),
            connector=dict(line=dict(color="#bbbbbb", width=1)),
            hovertemplate="%{x}: %{text}<extra>" + plotly_text(str(r["router"])) + "</extra>"))
    fig.update_layout(title=title, yaxis_title="tokens", waterfallgroupgap=0.25,
                      showlegend=len(df) > 1, legend_title_text="router",
                      margin=dict(l=10, r=10, t=50, b=10), height=420)
    return fig


def with_gaps(df: pd.DataFrame, *, window_s: float, keys: Sequence[str] = (),
              max_windows: int = 20_000) -> pd.DataFrame:
    """``df`` with a row of NaN values for every missing window between a series' first and
    last window, so lines break at gaps (a window without data is not drawn as a line to the
    next one).

    Args:
        df: rows with ``window_start_s`` (Unix s) and the ``keys`` columns (any order).
        window_s: window length, seconds.
        keys: columns naming a series.
        max_windows: series spanning more windows are returned as they are.
    """
    if df.empty or not window_s:
        return df
    parts = []
    groups = df.groupby(list(keys), dropna=False, sort=False) if keys else [((), df)]
    for _key, g in groups:
        lo, hi = float(g["window_start_s"].min()), float(g["window_start_s"].max())
        n = int(round((hi - lo) / float(window_s))) + 1
        if n > max_windows or n == len(g):
            parts.append(g)
            continue
        full = pd.DataFrame({"window_start_s": [lo + k * float(window_s) for k in range(n)]})
        # merged on the time alone, the key columns copied from the group: a NULL key (requests
        # stored without an instance: None in an object column) cannot be matched against a
        # float NaN, and pandas refuses to merge float64 on object
        m = full.merge(g.drop(columns=list(keys)), on="window_start_s", how="left")
        for c in keys:
            m[c] = g[c].iloc[0]
        parts.append(m[list(g.columns)])
    return pd.concat(parts, ignore_index=True)


#: d3 tick format of a :func:`window_lines` log axis with a value under 1 (two significant
#: digits, no exponent: 0.32, 2, 10,000).
LOG_SMALL_TICKFORMAT = ",.2~r"
#: The note of a :func:`window_lines` log-axis figure whose every window is 0 (or missing).
LOG_EMPTY_NOTE = "no window above 0 in this range (a log axis has no 0)"


def window_lines(df: pd.DataFrame, *, series: dict[str, str], window_s: float,
                 by: Sequence[str] = (), title: str, y_title: str,
                 tickformat: str = ",.0f", hover_format: str = ",.1f",
                 note: str = "no data in this range", y_range: list | None = None,
                 integer: bool = False, log_y: bool = False) -> go.Figure:
    """One line per (group, value column) over time; a point per window at the window's middle
    (as :func:`hit_rate_over_time`), lines broken where windows are missing.

    Args:
        df: rows with ``window_start_s`` (Unix s), the ``by`` columns and the value columns.
        series: value column -> legend suffix (``{"p50_ms": "p50"}``); one line per column.
        window_s: window length, seconds.
        by: columns naming a group (each group x column is one line).
        title, y_title: figure and y-axis titles; ``tickformat``, ``hover_format``: d3 formats.
        note: text of the empty figure.
        y_range: fixed y range, or None.
        integer: counts (whole-number ticks; an all-zero series gets a 0-1 axis).
        log_y: logarithmic y axis (series of very different sizes side by side); values of 0
            or less are left out (a gap in the line: a log axis has no 0); with none above 0,
            the empty figure with :data:`LOG_EMPTY_NOTE` (never a bare log axis); a value
            under 1 gives the axis :data:`LOG_SMALL_TICKFORMAT`. Each point has a marker
            (:func:`line_mode`): a line of one window drew nothing (session 8: 0.32 tokens/s
            in one window read as an empty log axis with ticks "2, 1, 0, 0, 0, 0").
    """
    suffix = f" per {fmt_window(window_s)} window"
    if df.empty:
        return _empty(title + suffix, note)
    d = with_gaps(df.sort_values("window_start_s"), window_s=window_s, keys=list(by))
    d = d.sort_values("window_start_s")
    d["group"] = series_label(d, by)
    d["t"] = window_x(d["window_start_s"], window_s)
    d["from"] = window_from(d["window_start_s"])
    labels = sorted(d["group"].dropna().unique().tolist())
    colours = _colour_map(labels)
    dashes = ("solid", "dot", "dash", "dashdot")
    fig = go.Figure()
    for label in labels:
        g = d[d["group"] == label]
        for k, (col, name) in enumerate(series.items()):
            if col not in g.columns:
                continue
            full = f"{label} {name}".strip() if label != "all" else name
            fig.add_trace(go.Scatter(
                x=g["t"], y=g[col].astype("float64"),
                mode=line_mode(int(g[col].notna().sum())), name=full, connectgaps=False,
                line=dict(color=colours[label], width=2, dash=dashes[k % len(dashes)]),
                customdata=g["from"],
                hovertemplate=f"window from %{{customdata}} UTC<br>%{{y:{hover_format}}}"
                              f"<extra>{full}</extra>"))
    if log_y:  # 0 has no place on a log axis (it drew as a drop to the bottom): left out
        for tr in fig.data:
            tr.y = [v if v is not None and v == v and v > 0 else None for v in tr.y]
        if not any(v is not None for tr in fig.data for v in tr.y):
            # a bare log axis of no point drew ticks "2, 1, 0, 0, 0, 0"
            return _empty(title + suffix, LOG_EMPTY_NOTE)
        if min(v for tr in fig.data for v in tr.y if v is not None) < 1:
            tickformat = LOG_SMALL_TICKFORMAT  # ",.0f" read the ticks of 0.1-1 as "0, 0, 0"
    fig.update_layout(title=title + suffix, height=360, **_LAYOUT)
    if log_y:
        fig.update_yaxes(title=y_title, type="log", tickformat=tickformat)
    else:
        fig.update_yaxes(title=y_title, tickformat=tickformat, rangemode="tozero",
                         **({"range": y_range} if y_range else {}))
    if integer:
        top = max((float(d[c].max()) for c in series if c in d and d[c].notna().any()),
                  default=0.0)
        fig.update_yaxes(tick0=0, dtick=max(1, math.ceil(top / 5)),
                         **({} if top > 0 else {"range": [0, 1]}))
    fig.update_xaxes(range=_time_range(d["window_start_s"], window_s))
    return fig


# --- the frame rule: every figure's title clear of the modebar, its legend clear of the x axis

#: Height of the band at the top of a chart that Plotly's modebar (the zoom/pan/download icons,
#: drawn at the top right of the figure) takes, pixels: every title starts below it, so no
#: page's modebar covers a title (a long title reaches under the icons in a half-width column).
MODEBAR_PX = 34
#: Top margin of a titled figure, pixels: the modebar band, the title (about 20 px), a gap.
TITLE_TOP_PX = 80
#: Top margin of a figure whose legend sits above the plot: the title band plus a legend row.
TITLE_LEGEND_TOP_PX = 110
#: Room under the plot for the x tick labels (a date axis has two lines) and the axis title.
X_AXIS_PX = 72
#: One row of a horizontal legend, pixels; the width one is packed into (half a 1400 px page).
LEGEND_ROW_PX = 22
LEGEND_WIDTH_PX = 560


def _legend_names(fig: go.Figure) -> list[str]:
    names: list[str] = []
    for tr in fig.data:
        name = getattr(tr, "name", None)
        if name and tr.showlegend is not False and name not in names:
            names.append(str(name))
    return names


def _legend_rows(names: Sequence[str], width_px: float = LEGEND_WIDTH_PX) -> int:
    """Rows a horizontal legend of ``names`` takes ``width_px`` wide (each entry about 40 px
    of symbol and gap plus 7 px a character, packed greedily; at least 1)."""
    rows, used = 1, 0.0
    for name in names:
        w = 40.0 + 7.0 * len(name)
        if used and used + w > width_px:
            rows, used = rows + 1, 0.0
        used += w
    return rows


def frame(fig: go.Figure) -> go.Figure:
    """THE layout rule of every figure of the dashboard (applied to each public figure
    function's result, so every page follows it): the title starts :data:`MODEBAR_PX` below
    the top (under the modebar's band, never beneath its icons) with :data:`TITLE_TOP_PX` of
    top margin; a horizontal legend below the plot sits at the figure's bottom edge (container
    coordinates) under :data:`X_AXIS_PX` kept for the x tick labels and axis title, the bottom
    margin grown by its rows (:func:`_legend_rows`), so a legend entry never lands on the
    "time (UTC)" axis title whatever the plot's height; a legend above the plot gets
    :data:`TITLE_LEGEND_TOP_PX`. Idempotent; returns ``fig``.
    """
    lay = fig.layout
    top = lay.margin.t if lay.margin.t is not None else 0
    legend = lay.legend
    below = legend.orientation == "h" and legend.yref != "container" and (
        legend.y is None or legend.y < 0)
    above = legend.orientation == "h" and legend.y is not None and legend.y >= 1
    if lay.title.text:
        fig.update_layout(title=dict(yref="container", y=1, yanchor="top",
                                     pad=dict(t=MODEBAR_PX)))
        top = max(top, TITLE_LEGEND_TOP_PX if above else TITLE_TOP_PX)
    fig.update_layout(margin=dict(t=top))
    names = _legend_names(fig)
    if (below or legend.yref == "container") and lay.showlegend is not False and names:
        rows = _legend_rows(names)
        bottom = lay.margin.b if lay.margin.b is not None else 0
        fig.update_layout(legend=dict(yref="container", y=0, yanchor="bottom", xanchor="left",
                                      x=0),
                          margin=dict(b=max(bottom, X_AXIS_PX + rows * LEGEND_ROW_PX + 8)))
    return fig


def _framed(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return frame(fn(*args, **kwargs))

    wrapper.framed = True
    return wrapper


#: The public figure functions (return annotation ``go.Figure``), each wrapped in :func:`frame`.
FRAMED = tuple(name for name, obj in list(globals().items())
               if callable(obj) and not name.startswith("_") and name != "frame"
               and getattr(obj, "__module__", None) == __name__
               and getattr(obj, "__annotations__", {}).get("return") == "go.Figure")
for _name in FRAMED:
    globals()[_name] = _framed(globals()[_name])
