"""Rejections: candidate hits the gateway refused, by reason over time; version-mismatch misses
beside ordinary misses; the namespaces with the most rejections; the version events.

Reads ``prefixscope.store.queries.scopes``: ``rejections_by_reason_window``, ``miss_breakdown_by_window``,
``top_rejected_namespaces``, ``gateway_events`` (``docs/scopes.md#formulas``).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from prefixscope.dashboard import data, filters
from prefixscope.core.formatting import fmt_int, fmt_tokens, fmt_window
from prefixscope.dashboard.downloads import show_table

WINDOWS_S = {"5m": 300.0, "15m": 900.0, "1h": 3600.0, "1d": 86400.0}
EMPTY = ("No data in this range — no gateway decisions stored. Replay a multi-tenant trace with "
         "`prefixscope replay gateway data/multitenant/trace.jsonl` or ingest gateway logs with "
         "`prefixscope ingest decisions FILE`.")
CLASS_HELP = {"cross_scope": "scope, namespace or salt", "version":
              "model, tokenizer, runtime, adapter, prompt bundle, toolset, policy revision",
              "generation": "authorization or cache epoch", "collision": "content digest"}


def load(db: str, query: str, **kwargs):
    """``prefixscope.dashboard.data.query`` on ``prefixscope.store.queries.scopes.<query>`` (cached)."""
    return data.query(db, "scopes", query, **kwargs)


def _utc(ts: pd.Series) -> pd.Series:
    return pd.to_datetime(ts, unit="s", utc=True).dt.tz_localize(None)


def reasons_figure(df: pd.DataFrame, *, window_s: float) -> go.Figure:
    """Rejected requests per window, stacked by first mismatching field (pure)."""
    fig = go.Figure()
    for reason, g in df.sort_values("window_start_s").groupby("reason", sort=True):
        fig.add_trace(go.Bar(x=_utc(g["window_start_s"]), y=g["rejects"], name=str(reason),
                             customdata=g[["lost_candidate_tokens"]].to_numpy(),
                             hovertemplate="%{y} rejects, %{customdata[0]:,} candidate tokens"
                                           "<extra>%{fullData.name}</extra>"))
    fig.update_layout(barmode="stack", title=f"Rejections by reason per {fmt_window(window_s)}",
                      yaxis_title="requests", xaxis_title="window start (UTC)",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.22))
    return fig


def misses_figure(df: pd.DataFrame, *, window_s: float) -> go.Figure:
    """Ordinary misses, version-mismatch misses and other rejections per window (pure)."""
    fig = go.Figure()
    x = _utc(df["window_start_s"])
    for col, name, colour in (("ordinary_miss_requests", "ordinary miss (no candidate)", "#9ecae1"),
                              ("version_mismatch_requests", "version-mismatch miss", "#ff7f0e"),
                              ("other_reject_requests", "other rejection", "#d62728")):
        fig.add_trace(go.Bar(x=x, y=df[col], name=name, marker_color=colour))
    fig.update_layout(barmode="group",
                      title=f"Version-mismatch misses beside ordinary misses per {fmt_window(window_s)}",
                      yaxis_title="requests", xaxis_title="window start (UTC)",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.22))
    return fig


db = data.db_path()
f = filters.current()
st.title("Rejections")
st.caption("A rejection is a candidate hit whose identity did not match (any field): it is served "
           f"as a miss. {f.describe(every_run_by_default=True)}.")

with data.guard(db):
    common = dict(start_s=f.start_s, end_s=f.end_s, run_ids=f.replay_run_ids())
    label = st.radio("Window", list(WINDOWS_S), index=1, horizontal=True, key="rejections_window")
    window_s = WINDOWS_S[label]
    misses = load(db, "miss_breakdown_by_window", window_s=window_s, **common)
    decided = (misses[["ordinary_miss_requests", "version_mismatch_requests",
                       "other_reject_requests", "accepts"]].to_numpy().sum()
               if not misses.empty else 0)
    if decided == 0:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    reasons = load(db, "rejections_by_reason_window", window_s=window_s, **common)
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Rejected requests", fmt_int(reasons["rejects"].sum() if not reasons.empty else 0),
              border=True)
    c2.metric("Version-mismatch misses", fmt_int(misses["version_mismatch_requests"].sum()),
              border=True, help=CLASS_HELP["version"])
    c3.metric("Ordinary misses", fmt_int(misses["ordinary_miss_requests"].sum()), border=True,
              help="Requests for which no candidate object existed.")
    c4.metric("Candidate tokens refused",
              fmt_tokens(reasons["lost_candidate_tokens"].sum() if not reasons.empty else 0),
              border=True, help="Σ candidate_cached_tokens of the rejected requests.")
    st.plotly_chart(reasons_figure(reasons, window_s=window_s), key="rejections_reasons")
    st.plotly_chart(misses_figure(misses, window_s=window_s), key="rejections_misses")
    st.subheader("Top namespaces by rejections")
    top = load(db, "top_rejected_namespaces", limit=10, **common)
    show_table("rejections-1", top, hide_index=True, key="rejections_top",
                 column_config={"reject_fraction": st.column_config.NumberColumn(format="percent")})
    events = load(db, "gateway_events", **common)
    if not events.empty:
        st.subheader("Version events")
        shown = events.assign(time=_utc(events["ts_unix_s"]))[
            ["time", "event", "namespace_digest", "new_value", "run_id"]]
        show_table("rejections-2", shown, hide_index=True, key="rejections_events")
    st.caption("Reason classes: " + "; ".join(f"{k}: {v}" for k, v in CLASS_HELP.items()) + ".")
