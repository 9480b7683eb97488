"""Overview: is the prefix cache working? Hit rate over time from vLLM's counters.

Reads ``hit_rate_by_window`` (Δhits / Δqueries per window, from ``vllm:prefix_cache_hits_total``
and ``vllm:prefix_cache_queries_total``), ``hit_rate_totals`` and ``cache_config`` through
``prefixscope.dashboard.data``. Every rate shown is computed by the store (``docs/metrics.md``); this page
only formats and draws it.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data, figures, filters
from prefixscope.core import report
from prefixscope.core.formatting import (fmt_age, fmt_int, fmt_pct, fmt_pct_vs, fmt_time,
                                         fmt_window, md_text)
from prefixscope.dashboard.downloads import show_table

EMPTY = ("No data in this range — ingest with `prefixscope ingest metrics "
         "http://localhost:8000/metrics` (or a saved exposition file), or widen the time range.")


def status_badge(hit_tokens, query_tokens, threshold: float, min_query_tokens: int = 1) -> str:
    """The status (:func:`prefixscope.core.report.status_of`: NO DATA under
    ``min_query_tokens`` query tokens, as the daily strip and the alert email say) as a
    coloured Markdown badge; ``NO DATA`` of a window with some tokens says why."""
    q = _tokens(query_tokens)
    word = report.status_of(_tokens(hit_tokens), q, threshold=threshold,
                            min_query_tokens=min_query_tokens)
    colour = {report.OK: "green", report.ALERT: "red", report.INCONSISTENT: "red"}.get(word, "gray")
    badge = f":{colour}-badge[{word}]"
    if word == report.NO_DATA and q > 0:
        badge += f" (under the {fmt_int(min_query_tokens)}-token minimum)"
    return badge


#: How a KPI card, the table and the banner name where a figure comes from.
COUNTERS = "vLLM counters"
USAGE_LOG = "usage log"
#: The daily statuses' ``source`` values (``alerts.daily``) -> the words above.
DAY_SOURCE = {"metrics": COUNTERS, "counters": COUNTERS, "requests": USAGE_LOG}


def why_text(model: str, hints) -> str:
    """The banner's pointer to a cause, from the one hint rule of the report lines
    (:class:`prefixscope.core.report.AlertHints` of the alerting days,
    ``store.queries.alerts.alert_hints``): the Breakers page when it holds a diagnosis of
    ``model``; else what the gateway's decision log says of the misses (rejections after a
    cache-epoch bump or a revocation, accepts not served) and the Rejections page; else how to
    get a diagnosis."""
    from prefixscope.core.report import ALERT_HINT

    if model in hints.top_breakers:
        return "Why: the Breakers page"
    hint = hints.hint(model)
    if hint != ALERT_HINT:
        return f"Why, from the gateway's decision log: {md_text(hint)} (the Rejections page)"
    command = md_text(f"prefixscope diagnose <log> --model {model} --ingest", code=True)
    return (f"No diagnosis of {md_text(model, code=True)} yet: {command} puts one on the "
            "Breakers page")


REQUESTS_SOURCE = ("No vLLM counters for this selection: these figures are **per request**, from the "
                   "usage logs (Σ cached_tokens ÷ Σ prompt_tokens of the requests that reported "
                   "cached tokens; docs/metrics.md#per-request-hit-rate-and-coverage).")


def as_counter_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Per-request rows (``cached_tokens``, ``reported_prompt_tokens``) under the counter
    columns the page draws (``hit_tokens``, ``query_tokens``; no restarts, no legacy names)."""
    out = df.rename(columns={"cached_tokens": "hit_tokens",
                             "reported_prompt_tokens": "query_tokens"})
    out["restarts"] = 0
    out["legacy"] = False
    return out


def _tokens(x) -> int:
    return 0 if pd.isna(x) else int(x)


#: A count the usage log left out (vLLM without ``--enable-prompt-tokens-details`` sends no
#: ``cached_tokens``): shown as this, never as 0.
NOT_REPORTED = "not reported"


def _reported(x) -> bool:
    return not pd.isna(x)


def _count_or_not_reported(x) -> str:
    return fmt_int(x) if _reported(x) else NOT_REPORTED


