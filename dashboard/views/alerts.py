"""Alerts: the daily report of one local day (OK / ALERT / NO DATA / STALE per model and scope)
and the log of every report email sent (``alert_sends``).

Reads through ``prefixscope.dashboard.data.query`` and, for the report, ``prefixscope.dashboard.alerts_data`` (both
cached, read-only, one connection per call). The day
and zone come from the URL (``?day=YYYY-MM-DD&tz=Zone``, the link in the email) or the inputs;
the sidebar filters do not apply: a report covers every model of one local day. Definitions:
``docs/alerts.md``.
"""

from __future__ import annotations

from datetime import date, timedelta

import pandas as pd
import streamlit as st

from prefixscope.dashboard import alerts_data as dashboard_data
from prefixscope.dashboard import data
from prefixscope.core.formatting import fmt_pct, fmt_pp, fmt_time, md_text
from prefixscope.dashboard.downloads import show_table

#: Status colours of the badges (text, never emoji: a server may lack the fonts); the table's
#: status cells take the email's colours (``prefixscope.dashboard.downloads.STATUS_CSS``).
STATUS_COLOUR = {"OK": "green", "ALERT": "red", "NO DATA": "gray", "STALE": "orange",
                 "INCONSISTENT": "red"}


def status_badge(status: str) -> str:
    """The status as a coloured Markdown badge (text, no emoji)."""
    return f":{STATUS_COLOUR.get(status, 'gray')}-badge[{status}]"



def report_line_markdown(ln: dict) -> str:
    """One report line as wrapped Markdown: status badge, model (scope, instance) and the
    email's sentence (values escaped): ALERT coder-7b on gpu-a1: 970,432 of ... from cache."""
    where = "".join(f" {word} {md_text(ln[key])}" for word, key in (("scope", "scope"),
                                                                      ("on", "instance"))
                    if ln.get(key))
    return (f"{status_badge(ln['status'])} **{md_text(ln['model'])}**{where}: "
            f"{md_text(ln['text'])}")


def _rate(fig: dict | None) -> str:
    """A line's hit rate in the one percent format of the dashboard (:func:`fmt_pct`)."""
    return fmt_pct(None if not fig else fig.get("hit_rate"))


db = data.db_path()
st.title("Alerts")
st.caption("The daily report that `prefixscope report daily --send` emails: per model (and scope "
           "from per-request data) the token hit rate of one local day, OK at or above the "
           "threshold, ALERT below, NO DATA under the minimum volume, STALE when a metrics source "
           "stopped reporting. Not filtered by the sidebar. Formulas: docs/alerts.md.")

#: How many days back (from today) the page looks for the alert it opens on.
LOOKBACK_DAYS = 14


def _valid_tz(name: str) -> bool:
    try:
        from prefixscope.alerts.daily import resolve_tz

        resolve_tz(name)
        return True
    except Exception:
        return False


def _param_day(text: str) -> date | None:
    """The ``day`` of the URL as a date, None when it is not one the report can cover."""
    try:
        from prefixscope.alerts.daily import parse_day

        return parse_day(text)
    except Exception:
        return None


def opening_day(db: str, tz: str) -> tuple[date, str | None, date | None]:
    """The day the page opens on without ``?day=``: the day the most recent alert began among
    the last :data:`LOOKBACK_DAYS` days up to today (``prefixscope.alerts.daily.opening_day``),
    else yesterday. Returns ``(day, model or None, the alert's last day or None)``."""
    from prefixscope.alerts.daily import default_day
    from prefixscope.alerts.daily import opening_day as pick

    yesterday = default_day(tz)
    today = yesterday + timedelta(days=1)
    first = today - timedelta(days=LOOKBACK_DAYS)
    try:
        rows = dashboard_data.daily_statuses(db, first_day_iso=first.isoformat(),
                                             last_day_iso=today.isoformat(), tz=tz)
    except Exception:  # no database yet, or busy: the guard below says so
        return yesterday, None, None
    from prefixscope.alerts.daily import DayStatus, Figures

    statuses = [DayStatus(day=date.fromisoformat(r["day"]), model=r["model"],
                          figures=Figures(r["source"], r["prompt_tokens"], r["cached_tokens"],
                                          r["hit_rate"]),
                          threshold=r["threshold"], status=r["status"]) for r in rows]
    day, model = pick(statuses, fallback=yesterday)
    if model is None:
        return day, None, None
    last = max(s.day for s in statuses if s.model == model and s.status == "ALERT")
    return day, model, last


params = st.query_params
tz_default = dashboard_data.page_timezone()  # an IANA zone (else UTC, with a warning)
if "tz" in params:
    if _valid_tz(params["tz"]):
        tz_default = params["tz"]
    else:
        st.warning(f"The link's `tz` parameter ({md_text(repr(params['tz'][:64]))}) is not an "
                   f"IANA time zone (such as UTC or Europe/Berlin): showing "
                   f"{md_text(tz_default)} instead.",
                   icon=":material/link_off:")
day_default, alert_model, alert_last = None, None, None
if "day" in params:
    day_default = _param_day(params["day"])
    if day_default is None:
        st.warning(f"The link's `day` parameter ({md_text(repr(params['day'][:32]))}) is not a day in the "
                   "form YYYY-MM-DD between 1970-01-02 and 2099-12-30: showing the default day "
                   "instead.", icon=":material/link_off:")
if day_default is None:
    day_default, alert_model, alert_last = opening_day(db, tz_default)
