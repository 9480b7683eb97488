"""Scopes: hit rate and saved prefill tokens by cache scope and by namespace digest, over time.

Reads ``prefixscope.store.queries.scopes.hit_rate_by_scope_window`` / ``hit_rate_by_scope_totals``
(gateway decisions joined to usage rows on ``(run_id, request_id)``). Hit rate = Σ cached_tokens
÷ Σ prompt_tokens of the requests that reported cached tokens; saved prefill tokens = Σ
cached_tokens (``docs/scopes.md#formulas``). Namespaces appear only as 16-hex HMAC digests.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from prefixscope.dashboard import data, filters
from prefixscope.core.formatting import fmt_int, fmt_pct, fmt_tokens, fmt_window
from prefixscope.dashboard.downloads import show_table

WINDOWS_S = {"5m": 300.0, "15m": 900.0, "1h": 3600.0, "1d": 86400.0}
SCOPE_ORDER = ["PUBLIC", "TENANT", "PRINCIPAL", "UNSCOPED"]
SCOPE_COLOURS = {"PUBLIC": "#2ca02c", "TENANT": "#1f77b4", "PRINCIPAL": "#9467bd",
                 "UNSCOPED": "#7f7f7f"}
EMPTY = ("No data in this range — replay a multi-tenant trace with `prefixscope replay gateway "
         "data/multitenant/trace.jsonl`, ingest gateway logs with `prefixscope ingest decisions "
         "FILE`, or widen the time range.")
TOP_NAMESPACES = 10


def load(db: str, query: str, **kwargs):
    """``prefixscope.dashboard.data.query`` on ``prefixscope.store.queries.scopes.<query>`` (cached)."""
    return data.query(db, "scopes", query, **kwargs)


def _utc(ts: pd.Series) -> pd.Series:
    return pd.to_datetime(ts, unit="s", utc=True).dt.tz_localize(None)


def rate_figure(df: pd.DataFrame, *, series: str, title: str, window_s: float,
                colours: dict[str, str] | None = None) -> go.Figure:
    """Hit rate per window, one line per value of ``series`` (pure: DataFrame in, figure out)."""
    fig = go.Figure()
    for name, g in df.sort_values("window_start_s").groupby(series, sort=True):
        fig.add_trace(go.Scatter(
            x=_utc(g["window_start_s"]), y=g["hit_rate"], mode="lines+markers", name=str(name),
            line=dict(color=(colours or {}).get(str(name))),
            customdata=g[["cached_tokens", "reported_prompt_tokens"]].to_numpy(),
            hovertemplate="%{y:.1%} (%{customdata[0]:,} of %{customdata[1]:,} tokens)"
                          "<extra>%{fullData.name}</extra>"))
    fig.update_layout(title=f"{title} per {fmt_window(window_s)}", yaxis=dict(
        title="hit rate", tickformat=".0%", range=[0, 1.02]), xaxis_title="window start (UTC)",
        margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.22))
    return fig


def saved_figure(df: pd.DataFrame, *, window_s: float) -> go.Figure:
    """Saved prefill tokens (= cached tokens) per window, stacked by scope (pure)."""
    fig = go.Figure()
    for scope in [s for s in SCOPE_ORDER if s in set(df["scope"])]:
        g = df[df["scope"] == scope].sort_values("window_start_s")
        fig.add_trace(go.Bar(x=_utc(g["window_start_s"]), y=g["saved_prefill_tokens"], name=scope,
                             marker_color=SCOPE_COLOURS[scope],
                             hovertemplate="%{y:,} tokens<extra>%{fullData.name}</extra>"))
    fig.update_layout(barmode="stack", title=f"Saved prefill tokens per {fmt_window(window_s)}",
                      yaxis_title="tokens", xaxis_title="window start (UTC)",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.22))
    return fig


db = data.db_path()
f = filters.current()
st.title("Scopes")
st.caption("Hit rate = Σ cached_tokens ÷ Σ prompt_tokens (requests that reported cached tokens); "
           f"saved prefill tokens = Σ cached_tokens; by cache scope and namespace digest. "
           f"{f.describe(every_run_by_default=True)}.")

with data.guard(db):
    common = dict(start_s=f.start_s, end_s=f.end_s, run_ids=f.replay_run_ids(), models=f.models,
                  instances=f.instances)
    totals = load(db, "hit_rate_by_scope_totals", by=("scope",), **common)
    scoped = totals[totals["scope"] != "UNSCOPED"] if not totals.empty else totals
    if scoped.empty:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    cols = st.columns(len(scoped))
    for col, (_, row) in zip(cols, scoped.iterrows()):
        col.metric(f"{row['scope']} hit rate", fmt_pct(row["hit_rate"]), border=True,
                   help=f"{fmt_int(row['cached_tokens'])} of {fmt_int(row['reported_prompt_tokens'])}"
                        f" prompt tokens; {fmt_int(row['requests'])} requests")
    cols = st.columns(len(scoped))
    for col, (_, row) in zip(cols, scoped.iterrows()):
        col.metric(f"{row['scope']} saved prefill tokens", fmt_tokens(row["saved_prefill_tokens"]),
                   border=True, help="Σ cached_tokens reported by the engine.")

    label = st.radio("Window", list(WINDOWS_S), index=1, horizontal=True, key="scopes_window")
    window_s = WINDOWS_S[label]
    by_scope = load(db, "hit_rate_by_scope_window", window_s=window_s, by=("scope",), **common)
    left, right = st.columns(2)
    with left:
        st.plotly_chart(rate_figure(by_scope, series="scope", title="Hit rate by scope",
                                    window_s=window_s, colours=SCOPE_COLOURS), key="scopes_rate")
    with right:
        st.plotly_chart(saved_figure(by_scope, window_s=window_s), key="scopes_saved")

    ns_totals = load(db, "hit_rate_by_scope_totals", by=("scope", "namespace_digest"), **common)
    ns_totals = ns_totals[ns_totals["namespace_digest"].notna()]
    top = ns_totals.head(TOP_NAMESPACES)
    by_ns = load(db, "hit_rate_by_scope_window", window_s=window_s,
                 by=("scope", "namespace_digest"), **common)
    by_ns = by_ns[by_ns["namespace_digest"].isin(set(top["namespace_digest"]))].copy()
    by_ns["namespace"] = by_ns["scope"] + " " + by_ns["namespace_digest"]
    st.plotly_chart(rate_figure(by_ns, series="namespace",
                                title=f"Hit rate by namespace digest (top {len(top)} by volume)",
                                window_s=window_s), key="scopes_ns_rate")
    st.subheader("By namespace digest")
    st.caption("A namespace digest is the first 16 hex characters of HMAC-SHA256 of the tenant "
               "(or principal) id under the server's key: never the id itself.")
    show_table("scopes-1", ns_totals[["scope", "namespace_digest", "requests", "prompt_tokens",
                            "cached_tokens", "hit_rate", "accepts", "rejects", "misses"]],
                 hide_index=True, key="scopes_ns_table",
                 column_config={"hit_rate": st.column_config.NumberColumn(format="percent")})
