"""Scopes: hit rate and saved prefill tokens by cache scope and by namespace digest, over time.

Reads ``prefixscope.store.queries.scopes.hit_rate_by_scope_window`` / ``hit_rate_by_scope_totals``
(gateway decisions joined to usage rows on ``(run_id, request_id)``). Hit rate = Σ cached_tokens
÷ Σ prompt_tokens of the requests that reported cached tokens; saved prefill tokens = Σ
cached_tokens (``docs/scopes.md#formulas``). Namespaces appear only as 16-hex HMAC digests.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data, figures, filters
from prefixscope.core.formatting import fmt_int, fmt_pct, fmt_tokens, md_text
from prefixscope.dashboard.downloads import show_table

EMPTY = filters.NO_DECISIONS
TOP_NAMESPACES = 10


db = data.db_path()
f = filters.current()
st.title("Scopes")
st.caption("Hit rate = Σ cached_tokens ÷ Σ prompt_tokens (requests that reported cached tokens); "
           "saved prefill tokens = Σ cached_tokens; by cache scope and namespace digest. "
           "Each picked run is shown whole.")

with data.guard(db):
    picked = filters.pick_decision_runs(db, key="scopes_runs", empty=EMPTY)
    # the picked runs' own span and rows: production traffic (run '') is its gateway run, the
    # requests with a decision, not the usage rows of the rest of production traffic
    span = filters.run_span(data.query(db, "replay", "run_list", with_decisions=True), picked)
    common = dict(start_s=None, end_s=None, run_ids=picked, models=f.models,
                  instances=f.instances)
    rows = dict(common, decided_production=True)
    totals = data.query(db, "scopes", "hit_rate_by_scope_totals", by=("scope",), **rows)
    scoped = totals[totals["scope"] != "UNSCOPED"] if not totals.empty else totals
    if scoped.empty:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    refused = filters.refused_text(data.query(db, "scopes", "refused_by_reason", **common))
    if refused:
        st.caption(refused)
    unserved = filters.unserved_text(data.query(db, "scopes", "unserved_accepts", **common))
    if unserved:
        st.caption(unserved)
    note = data.uncounted_note(db, **dict(  # the picked runs over their span, as every figure
        common, **({"start_s": span[0], "end_s": span[1] + 1e-3} if span and "" in picked else {})))
    if note:
        st.info(f"Two figures for this traffic: {note}.", icon=":material/rule:")
    cols = st.columns(len(scoped))
    for col, (_, row) in zip(cols, scoped.iterrows()):
        col.metric(f"{md_text(row['scope'])} hit rate", fmt_pct(row["hit_rate"]), border=True,
                   help=f"{fmt_int(row['cached_tokens'])} of {fmt_int(row['reported_prompt_tokens'])}"
                        f" prompt tokens; {fmt_int(row['requests'])} requests")
    cols = st.columns(len(scoped))
    for col, (_, row) in zip(cols, scoped.iterrows()):
        col.metric(f"{md_text(row['scope'])} saved prefill tokens", fmt_tokens(row["saved_prefill_tokens"]),
                   border=True, help="Σ cached_tokens reported by the engine.")

    label, window_s = filters.window_picker("scopes_window", ("5m", "15m", "1h", "1d"), default="15m",
                                          span_s=span)
    by_scope = data.query(db, "scopes", "hit_rate_by_scope_window", window_s=window_s, by=("scope",), **rows)
    left, right = st.columns(2)
    with left:
        st.plotly_chart(figures.scope_rate_figure(by_scope, series="scope", title="Hit rate by scope",
                                    window_s=window_s, colours=figures.SCOPE_COLOURS, span_s=span),
                        key="scopes_rate")
    with right:
        st.plotly_chart(figures.scope_saved_figure(by_scope, window_s=window_s, span_s=span), key="scopes_saved")

    ns_totals = data.query(db, "scopes", "hit_rate_by_scope_totals", by=("scope", "namespace_digest"), **rows)
    ns_totals = ns_totals[ns_totals["namespace_digest"].notna()]
    top = ns_totals.head(TOP_NAMESPACES)
    by_ns = data.query(db, "scopes", "hit_rate_by_scope_window", window_s=window_s,
                 by=("scope", "namespace_digest"), **rows)
    by_ns = by_ns[by_ns["namespace_digest"].isin(set(top["namespace_digest"]))].copy()
    by_ns["namespace"] = by_ns["scope"] + " " + by_ns["namespace_digest"]
    st.plotly_chart(figures.scope_rate_figure(by_ns, series="namespace",
                                title=f"Hit rate by namespace digest (top {len(top)} by volume)",
                                window_s=window_s, span_s=span), key="scopes_ns_rate")
    st.subheader("By namespace digest")
    show_table("scopes-1", pd.DataFrame({
        "Scope": ns_totals["scope"],
        "Namespace digest": ns_totals["namespace_digest"],
        "Requests": ns_totals["requests"],
        "Prompt tokens": ns_totals["prompt_tokens"],
        "Cached tokens": ns_totals["cached_tokens"],
        "Hit rate": ns_totals["hit_rate"].map(fmt_pct),
        "Accepted": ns_totals["accepts"],
        "Rejected": ns_totals["rejects"],
        "No candidate": ns_totals["misses"],
    }), key="scopes_ns_table",
        caption="A namespace digest is the first 16 hex characters of HMAC-SHA256 of the tenant "
                "(or principal) id under the server's key: never the id itself.")