def latest_window_when(start_s: float, window_s: float, now_s: float) -> str:
    """When the latest window with data was: ``from 2026-12-06 23:00 UTC, ended 1 h ago``
    (``in progress`` while ``now_s`` is inside it), so an old reading never reads as the
    present one (issue 28 #3: a 24-hour-old window showed no time).

    Args:
        start_s: the window's start, Unix seconds; window_s: its length, seconds; now_s: now.
    """
    end = float(start_s) + float(window_s)
    age = "in progress" if end > now_s else f"ended {fmt_age(now_s - end)} ago"
    return f"from {fmt_time(start_s)}, {age}"


#: At most this many days in the daily strip (the newest days of the range).
STRIP_DAYS = 14



def strip_days(start_s, end_s, first_ts, last_ts, tz: str, *,
               now_s: float) -> tuple[date, date] | None:
    """The local days the daily strip shows: from the range's start (else the first sample;
    never before the first sample) to its end, else ``now_s`` (never after ``now_s``), at most
    :data:`STRIP_DAYS`, newest kept; None without samples.

    The strip runs to today (or the range's end) whatever the last sample: the days after the
    data stopped read what the daily report says of them (STALE when a source went silent,
    issue 28 #3), never cut off at the last sample.

    Args:
        start_s, end_s: the range, Unix seconds (None: open).
        first_ts, last_ts: the first and last sample of the range, Unix seconds (None or NaN
            without samples).
        tz: IANA zone of the days.
        now_s: now, Unix seconds (``prefixscope.dashboard.data.clock()``).
    """
    lo = start_s if start_s is not None else first_ts
    hi = min(end_s - 1e-3, now_s) if end_s is not None else now_s
    if lo is None or lo != lo or last_ts is None or last_ts != last_ts:
        return None
    if first_ts is not None and first_ts == first_ts:
        lo = max(lo, first_ts)
    zone = ZoneInfo(tz)
    first = datetime.fromtimestamp(lo, tz=zone).date()
    last = datetime.fromtimestamp(hi, tz=zone).date()
    if last < first:
        return None
    return max(first, last - timedelta(days=STRIP_DAYS - 1)), last


def _starts_before(total: pd.DataFrame, day: date, tz: str) -> bool:
    """Whether the model's first sample of the range (``first_ts_unix_s`` of its row) is on a
    local day before ``day`` (a day left out of the strip, which shows at most
    :data:`STRIP_DAYS`)."""
    if "first_ts_unix_s" not in total or total["first_ts_unix_s"].isna().all():
        return False
    first = float(total["first_ts_unix_s"].min())
    return datetime.fromtimestamp(first, tz=ZoneInfo(tz)).date() < day


def stale_banner(model: str, last_ts, now_s: float, day: date, alert: str = "") -> str:
    """The banner of a model whose last strip day reads STALE (a metrics source went silent:
    ``prefixscope.alerts.daily.stale_sources``, the daily report's rule): when its data
    stopped and how long ago, then ``alert`` (what its last days with data read), Markdown.

    Args:
        model: model name (escaped here); last_ts: its last sample, Unix seconds (None: not
            named); now_s: now, Unix seconds; day: the strip's last day.
    """
    since = ("" if last_ts is None or last_ts != last_ts else
             f" since {fmt_time(last_ts)} ({fmt_age(now_s - float(last_ts))} ago)")
    return (f":orange-badge[STALE] **{md_text(model)}: no data{since}**; the daily report of "
            f"{day.isoformat()} reads STALE (a metrics source stopped reporting).{alert}")


