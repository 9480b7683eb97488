"""Breakers: why a replayed trace misses, ranked by lost tokens, with the what-if of each fix.

Reads ``prefixscope.store.queries.breakers`` (``diagnoses``, ``breakers_of``): the summaries
``prefixscope diagnose TRACE --ingest`` stores (kinds, positions, counts, lost tokens, value
digests; never prompt text). Lost tokens = cached tokens the whole trace gains when the
breaking span matches, by exact counterfactual replay (``docs/diagnose.md#lost-tokens``).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.core.formatting import breaker_position, fmt_int, fmt_pct, fmt_time, fmt_tokens, md_text
from prefixscope.dashboard import data, figures
from prefixscope.dashboard.downloads import show_table

EMPTY = ("No diagnosis stored. Run `prefixscope diagnose TRACE --ingest` (for example "
         "`prefixscope diagnose data/captures/aider/chat-requests.jsonl --ingest`): it replays "
         "the trace, finds where each request's prefix broke and stores the ranked breakers.")

#: The per-row what-if column: one breaker's span made to match, nothing else changed.
ALONE = "If only this fixed"
ALONE_HELP = ("Hit rate if this breaker alone were fixed: the trace replayed with only this "
              "span made to match (a volatile value replaced by one fixed placeholder, an "
              "edited line by its earlier text, tools sorted; an evicted row: an unbounded "
              "cache), on top of the fixes of the levels below, through the same exact cache "
              "model. Not the suggested layout, which applies every fixable breaker's own "
              "transform at once.")
#: The KPI of the suggested layout: short, so the label is not cut in a quarter of the page at
#: 1280-1400 px (the full wording opens its help).
SUGGESTED = "With all fixes"
SUGGESTED_HELP = ("If all fixable breakers were fixed: the suggested layout "
                  "(suggested-layout.yaml: one transform per fixable breaker, e.g. move_lines "
                  "of a volatile line to the end of the first user message) replayed through the exact cache model ({cache}). A move keeps the "
                  "value in the prompt, so what follows its new place can still miss; the "
                  "per-row figures replace the value by a placeholder instead.")


def cache_words(d: pd.Series) -> str:
    """``'block size 16, capacity 12,000 blocks'`` of a diagnosis row (unbounded: no
    capacity)."""
    cap = d.get("capacity_blocks")
    size = "" if pd.isna(d.get("block_size")) else f"block size {int(d['block_size'])}, "
    return size + ("unbounded capacity" if cap is None or pd.isna(cap)
                   else f"capacity {int(cap):,} blocks")


def what_if_caption(d: pd.Series, b: pd.DataFrame) -> str:
    """The caption under the KPIs: the page's hit rates are three different replays, said
    with their figures, so a reader sees why they differ (docs/diagnose.md "Three hit
    rates")."""
    text = (f"Every hit rate here is the trace replayed through the exact cache model "
            f"({cache_words(d)}): as recorded {fmt_pct(d['hit_rate'])}; ")
    if pd.isna(d.get("what_if_hit_rate")):
        text += "no breaker is fixable by layout, so there is no suggested layout; "
    else:
        text += (f"with the suggested layout, every fixable breaker fixed by its own transform, "
                 f"{fmt_pct(d['what_if_hit_rate'])}; ")
    alone = b[b["what_if_hit_rate"].notna()] if not b.empty else b
    if not alone.empty:
        top = alone.iloc[0]
        text += (f"\"{ALONE}\" is one breaker's span alone made to match, e.g. by a placeholder "
                 f"(#{int(top['rank'])}: {fmt_pct(top['what_if_hit_rate'])}), so it can be higher "
                 "than the suggested layout, which moves the value instead of dropping it. ")
    else:
        text += f"\"{ALONE}\" is one breaker's span alone made to match. "
    return text + ("The Replay page's runs replay a layout file you chose (for example "
                   "timestamp-at-end.yaml) with their own cache, shown in its Cache column.")


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
    b = data.query(db, "breakers", "breakers_of", diagnosis_id=picked)
    cache = cache_words(d)
    cols = st.columns(4)
    cols[0].metric("Hit rate as recorded", fmt_pct(d["hit_rate"]), border=True,
                   help=f"The trace replayed as recorded through the exact cache model ({cache}).")
    cols[1].metric(SUGGESTED, fmt_pct(d["what_if_hit_rate"]),
                   help=SUGGESTED_HELP.format(cache=cache), border=True)
    missed = int(d["prompt_tokens"] - d["cached_tokens"])
    cols[2].metric("Missed prompt tokens", f"{missed:,}", border=True,
                   help=f"{fmt_tokens(missed)} of {int(d['prompt_tokens']):,} prompt tokens were "
                        "not served from the cache")
    cols[3].metric("Requests", f"{int(d['requests']):,}", border=True)
    st.caption(what_if_caption(d, b))
    if not pd.isna(d.get("what_if_cost_delta")) and isinstance(d.get("currency"), str):
        st.caption(f"Cost with cache after the suggested layout: "
                   f"{d['what_if_cost_delta']:+,.4f} {md_text(d['currency'])} over the trace.")
    if b.empty:
        st.success("No breakers: every request hit the longest prefix an earlier request had.",
                   icon=":material/check_circle:")
        st.stop()
    show_table("breakers-1", pd.DataFrame({
        "Rank": b["rank"], "Level": b["level"], "Kind": b["kind"].str.replace("_", " "),
        "Where": [breaker_position(r) for _, r in b.iterrows()],
        "Requests": b["requests"],
        "Values": b["distinct_values"],
        "Lost tokens": [("" if m else "≤ ") + fmt_int(v)
                        for v, m in zip(b["lost_tokens"], b["lost_tokens_measured"])],
        "Of missed": b["share"].map(fmt_pct),
        "Fix": [t if f and isinstance(t, str) else "not by layout"
                for t, f in zip(b["transform_types"], b["fixable"])],
        ALONE: b["what_if_hit_rate"].map(fmt_pct),
    }), key="breakers_table", column_config={
        "Rank": st.column_config.Column(width=45),
        # one level: the column says nothing (still in the download)
        "Level": st.column_config.Column(width=45) if b["level"].nunique() > 1 else None,
        "Lost tokens": st.column_config.Column(
            help="Cached tokens the trace gains when this span matches, by exact replay; "
                 "≤: an upper bound, not measured (not fixable by layout)"),
        "Requests": st.column_config.Column(width=75),
        "Values": st.column_config.Column(width=60, help="Distinct values of the span"),
        "Of missed": st.column_config.Column(width=80,
                                             help="Share of missed: lost tokens ÷ the trace's "
                                                  "missed prompt tokens"),
        ALONE: st.column_config.Column(width=120, help=ALONE_HELP)})
    st.plotly_chart(figures.breakers_lost_figure(b), key="breakers_lost")
    top = b.iloc[0]
    st.info(f"Top breaker: {md_text(str(top['kind']).replace('_', ' '))} at "
            f"{md_text(breaker_position(top))}. `prefixscope diagnose TRACE` prints "
            "the fix and writes the suggested layout; `--request ID` shows one request's break "
            "on your terminal.", icon=":material/tips_and_updates:")
