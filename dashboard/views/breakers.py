"""Breakers: why a replayed trace misses, ranked by lost tokens, with the what-if of each fix.

Reads ``prefixscope.store.queries.breakers`` (``diagnoses``, ``breakers_of``): the summaries
``prefixscope diagnose TRACE --ingest`` stores (kinds, positions, counts, lost tokens, value
digests; never prompt text). Lost tokens = cached tokens the whole trace gains when the
breaking span matches, by exact counterfactual replay (``docs/diagnose.md#lost-tokens``).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.core.formatting import breaker_position, fmt_int, fmt_pct, fmt_time, fmt_tokens
from prefixscope.dashboard import data, figures
from prefixscope.dashboard.downloads import show_table

EMPTY = ("No diagnosis stored. Run `prefixscope diagnose TRACE --ingest` (for example "
         "`prefixscope diagnose data/captures/aider/chat-requests.jsonl --ingest`): it replays "
         "the trace, finds where each request's prefix broke and stores the ranked breakers.")


db = data.db_path()
st.title("Breakers")
st.caption("Where the prefix broke, ranked by lost tokens: the cached tokens the trace gains "
           "when that span matches, measured by exact replay (docs/diagnose.md). Level 2 is "
           "what breaks once the level-1 spans match. Stored by `prefixscope diagnose TRACE "
           "--ingest`; structure and counts only, never prompt text.")

with data.guard(db):
    diags = data.query(db, "breakers", "diagnoses")
    if diags.empty:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    labels = {}
    for _, r in diags.iterrows():
        name = r["run_label"] if isinstance(r["run_label"], str) and r["run_label"] else r["run_id"]
        labels[r["diagnosis_id"]] = f"{name} · {r['model']} · {fmt_time(r['created_unix_s'])}"
    picked = st.selectbox("Diagnosis", list(labels), format_func=lambda k: labels[k],
                          key="breakers_diagnosis")
    d = diags[diags["diagnosis_id"] == picked].iloc[0]
    cols = st.columns(4)
    cols[0].metric("Hit rate as recorded", fmt_pct(d["hit_rate"]), border=True)
    cols[1].metric("With the suggested layout",
                   fmt_pct(d["what_if_hit_rate"]),
                   help="The suggested layout replayed through the exact model", border=True)
    missed = int(d["prompt_tokens"] - d["cached_tokens"])
    cols[2].metric("Missed prompt tokens", f"{missed:,}", border=True,
                   help=f"{fmt_tokens(missed)} of {int(d['prompt_tokens']):,} prompt tokens were "
                        "not served from the cache")
    cols[3].metric("Requests", f"{int(d['requests']):,}", border=True)
    if not pd.isna(d.get("what_if_cost_delta")) and isinstance(d.get("currency"), str):
        st.caption(f"Cost with cache after the suggested layout: "
                   f"{d['what_if_cost_delta']:+,.4f} {d['currency']} over the trace.")
    b = data.query(db, "breakers", "breakers_of", diagnosis_id=picked)
    if b.empty:
        st.success("No breakers: every request hit the longest prefix an earlier request had.",
                   icon=":material/check_circle:")
        st.stop()
    show_table("breakers-1", pd.DataFrame({
        "Rank": b["rank"], "Level": b["level"], "Kind": b["kind"].str.replace("_", " "),
        "Where": [breaker_position(r) for _, r in b.iterrows()],
        "Requests": b["requests"],
        "Distinct values": b["distinct_values"],
        "Lost tokens": [fmt_int(v) + ("" if m else " (at most)")
                        for v, m in zip(b["lost_tokens"], b["lost_tokens_measured"])],
        "Share of missed": b["share"].map(fmt_pct),
        "Fix": [t if f and isinstance(t, str) else "not by layout"
                for t, f in zip(b["transform_types"], b["fixable"])],
        "Hit rate if this span matched": b["what_if_hit_rate"].map(fmt_pct),
    }), key="breakers_table")
    st.plotly_chart(figures.breakers_lost_figure(b), key="breakers_lost")
    top = b.iloc[0]
    st.info(f"Top breaker: {str(top['kind']).replace('_', ' ')} at {breaker_position(top)}. `prefixscope diagnose TRACE` prints "
            "the fix and writes the suggested layout; `--request ID` shows one request's break "
            "on your terminal.", icon=":material/tips_and_updates:")