def daily_strip(db: str, f, shown: pd.DataFrame, now_s: float) -> None:
    """Per model, the status of each day of the range up to today (the daily report's rule,
    one window a day, STALE included; a day after the model's first without data reads NO
    DATA) and a banner for every model whose latest days read ALERT: ``coder-7b below 50.0%
    since 2026-11-28``, or STALE when its last day does (:func:`stale_banner`, the ALERT
    after it)."""
    from prefixscope.alerts.daily import (ALERT as _ALERT, NO_DATA, STALE, DayStatus, Figures,
                                          alert_since)
    from prefixscope.dashboard import alerts_data

    if shown.empty:
        return
    tz = alerts_data.page_timezone()
    try:
        ZoneInfo(tz)
    except Exception:
        tz = "UTC"
    first_ts = shown["first_ts_unix_s"].min() if "first_ts_unix_s" in shown else None
    last_ts = shown["last_ts_unix_s"].max() if "last_ts_unix_s" in shown else None
    span = strip_days(f.start_s, f.end_s, first_ts, last_ts, tz, now_s=now_s)
    if span is None:
        return
    rows = alerts_data.daily_statuses(db, first_day_iso=span[0].isoformat(),
                                      last_day_iso=span[1].isoformat(), tz=tz, models=f.models,
                                      instances=f.instances, run_ids=f.run_ids, stale=True)
    if not rows:
        return
    statuses = [DayStatus(day=date.fromisoformat(r["day"]), model=r["model"],
                          figures=Figures(r["source"], r["prompt_tokens"], r["cached_tokens"],
                                          r["hit_rate"]),
                          threshold=r["threshold"], status=r["status"]) for r in rows]
    alerting = alert_since(statuses)
    from prefixscope.alerts.daily import DayWindow

    last_day = {s.model: s for s in statuses if s.day == span[1]}
    stale_now = {m for m, s in last_day.items() if s.status == STALE}
    last_ts_of = (dict(zip(shown["model"], shown["last_ts_unix_s"]))
                  if "last_ts_unix_s" in shown else {})
    for model in sorted(stale_now - set(alerting)):
        st.warning(stale_banner(model, last_ts_of.get(model), now_s, span[1]),
                   icon=":material/sensors_off:")

    for model, first in sorted(alerting.items()):
        hints = data.query(db, "alerts", "alert_hints", models=[model],
                           start_s=DayWindow.of(first.day, tz).start_s,
                           end_s=DayWindow.of(span[1], tz).end_s, run_ids=f.run_ids)
        run = [s for s in statuses if s.model == model and s.day >= first.day
               and s.status != STALE]
        days = ", ".join(f"{fmt_pct_vs(s.figures.hit_rate, s.threshold)} on {s.day:%m-%d}" for s in run)
        sources = sorted({md_text(DAY_SOURCE.get(s.figures.source, str(s.figures.source)))
                          for s in run})
        total = shown[shown["model"] == model]
        whole = "" if total.empty else (
            f" The whole range reads {fmt_pct(total['hit_rate'].iloc[0])} "
            f"({md_text(total['source'].iloc[0])}): "
            + ("the days before still count in it." if any(
                s.model == model and s.day < first.day and s.status != NO_DATA
                for s in statuses) or _starts_before(total, first.day, tz) else
               "the same days, pooled (the range holds no day before them)."))
        text = (f":red-badge[ALERT] **{md_text(model)} below {fmt_pct(first.threshold)} since "
                f"{first.day.isoformat()}** (daily hit rate from the {' and '.join(sources)}: "
                f"{days}).{whole} {why_text(model, hints)}; the day's report: Alerts.")
        if model in stale_now:  # its data stopped: the latest reading is old, say so first
            text = stale_banner(model, last_ts_of.get(model), now_s, span[1],
                                " Its last days with data: " + text)
        st.warning(text, icon=":material/sensors_off:" if model in stale_now else
                   ":material/trending_down:")
    st.markdown(f"**Daily status** (days in {md_text(tz)}, as the daily report: Δhits ÷ Δqueries of "
                "each day from the counters, else the usage log)")
    seen = sorted({s.day for s in statuses})
    days = [seen[0] + timedelta(days=k) for k in range((span[1] - seen[0]).days + 1)]
    by_key = {(s.model, s.day): s for s in statuses}
    head = st.columns([2] + [1] * len(days))
    head[0].caption("Model")
    for col, d in zip(head[1:], days):
        col.caption(f"{d:%a %m-%d}")
    for model in sorted({s.model for s in statuses}):
        cols = st.columns([2] + [1] * len(days))
        cols[0].markdown(md_text(model, code=True))
        first_day = min(s.day for s in statuses if s.model == model)
        for col, d in zip(cols[1:], days):
            s = by_key.get((model, d))
            if s is None:  # no data that day: NO DATA after the model's first day
                col.markdown("—" if d < first_day else "—  \n:gray-badge[NO DATA]")
            else:
                colour = ("red" if s.status == _ALERT else "green" if s.status == "OK" else
                          "orange" if s.status == STALE else "gray")  # the Alerts page's
                shown_rate = ("—" if s.figures.hit_rate is None else
                              fmt_pct_vs(s.figures.hit_rate, s.threshold))
                col.markdown(f"{shown_rate}  \n:{colour}-badge[{s.status}]")


