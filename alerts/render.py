"""Rendering of the daily report: subject, plain text, HTML and a small PNG bar chart.

Pure functions of a :class:`~alerts.daily.DailyReport` (or a subset of its lines for one
recipient group); no database, no network. The chart is drawn with matplotlib's Agg backend
(no display, no browser), so it works offline and in a container.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from datetime import datetime
from urllib.parse import urlencode

from prefixscope.alerts.daily import Change, DailyReport, Figures, ReportLine, resolve_tz
from prefixscope.core.report import ALERT, INCONSISTENT, NO_DATA, OK, SEVERITY, STALE
from prefixscope.core.formatting import count_noun, fmt_pct, fmt_pct_vs, fmt_pp, money_decimals

SUBJECT_PREFIX = "[prefixscope]"
#: At most this many lines in the chart (worst first); the text lists all.
CHART_MAX_LINES = 12
_STATUS_COLOUR = {OK: "#1a7f37", ALERT: "#cf222e", NO_DATA: "#6e7781", STALE: "#9a6700",
                  INCONSISTENT: "#cf222e"}


def worst_line(lines: Sequence[ReportLine]) -> ReportLine | None:
    """The line the subject names: worst status, then model lines before scope lines, then
    lowest hit rate, then name."""
    if not lines:
        return None
    return min(lines, key=lambda ln: (-SEVERITY[ln.status], ln.is_detail,
                                      ln.figures.hit_rate if ln.figures.hit_rate is not None else 2.0,
                                      ln.label))


def _fmt_pct(rate: float | None) -> str:
    """The dashboard's one percent format (:func:`prefixscope.core.formatting.fmt_pct`, one
    decimal: ``39.8%``), so the email and the Alerts page read the same figure."""
    return "n/a" if rate is None else fmt_pct(rate)


def _fmt_pp(change: float | None) -> str:
    """A change in percentage points, one decimal, as the dashboard (``-33.1 pp``; never
    ``-0.0 pp``)."""
    return "n/a" if change is None else fmt_pp(change)


def _fmt_money(amount: float | None, currency: str | None) -> str:
    """``INR 48.64``; an amount under 0.1 keeps three significant digits (``USD 0.000357``), as
    on the dashboard (``prefixscope.core.formatting.money_decimals``), so a small saving never reads
    0.00."""
    if amount is None:
        return ""
    return f"{currency or ''} {amount:,.{money_decimals(amount)}f}".strip()


def subject(report: DailyReport, lines: Sequence[ReportLine] | None = None) -> str:
    """``[prefixscope] ALERT tiny-llama 12.3% hit rate 2026-11-28`` for the worst line of
    ``lines`` (default all), with ``(+N more)`` when N other lines share its status.

    STALE names the last scrape (``no scrape after 14:05``); NO DATA the volume
    (``1 prompt token``); a report without lines reads ``NO DATA no prefix-cache data``.
    """
    lines = list(report.lines if lines is None else lines)
    day = report.window.day.isoformat()
    top = worst_line(lines)
    if top is None:
        return f"{SUBJECT_PREFIX} {NO_DATA} no prefix-cache data {day}"
    if top.status == STALE and top.stale:
        last = max(s.last_ts_unix_s for s in top.stale)
        when = datetime.fromtimestamp(last, tz=resolve_tz(report.window.tz))
        figure = f"no scrape after {when:%H:%M}" if when.date() == report.window.day else \
            f"no scrape since {when:%Y-%m-%d %H:%M}"
    elif top.status == NO_DATA or top.figures.hit_rate is None:
        n = top.figures.prompt_tokens
        figure = count_noun(n, "prompt token")
    else:
        figure = f"{fmt_pct_vs(top.figures.hit_rate, top.threshold)} hit rate"
    more = sum(1 for ln in lines if ln.status == top.status and ln.instance is None) - 1
    extra = f" (+{more} more)" if more > 0 and top.status != OK else ""
    return f"{SUBJECT_PREFIX} {top.status} {top.label} {figure}{extra} {day}"


def dashboard_link(base_url: str, report: DailyReport) -> str:
    """The dashboard's Alerts page for the report day: ``<base>/alerts?day=YYYY-MM-DD&tz=...``."""
    return f"{base_url.rstrip('/')}/alerts?" + urlencode(
        {"day": report.window.day.isoformat(), "tz": report.window.tz})


def _compare(name: str, fig: Figures | None, change: float | None) -> str:
    if fig is None or fig.hit_rate is None:
        return f"{name} no data"
    pp = "" if change is None else f" ({_fmt_pp(change)})"
    return f"{name} {_fmt_pct(fig.hit_rate)}{pp}"


