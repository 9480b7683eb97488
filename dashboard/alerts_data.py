"""The Alerts page's one cached read that is not a single ``prefixscope.store.queries`` call: the daily
report.

Every other read of the page goes through :func:`prefixscope.dashboard.data.query` (e.g. the sends log,
``data.query(db, "alerts", "alert_sends", day=..., limit=...)``). :func:`daily_report` cannot:
``data.query`` calls one function of ``prefixscope.store.queries.<module>`` with the connection, while the
report is assembled by ``prefixscope.alerts.daily.build_daily_report`` from several queries with the
``[alerts]`` settings and the wall clock (the STALE cutoff of today). So it keeps its own
wrapper, built the same way: one read-only connection per call (:func:`prefixscope.store.db.reader` with
``prefixscope.dashboard.data.LOCK_TIMEOUT_S``; :class:`~prefixscope.core.errors.StoreLocked` propagates to
``prefixscope.dashboard.data.guard``), result cached with ``st.cache_data`` for ``[dashboard] cache_ttl_s``
(``prefixscope.dashboard.data.CACHE_TTL_S``).
"""

from __future__ import annotations

import time
from datetime import date

import streamlit as st

from prefixscope.dashboard import data
from prefixscope.store import db as store_db


def configured_timezone() -> tuple[str, str | None]:
    """(the zone the daily report's days are read in, a warning or None): ``[alerts]
    timezone`` when it is an IANA zone (``prefixscope.core.times.is_iana_zone``), else ``UTC``
    with a warning naming the key (a broken config file: ``UTC`` without one, the page's
    queries report the file)."""
    from prefixscope.core.bounds import escape_control
    from prefixscope.core.config import load_settings
    from prefixscope.core.times import is_iana_zone

    try:
        name = load_settings().alerts.timezone
    except Exception:  # a broken config file: the guard reports it on the page's queries
        return "UTC", None
    if is_iana_zone(name):
        return name, None
    shown = escape_control(name if len(name) <= 64 else name[:64] + "...")
    return "UTC", (f"[alerts] timezone: unknown time zone '{shown}' (use an IANA name such as "
                   "Europe/Berlin): days are read in UTC")


def page_timezone() -> str:
    """The zone a page reads days in: :func:`configured_timezone`, its warning (if any) drawn on
    the page."""
    tz, problem = configured_timezone()
    if problem:
        st.warning(problem)
    return tz


@st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False, max_entries=64)
def daily_report(db: str, *, day_iso: str, tz: str) -> dict:
    """``prefixscope.alerts.daily.build_daily_report(...).as_dict()`` of ``day_iso`` in ``tz`` with the
    ``[alerts]`` settings, "now" = the wall clock (for the STALE cutoff of today)."""
    from prefixscope.alerts.daily import build_daily_report
    from prefixscope.core.config import load_settings

    cfg = load_settings().alerts
    with store_db.reader(db, lock_timeout_s=data.LOCK_TIMEOUT_S) as con:
        return build_daily_report(con, day=date.fromisoformat(day_iso), tz=tz, cfg=cfg,
                                  now_unix_s=time.time()).as_dict()


@st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False, max_entries=16)
def daily_email_html(db: str, *, day_iso: str, tz: str) -> str:
    """The daily report of ``day_iso`` rendered as the email's HTML body
    (``prefixscope.alerts.render.render_html``), with its chart inline (a data URI instead of
    the email's ``cid:`` part), linking to the served dashboard
    (``prefixscope.core.config.dashboard_url``: ``[dashboard] public_url``, else this
    server's own address)."""
    import base64

    from prefixscope.alerts.daily import build_daily_report
    from prefixscope.alerts.render import render_chart_png, render_html
    from prefixscope.core.config import dashboard_url, load_settings

    settings = load_settings()
    with store_db.reader(db, lock_timeout_s=data.LOCK_TIMEOUT_S) as con:
        report = build_daily_report(con, day=date.fromisoformat(day_iso), tz=tz,
                                    cfg=settings.alerts, now_unix_s=time.time())
    png = render_chart_png(report)
    url = dashboard_url(settings)
    html = render_html(report, dashboard_url=url, chart_cid="chart" if png else None)
    if png:
        html = html.replace("cid:chart", "data:image/png;base64,"
                            + base64.b64encode(png).decode("ascii"))
    return html


@data._cached  # per TTL period of data.clock, which is also its "now" (tests move the clock)
def daily_statuses(db: str, *, first_day_iso: str, last_day_iso: str, tz: str,
                   models: tuple[str, ...] | None = None,
                   instances: tuple[str, ...] | None = None,
                   run_ids: tuple[str, ...] | None = ("",), stale: bool = False) -> list[dict]:
    """``prefixscope.alerts.daily.daily_statuses`` of the local days ``first_day_iso`` to
    ``last_day_iso`` in ``tz`` with the ``[alerts]`` settings, as dicts: ``day`` (ISO date),
    ``model``, ``source``, ``cached_tokens``, ``prompt_tokens``, ``hit_rate`` (fraction or
    None), ``threshold``, ``status`` (OK / ALERT / NO DATA; STALE too with ``stale``: the
    daily report's rule with "now" = ``prefixscope.dashboard.data.clock()``, the wall clock
    unless a test sets it). Cached per argument and TTL period of that clock."""
    from prefixscope.alerts.daily import daily_statuses as compute
    from prefixscope.core.config import load_settings

    cfg = load_settings().alerts
    with store_db.reader(db, lock_timeout_s=data.LOCK_TIMEOUT_S) as con:
        rows = compute(con, first_day=date.fromisoformat(first_day_iso),
                       last_day=date.fromisoformat(last_day_iso), tz=tz, cfg=cfg,
                       models=models, instances=instances, run_ids=run_ids,
                       now_unix_s=data.clock() if stale else None)
    return [{"day": s.day.isoformat(), "model": s.model, "source": s.figures.source,
             "cached_tokens": s.figures.cached_tokens, "prompt_tokens": s.figures.prompt_tokens,
             "hit_rate": s.figures.hit_rate, "threshold": s.threshold, "status": s.status}
            for s in rows]