#: Why these token figures can differ slightly from the Savings page's (docs/metrics.md).
TOKENS_SOURCE_HELP = (
    "From vLLM's counters (Δ queries and Δ hits between scrapes), else the usage log. The "
    "Savings and Requests pages count the usage log's prompt and cached tokens: a counter "
    "counts a request at the first scrape after it, so the requests after the range's last "
    "scrape are in the usage log's figure and not yet in the counters', and the range's first "
    "scrape counts the requests just before the range, which the usage log leaves out "
    "(docs/metrics.md#two-sources-of-token-counts).")

db = data.db_path()
f = filters.current()
now_s = data.clock()  # "now" of the STALE rule and of the latest window's age
st.title("Overview")
st.caption("Prefix-cache hit rate from vLLM's counters: hit tokens ÷ query tokens of each window "
           f"(`vllm:prefix_cache_hits_total`, `vllm:prefix_cache_queries_total`). {f.describe()}.")

with data.guard(db):
    window_label, window_s = filters.window_picker("overview_window", ("5m", "1h", "1d"), default="1h",
                                                  help="Counter increases are summed per window (windows aligned to UTC).")
    by = ("model", "instance")
    windows = data.hit_rate_by_window(db, start_s=f.start_s, end_s=f.end_s, window_s=window_s,
                                      by=by, models=f.models, instances=f.instances,
                                      run_ids=f.run_ids)
    source = "counters"
    if windows.empty:
        # No counters (the common case behind a gateway): the per-request figure, named.
        windows = as_counter_columns(data.request_hit_rate_by_window(
            db, start_s=f.start_s, end_s=f.end_s, window_s=window_s, by=by, models=f.models,
            instances=f.instances, run_ids=f.run_ids))
        source = "requests"
    if windows.empty:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    # the usage log's totals by model and the note, in one cached call (one read)
    logged_totals, note = data.usage_totals_and_note(
        db, start_s=f.start_s, end_s=f.end_s, models=f.models, instances=f.instances,
        run_ids=f.run_ids)
    if note:
        st.info(f"Two figures for this traffic: {note}.", icon=":material/rule:")
    if source == "requests":
        st.info(REQUESTS_SOURCE, icon=":material/receipt_long:")
        per_model = as_counter_columns(data.request_hit_rate_by_window(
            db, start_s=f.start_s, end_s=f.end_s, window_s=window_s, by=("model",),
            models=f.models, instances=f.instances, run_ids=f.run_ids))
        totals = as_counter_columns(logged_totals).assign(source=USAGE_LOG)
    else:
        per_model = data.hit_rate_by_window(db, start_s=f.start_s, end_s=f.end_s,
                                            window_s=window_s, by=("model",), models=f.models,
                                            instances=f.instances, run_ids=f.run_ids)
        totals = data.hit_rate_totals(db, start_s=f.start_s, end_s=f.end_s, by=("model",),
                                      models=f.models, instances=f.instances, run_ids=f.run_ids)
        totals = totals.assign(source=COUNTERS)
        # models with only usage-log data in the selection (a gateway in front of an engine
        # whose /metrics is not scraped): their card and table row from the usage log, as the
        # daily strip's banner reads them
        counted = set(totals.loc[totals["query_tokens"].fillna(0) > 0, "model"])
        logged = as_counter_columns(logged_totals)
        logged = logged[~logged["model"].isin(counted)
                        & (logged["query_tokens"].fillna(0) > 0)]
        if not logged.empty:
            totals = pd.concat([totals[~totals["model"].isin(set(logged["model"]))],
                                logged.assign(source=USAGE_LOG)], ignore_index=True)
            logged_windows = as_counter_columns(data.request_hit_rate_by_window(
                db, start_s=f.start_s, end_s=f.end_s, window_s=window_s, by=("model",),
                models=sorted(logged["model"]), instances=f.instances, run_ids=f.run_ids))
            per_model = pd.concat([per_model, logged_windows], ignore_index=True)
            st.info("No vLLM counters for " + ", ".join(md_text(m, code=True)
                                                        for m in sorted(logged["model"]))
                    + " in this selection: " + ("its" if len(logged) == 1 else "their")
                    + " figures below are per request, from the usage log (Σ cached_tokens ÷ "
                    "Σ prompt_tokens; docs/metrics.md#per-request-hit-rate-and-coverage); the "
                    "charts draw the counters.", icon=":material/receipt_long:")

    if bool(windows["legacy"].fillna(False).any()):
        st.info("Some of this data comes from the legacy metric names `vllm:gpu_prefix_cache_queries`"
                " / `vllm:gpu_prefix_cache_hits` (older vLLM). They count the same tokens and feed "
                "the same analysis; upgrade vLLM to get `vllm:prefix_cache_*`.",
                icon=":material/history:")
    restarts = int(windows["restarts"].fillna(0).sum())
    if restarts:
        st.warning(f"{restarts} counter drop(s) in this range: the server restarted. Increases are "
                   "counted from the new value (marked ✕ on the chart).",
                   icon=":material/restart_alt:")

    st.subheader("Hit rate over the range, per model")
    latest = (per_model[per_model["query_tokens"].fillna(0) > 0]
              .sort_values("window_start_s").groupby("model", dropna=False).tail(1)
              .set_index("model"))
    shown = totals[totals["query_tokens"].fillna(0) > 0].sort_values("model")
    low_volume = data.min_query_tokens()  # under it: NO DATA, as the daily strip and alerts
    cols = st.columns(4)
    for i, (_, row) in enumerate(shown.iterrows()):
        model = row["model"]
        threshold = data.alert_threshold(model)
        with cols[i % len(cols)]:
            st.metric(
                label=f"{md_text(model)} · whole range",
                value=fmt_pct(row["hit_rate"]),
                help=(f"{fmt_int(row['hit_tokens'])} of {fmt_int(row['query_tokens'])} query tokens "
                      f"from cache over the selected range ({f.describe()}). "
                      f"OK at {fmt_pct(threshold)} or more. The window radio does not change it."),
                border=True,
            )
            st.markdown(f"{status_badge(row['hit_tokens'], row['query_tokens'], threshold, low_volume)} "
                        f"{fmt_int(row['hit_tokens'])} of {fmt_int(row['query_tokens'])} tokens "
                        f"({md_text(row['source'])})",
                        help=TOKENS_SOURCE_HELP)
            if model in latest.index:
                last = latest.loc[model]
                st.markdown(f"Latest {window_label} window, {latest_window_when(last['window_start_s'], window_s, now_s)}: "
                            f"**{fmt_pct(last['hit_rate'])}** "
                            f"{status_badge(last['hit_tokens'], last['query_tokens'], threshold, low_volume)}",
                            help=f"The window from {fmt_time(last['window_start_s'])}: "
                                 f"{fmt_int(last['hit_tokens'])} of "
                                 f"{fmt_int(last['query_tokens'])} query tokens from cache.")
    if shown.empty:
        st.caption("No query tokens in this range.")
    daily_strip(db, f, shown, now_s)

    left, right = st.columns(2)
    left.plotly_chart(figures.hit_rate_over_time(windows, by=by, threshold=data.alert_threshold(),
                                                 window_s=window_s, min_query_tokens=low_volume),
                      key="overview_hit_rate")
    common = dict(start_s=f.start_s, end_s=f.end_s, window_s=window_s, models=f.models,
                  instances=f.instances, run_ids=f.run_ids)
    if source == "counters":
        prompt_rate = data.query(db, "metrics", "counter_increase_by_window",
                                 metric="vllm:prompt_tokens_total", by=by, **common)
        prompt_rate = prompt_rate.assign(per_s=prompt_rate["increase"] / window_s)
    else:  # the usage log's prompt tokens per window
        prompt_rate = windows.assign(per_s=windows["query_tokens"] / window_s)
    right.plotly_chart(figures.window_lines(
        prompt_rate, series={"per_s": ""}, window_s=window_s, by=by,
        title="Prompt tokens per second", y_title="tokens/s (log)", log_y=True,
        note="no vllm:prompt_tokens_total in this range"), key="overview_prompt_rate")
    st.caption("Read the hit rate beside the traffic: a drop in the hit rate while the prompt-token "
               "rate holds is a drop in reuse, not in traffic. Hollow grey points: windows with "
               f"fewer than {fmt_int(low_volume)} query tokens (`[alerts] min_query_tokens`), "
               "left out of the line. Windows with no prompt tokens are gaps on the log axis.")

    st.subheader("Serving")
    left, right = st.columns(2)
    ttft_log = data.query(db, "serving", "ttft_by_band_window", by=("model",), **common)
    left.plotly_chart(figures.ttft_by_band(ttft_log, window_s=window_s), key="overview_ttft_log")
    if source == "counters":  # vLLM's own histogram and gauges need its /metrics
        ttft_hist = data.query(db, "serving", "ttft_histogram_by_window", by=("model",), **common)
        if not ttft_hist.empty:
            ttft_hist = ttft_hist.assign(p50_ms=ttft_hist["p50_s"] * 1000.0,
                                         p90_ms=ttft_hist["p90_s"] * 1000.0)
        right.plotly_chart(figures.window_lines(
            ttft_hist, series={"p50_ms": "p50", "p90_ms": "p90"}, window_s=window_s, by=("model",),
            title="TTFT from vLLM's histogram", y_title="ms",
            note="no vllm:time_to_first_token_seconds in this range"), key="overview_ttft_hist")
        c1, c2, c3 = st.columns(3)
        kv = data.query(db, "serving", "gauge_by_window", metric="vllm:kv_cache_usage_perc",
                        by=("instance",), **common)
        c1.plotly_chart(figures.window_lines(
            kv, series={"mean_value": "mean", "max_value": "max"}, window_s=window_s,
            by=("instance",), title="KV-cache usage", y_title="of the pool", tickformat=".0%",
            hover_format=".1%", note="no vllm:kv_cache_usage_perc in this range"),
            key="overview_kv_usage")
        running = data.query(db, "serving", "gauge_by_window", metric="vllm:num_requests_running",
                             by=("instance",), **common)
        waiting = data.query(db, "serving", "gauge_by_window", metric="vllm:num_requests_waiting",
                             by=("instance",), **common)
        queue = pd.concat([running.assign(kind="running"), waiting.assign(kind="waiting")])
        c2.plotly_chart(figures.window_lines(
            queue, series={"mean_value": "mean"}, window_s=window_s, by=("instance", "kind"),
            title="Running, waiting", y_title="requests", hover_format=",.2f",
            tickformat=",.1f", note="no vllm:num_requests_running in this range"),
            key="overview_queue")
        preempt = data.query(db, "metrics", "counter_increase_by_window",
                             metric="vllm:num_preemptions_total", by=("instance",), **common)
        c3.plotly_chart(figures.window_lines(
            preempt, series={"increase": ""}, window_s=window_s, by=("instance",),
            title="Preemptions", y_title="preemptions", tickformat=",.0f", hover_format=",.0f",
            integer=True,
            note="no vllm:num_preemptions_total in this range"), key="overview_preemptions")

    st.subheader("Whole range per model")
    if not totals.empty:
        reported = [_reported(q) for q in totals["query_tokens"]]
        show_table("overview-1", pd.DataFrame({
            "Model": totals["model"],
            "Hit rate": [fmt_pct(r) if ok else NOT_REPORTED
                         for r, ok in zip(totals["hit_rate"], reported)],
            "Status": [report.status_of(_tokens(h), _tokens(q), threshold=data.alert_threshold(m),
                                        min_query_tokens=low_volume)
                       if ok else NOT_REPORTED
                       for h, q, m, ok in zip(totals["hit_tokens"], totals["query_tokens"],
                                              totals["model"], reported)],
            "Hit tokens": totals["hit_tokens"].map(_count_or_not_reported),
            "Query tokens": totals["query_tokens"].map(_count_or_not_reported),
            "First sample": totals["first_ts_unix_s"].map(fmt_time),
            "Last sample": totals["last_ts_unix_s"].map(fmt_time),
            "Legacy names": totals["legacy"].fillna(False).astype(bool),
            "Source": totals["source"],
        }))

    st.subheader("Cache configuration")
    config = data.cache_config(db, instances=f.instances, run_ids=f.run_ids)
    if f.models is not None and not config.empty:
        config = config[config["model"].isin(f.models)]
    if config.empty:
        st.caption("No `vllm:cache_config_info` sample for these instances.")
    else:
        show_table("overview-2", pd.DataFrame({
            "Instance": config["instance"],
            "Model": config["model"],
            "Engine index": config["engine"],
            "Block size (tokens)": config["block_size"],
            "GPU blocks": config["num_gpu_blocks"],
            "Hash algorithm": config["hash_algo"],
            "Prefix caching": config["enable_prefix_caching"],
            "As of": config["ts_unix_s"].map(fmt_time),
        }))
    st.caption(f"Window: {fmt_window(window_s)}. Formulas: docs/metrics.md (hit rate per window, "
               "restarts). Status threshold from `[alerts] hit_rate_threshold`.")