def _detail(ln: ReportLine) -> str:
    parts = [_compare("previous day", ln.prev_day, ln.change_prev_day),
             _compare("week before", ln.prev_week, ln.change_prev_week)]
    if ln.saved is not None:
        price = "shadow price" if ln.shadow_price else "list price"
        parts.append(f"saved {_fmt_money(ln.saved, ln.currency)} ({price})")
        if ln.miss_cost:
            parts.append(f"misses cost {_fmt_money(ln.miss_cost, ln.currency)}")
    src = {"metrics": "vLLM counters", "requests": "per-request usage"}.get(ln.figures.source)
    if src:
        parts.append(f"source: {src}")
    if ln.figures.restarts:
        parts.append(f"{ln.figures.restarts} restart(s)")
    if ln.figures.coverage is not None and ln.figures.coverage < 1:
        parts.append(f"{fmt_pct(ln.figures.coverage)} of requests reported cached tokens")
    return "; ".join(parts)


def _change_text(c: Change) -> str:
    who = c.model if c.tenant_digest is None else f"namespace {c.tenant_digest} ({c.model})"
    return (f"{who}: {_fmt_pct(c.prev_hit_rate)} -> {_fmt_pct(c.hit_rate)} "
            f"({_fmt_pp(c.change)}), {c.prompt_tokens:,} prompt tokens")


def _fell(report: DailyReport, lines: Sequence[ReportLine]) -> tuple[list[Change], list[Change]]:
    models = {ln.model for ln in lines}
    return ([c for c in report.fell_models if c.model in models],
            [c for c in report.fell_namespaces if c.model in models])


def _definitions(dashboard_url: str | None) -> str:
    """Where the statuses are defined: the served dashboard's Alerts page (which explains them),
    or the docs page name when no dashboard URL is known."""
    if dashboard_url:
        return dashboard_url.rstrip("/") + "/alerts"
    return "docs/alerts.md in the prefixscope repository"


def render_text(report: DailyReport, lines: Sequence[ReportLine] | None = None, *,
                dashboard_url: str | None = None) -> str:
    """The plain-text body: a heading, one report line per model/scope with its comparison
    details, the largest falls, the dashboard link and where the formulas are documented."""
    lines = list(report.lines if lines is None else lines)
    w = report.window
    zone = resolve_tz(w.tz)
    start = datetime.fromtimestamp(w.start_s, tz=zone)
    out = [f"prefixscope daily report for {w.day.isoformat()} ({w.tz}, from "
           f"{start:%Y-%m-%d %H:%M} for {w.length_s / 3600:g} h)",
           f"Status: {worst_line(lines).status if lines else NO_DATA}", ""]
    if not lines:
        out.append("No prefix-cache data for this day: no vLLM counters and no production "
                   "requests with cached_tokens.")
    width = max((len(ln.label) + (2 if ln.is_detail else 0) for ln in lines), default=0)
    for ln in lines:
        label = ("  " if ln.is_detail else "") + ln.label
        out.append(f"{label:<{width}}  {ln.text}")
        out.append(f"{'':<{width}}  {_detail(ln)}")
    fell_models, fell_ns = _fell(report, lines)
    if fell_models or fell_ns:
        out += ["", "Fell most since the previous day:"]
        out += [f"  {_change_text(c)}" for c in fell_models + fell_ns]
    if dashboard_url:
        out += ["", f"Dashboard: {dashboard_link(dashboard_url, report)}"]
    out += ["", "Healthy means at least half of the prompt tokens came from the prefix cache "
            f"(threshold per model in [alerts]). Definitions: {_definitions(dashboard_url)}"]
    return "\n".join(out) + "\n"


def render_html(report: DailyReport, lines: Sequence[ReportLine] | None = None, *,
                dashboard_url: str | None = None, chart_cid: str | None = None) -> str:
    """The HTML body: a table of the lines (status in colour), the chart as
    ``<img src="cid:...">`` when ``chart_cid`` is given, the falls and the dashboard link.
    Every value is HTML-escaped."""
    lines = list(report.lines if lines is None else lines)
    e = html.escape
    w = report.window
    status = worst_line(lines).status if lines else NO_DATA
    rows = []
    for ln in lines:
        colour = _STATUS_COLOUR[ln.status]
        label = e(ln.model) + ("" if ln.scope is None else f" <small>{e(ln.scope)}</small>")
        if ln.instance is not None:
            label = f"&nbsp;&nbsp;{e(ln.model)} <small>on {e(ln.instance)}</small>"
        pad = "padding:4px 8px;border-bottom:1px solid #d0d7de"
        rows.append(
            f"<tr><td style=\"{pad}\">{label}</td>"
            f"<td style=\"{pad};text-align:right\">{ln.figures.cached_tokens:,}</td>"
            f"<td style=\"{pad};text-align:right\">{ln.figures.prompt_tokens:,}</td>"
            f"<td style=\"{pad};text-align:right\">{e(fmt_pct_vs(ln.figures.hit_rate, ln.threshold)) if ln.figures.hit_rate is not None else 'n/a'}</td>"
            f"<td style=\"{pad};color:{colour};font-weight:bold\">{e(ln.status)}</td>"
            f"<td style=\"{pad}\">{e(ln.text)}<br><small style=\"color:#57606a\">"
            f"{e(_detail(ln))}</small></td></tr>")
    head = ("<tr>" + "".join(
        f"<th style=\"text-align:left;padding:4px 8px;border-bottom:2px solid #d0d7de\">{h}</th>"
        for h in ("model / scope", "cached tokens", "prompt tokens", "hit rate", "status",
                  "report line")) + "</tr>")
    body = [f"<h2 style=\"margin:0 0 8px 0\">prefixscope daily report {e(w.day.isoformat())} "
            f"<small>({e(w.tz)})</small>: "
            f"<span style=\"color:{_STATUS_COLOUR[status]}\">{e(status)}</span></h2>"]
    if lines:
        body.append(f"<table style=\"border-collapse:collapse;font-size:14px\">{head}"
                    f"{''.join(rows)}</table>")
    else:
        body.append("<p>No prefix-cache data for this day: no vLLM counters and no production "
                    "requests with cached_tokens.</p>")
    if chart_cid:
        body.append(f"<p><img src=\"cid:{e(chart_cid)}\" alt=\"hit rate by model: this day, "
                    f"the previous day and a week earlier\" style=\"max-width:640px\"></p>")
    fell_models, fell_ns = _fell(report, lines)
    if fell_models or fell_ns:
        items = "".join(f"<li>{e(_change_text(c))}</li>" for c in fell_models + fell_ns)
        body.append(f"<h3>Fell most since the previous day</h3><ul>{items}</ul>")
    if dashboard_url:
        link = e(dashboard_link(dashboard_url, report), quote=True)
        body.append(f"<p><a href=\"{link}\">Open the dashboard</a></p>")
    body.append("<p style=\"color:#57606a;font-size:12px\">Healthy means at least half of the "
                "prompt tokens came from the prefix cache (threshold per model in [alerts]). "
                f"Definitions: {e(_definitions(dashboard_url))}</p>")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head>"
            "<body style=\"font-family:sans-serif\">" + "".join(body) + "</body></html>")


