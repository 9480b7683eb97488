"""Cached reads for the dashboard's Alerts page (``dashboard/pages/alerts.py``).

The same pattern as ``dashboard/data.py``: each function opens ONE read-only connection with
:func:`store.db.reader` for its call, runs the query, closes it, and the result (a plain dict or
DataFrame) is cached with ``st.cache_data`` for ``[dashboard] cache_ttl_s`` seconds. Lock
conflicts propagate as :class:`~prefixscope.errors.StoreLocked` for ``dashboard.data.guard``.
"""

from __future__ import annotations

import time
from datetime import date

import pandas as pd
import streamlit as st

from dashboard import data
from store import db as store_db


@st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False, max_entries=64)
def daily_report(db: str, *, day_iso: str, tz: str) -> dict:
    """``alerts.daily.build_daily_report(...).as_dict()`` of ``day_iso`` in ``tz`` with the
    ``[alerts]`` settings, "now" = the wall clock (for the STALE cutoff of today)."""
    from alerts.daily import build_daily_report
    from prefixscope.config import load_settings

    cfg = load_settings().alerts
    with store_db.reader(db, lock_timeout_s=data.LOCK_TIMEOUT_S) as con:
        return build_daily_report(con, day=date.fromisoformat(day_iso), tz=tz, cfg=cfg,
                                  now_unix_s=time.time()).as_dict()


@st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False, max_entries=64)
def alert_sends(db: str, *, day_iso: str | None = None, limit: int = 500) -> pd.DataFrame:
    """``store.queries.alerts.alert_sends`` (the sends log, newest first)."""
    from store.queries import alerts as q

    with store_db.reader(db, lock_timeout_s=data.LOCK_TIMEOUT_S) as con:
        return q.alert_sends(con, day=day_iso, limit=limit)