c1, c2 = st.columns(2)
day = c1.date_input("Day (local)", value=day_default, key="alerts_day")
tz = c2.text_input("Time zone (IANA)", value=tz_default, key="alerts_tz").strip() or "UTC"
if not _valid_tz(tz):
    st.error(f"Time zone: {md_text(repr(tz[:64]))} is not an IANA time zone: use a name such as UTC or "
             "Europe/Berlin.", icon=":material/error:")
    st.stop()
if alert_model is not None and day == day_default:
    through = (f" and reads ALERT through {alert_last.isoformat()}"
               if alert_last is not None and alert_last != day else "")
    st.caption(f"Showing {day.isoformat()}, the day the latest alert began: {md_text(alert_model)} fell "
               f"below its threshold that day{through}. Pick another day above.")
elif "day" not in params and day == day_default:
    st.caption(f"Showing {day.isoformat()} (yesterday): no alert in the last "
               f"{LOOKBACK_DAYS} days. Pick another day above.")

with data.guard(db):
    rep = dashboard_data.daily_report(db, day_iso=day.isoformat(), tz=tz)
    lines = rep["lines"]
    k1, k2, k3, k4 = st.columns(4)
    with k1:
        st.metric("Status", rep["status"], border=True, help="The worst status among the lines.")
        st.markdown(status_badge(rep["status"]))
    k2.metric("Lines", f"{len(lines):,}", border=True, help="Models, and (model, scope) pairs.")
    k3.metric("ALERT lines", f"{sum(1 for ln in lines if ln['status'] == 'ALERT'):,}",
              border=True)
    k4.metric("Stale sources", f"{len(rep['stale_sources']):,}", border=True,
              help="Metrics sources that stopped reporting during the day.")

    st.subheader(f"Daily report {md_text(rep['day'])} ({md_text(rep['tz'])})")
    if not lines:
        st.info("No prefix-cache data for this day: no vLLM counters and no production requests "
                "with cached_tokens. Pick another day, or ingest data.", icon=":material/info:")
    else:
        table = pd.DataFrame({
            "Model": [ln["model"] for ln in lines],
            "Scope": [ln["scope"] or "all" for ln in lines],
            "Instance": [ln.get("instance") or "all" for ln in lines],
            "Status": [ln["status"] for ln in lines],
            "Report line": [ln["text"] for ln in lines],
            "Hit rate": [_rate(ln["figures"]) for ln in lines],
            "Previous day": [_rate(ln["prev_day"]) for ln in lines],
            "Change": [fmt_pp(ln["change_prev_day"]) for ln in lines],
            "Week before": [_rate(ln["prev_week"]) for ln in lines],
            "Change vs week": [fmt_pp(ln["change_prev_week"]) for ln in lines],
            "Threshold": [fmt_pct(ln["threshold"]) for ln in lines],
            "Source": [{"metrics": "vLLM counters", "requests": "per-request usage"}.get(
                ln["figures"]["source"], "no data") for ln in lines],
        })
        # the sentence is long: hidden in the grid (which cuts it at 1400 px; still in the
        # download) and shown whole, wrapped, under the table
        show_table("alerts-1", table, column_config={"Report line": None})
        with st.container(key="alerts_report_lines"):
            st.markdown("\n".join(f"- {report_line_markdown(ln)}" for ln in lines))
        with st.expander("The email, as it is sent", expanded=True):
            # st.html sanitizes; every value in the email body is already HTML-escaped
            st.html(dashboard_data.daily_email_html(db, day_iso=day.isoformat(), tz=tz))
    for s in rep["stale_sources"]:
        st.warning(f"STALE: no scrape from {md_text(s['instance'], code=True)} "
                   f"({md_text(s['model'])}) after "
                   f"{fmt_time(s['last_ts_unix_s'])}; stale after {s['stale_after_s']:g} s of "
                   "silence.", icon=":material/sensors_off:")
    fell = rep["fell_models"] + rep["fell_namespaces"]
    if fell:
        st.subheader("Fell most since the previous day")
        show_table("alerts-2", pd.DataFrame({
            "Model": [c["model"] for c in fell],
            "Namespace digest": [c["tenant_digest"] or "all" for c in fell],
            "Previous day": [fmt_pct(c["prev_hit_rate"]) for c in fell],
            "This day": [fmt_pct(c["hit_rate"]) for c in fell],
            "Change": [fmt_pp(c["change"]) for c in fell],
            "Prompt tokens": [c["prompt_tokens"] for c in fell],
        }))

    st.subheader("Emails sent")
    only_day = st.checkbox("Only this day", value=False, key="alerts_only_day")
    sends = data.query(db, "alerts", "alert_sends", day=day.isoformat() if only_day else None,
                       limit=500)
    if sends.empty:
        st.caption("No report email recorded yet. Send with `prefixscope report daily --send` "
                   "(cron or systemd timer: docs/alerts.md).")
    else:
        failed = sends[sends["status"] == "failed"]
        if not failed.empty:
            st.warning(f"{len(failed):,} send(s) failed (recorded as failed, not sent; the next "
                       "run retries them): " + "; ".join(
                           f"{md_text(d)} to {md_text(r)}: {md_text(e)}" for d, r, e in
                           zip(failed["day"], failed["recipients"], failed["error"])),
                       icon=":material/mail_lock:")
        show_table("alerts-3", pd.DataFrame({
            "Recorded": sends["created_unix_s"].map(fmt_time),
            "Day": sends["day"],
            "Time zone": sends["tz"],
            "Status": sends["status"],
            "Report status": sends["report_status"],
            "Recipients": sends["recipients"],
            "Subject": sends["subject"],
            "Attempts": sends["attempts"],
            "Resend": sends["resend"],
            "Message id": sends["message_id"],
            "Error": sends["error"],
        }))