def chart_text(value: object) -> str:
    """``value`` as literal text for a matplotlib label: a ``$`` escaped (``\\$``), so a name
    from the data is never typeset as mathtext (``$x^2$``) nor a parse error (an unbalanced
    ``$\\frac`` raised ``ValueError: ParseException`` on the Alerts page, the second attack on
    issue 27), and control characters shown as U+FFFD (they have no glyph)."""
    text = "".join("\ufffd" if ord(c) < 32 or 0x7f <= ord(c) < 0xa0 else c for c in str(value))
    return text.replace("$", "\\$")


def render_chart_png(report: DailyReport, lines: Sequence[ReportLine] | None = None) -> bytes | None:
    """A small horizontal bar chart (PNG bytes, about 640 px wide): hit rate per line for the
    day, the previous day and the same weekday a week earlier, with each line's threshold
    marked. None when no line has a hit rate on any of the three days.

    At most :data:`CHART_MAX_LINES` lines are drawn, worst first.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    lines = list(report.lines if lines is None else lines)
    lines.sort(key=lambda ln: (-SEVERITY[ln.status], ln.label))
    lines = lines[:CHART_MAX_LINES]

    def rate(f: Figures | None) -> float | None:
        return None if f is None else f.hit_rate

    if not any(rate(ln.figures) is not None or rate(ln.prev_day) is not None
               or rate(ln.prev_week) is not None for ln in lines):
        return None
    lines.reverse()  # matplotlib draws the first bar at the bottom
    n = len(lines)
    fig = Figure(figsize=(6.4, 1.2 + 0.42 * n), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    height = 0.26
    series = (("week before", lambda ln: rate(ln.prev_week), "#d0d7de", -height),
              ("previous day", lambda ln: rate(ln.prev_day), "#8c959f", 0.0))
    for name, get, colour, offset in series:
        ax.barh([i + offset for i in range(n)], [(get(ln) or 0.0) * 100 for ln in lines],
                height=height, color=colour, label=name)
    ax.barh([i + height for i in range(n)],
            [(rate(ln.figures) or 0.0) * 100 for ln in lines], height=height,
            color=[_STATUS_COLOUR[ln.status] for ln in lines], label=report.window.day.isoformat())
    for i, ln in enumerate(lines):
        ax.plot([ln.threshold * 100] * 2, [i - 0.45, i + 0.45], color="#24292f",
                linestyle="--", linewidth=0.8)
        r = rate(ln.figures)
        ax.text(min((r or 0) * 100 + 1, 101), i + height, "n/a" if r is None else _fmt_pct(r),
                va="center", fontsize=7)
    ax.set_yticks(range(n), [chart_text(ln.label) for ln in lines], fontsize=8)
    ax.set_xlim(0, 110)
    ax.set_xticks([0, 25, 50, 75, 100], ["0%", "25%", "50%", "75%", "100%"], fontsize=8)
    ax.set_title("Prefix-cache hit rate (tokens); dashed: threshold", fontsize=9)
    from matplotlib.patches import Patch

    handles = [Patch(color="#d0d7de", label="week before"),
               Patch(color="#8c959f", label="previous day"),
               Patch(color="#24292f", label=f"{report.window.day.isoformat()} (colour: status)")]
    ax.legend(handles=handles, fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.12 - 0.3 / n), ncol=3, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
