"""Rejections: candidate hits the gateway refused, by reason over time; version-mismatch misses
beside ordinary misses; the namespaces with the most rejections; the version events.

Reads ``prefixscope.store.queries.scopes``: ``rejections_by_reason_window``, ``miss_breakdown_by_window``,
``top_rejected_namespaces``, ``gateway_events`` (``docs/scopes.md#formulas``).
"""

from __future__ import annotations

import streamlit as st

from prefixscope.dashboard import data, figures, filters
from prefixscope.core.formatting import fmt_int, fmt_pct
from prefixscope.dashboard.downloads import show_table, utc_column

EMPTY = filters.NO_DECISIONS
CLASS_HELP = {"cross_scope": "scope, namespace or salt", "version":
              "model, tokenizer, runtime, adapter, prompt bundle, toolset, policy revision",
              "generation": "authorization or cache epoch", "collision": "content digest"}


db = data.db_path()
f = filters.current()
st.title("Rejections")
st.caption("A rejection is a candidate hit whose identity did not match (any field): it is served "
           "as a miss. Each picked run is shown whole.")

with data.guard(db):
    picked = filters.pick_decision_runs(db, key="rejections_runs", empty=EMPTY)
    # the picked runs' own span and rows (production traffic = its gateway run, as on Scopes)
    span = filters.run_span(data.query(db, "replay", "run_list", with_decisions=True), picked)
    common = dict(start_s=None, end_s=None, run_ids=picked)
    rows = dict(common, decided_production=True)
    label, window_s = filters.window_picker("rejections_window", ("5m", "15m", "1h", "1d"),
                                            default="15m", span_s=span)
    misses = data.query(db, "scopes", "miss_breakdown_by_window", window_s=window_s, **rows)
    decided = (misses[["ordinary_miss_requests", "version_mismatch_requests",
                       "other_reject_requests", "accepts"]].to_numpy().sum()
               if not misses.empty else 0)
    if decided == 0:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    refused = filters.refused_text(data.query(db, "scopes", "refused_by_reason", **common))
    if refused:
        st.caption(refused)
    unserved = filters.unserved_text(data.query(db, "scopes", "unserved_accepts", **common))
    if unserved:
        st.caption(unserved)
    reasons = data.query(db, "scopes", "rejections_by_reason_window", window_s=window_s, **rows)
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Rejected requests", fmt_int(reasons["rejects"].sum() if not reasons.empty else 0),
              border=True)
    c2.metric("Version-mismatch misses", fmt_int(misses["version_mismatch_requests"].sum()),
              border=True, help=CLASS_HELP["version"])
    c3.metric("Ordinary misses", fmt_int(misses["ordinary_miss_requests"].sum()), border=True,
              help="Requests for which no candidate object existed (refused requests, which never "
              "reached the engine, are counted apart).")
    c4.metric("Candidate tokens refused",  # a plain count: "185,760 tokens" was cut at 1400 px
              fmt_int(reasons["lost_candidate_tokens"].sum() if not reasons.empty else 0),
              border=True, help="Prompt tokens: Σ candidate_cached_tokens of the rejected "
              "requests (an upper bound unless the gateway tokenizes: candidate_tokens_basis "
              "exact, docs/gateway.md).")
    st.plotly_chart(figures.rejection_reasons_figure(reasons, window_s=window_s, span_s=span), key="rejections_reasons")
    st.plotly_chart(figures.miss_breakdown_figure(misses, window_s=window_s, span_s=span), key="rejections_misses")
    st.subheader("Top namespaces by rejections")
    top = data.query(db, "scopes", "top_rejected_namespaces", limit=10, **rows)
    show_table("rejections-1", top[["namespace_digest", "scope", "requests", "rejects"]].assign(
        reject_fraction=top["reject_fraction"].map(fmt_pct), top_reason=top["top_reason"],
        lost_candidate_tokens=top["lost_candidate_tokens"]), key="rejections_top")
    events = data.query(db, "scopes", "gateway_events", **common)
    if not events.empty:
        st.subheader("Version events")
        shown = events.assign(time=utc_column(events["ts_unix_s"]))[
            ["time", "event", "namespace_digest", "new_value", "run_id"]]
        show_table("rejections-2", shown, key="rejections_events")
    st.caption("Reason classes: " + "; ".join(f"{k}: {v}" for k, v in CLASS_HELP.items()) + ".")
