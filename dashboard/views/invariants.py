"""Invariants: the three numbers that must read 0 — cross-scope acceptance, wrong-version
acceptance, old-generation use — red otherwise, with drill-down to the requests.

Reads ``prefixscope.store.queries.scopes.invariant_counts`` and ``invariant_violations``. Each count is
computed from the logged digests and the usage join, not from the gateway's own verdict
(definitions in ``docs/scopes.md#formulas``). The picked runs are read as on Scopes and
Rejections: the production gateway run is its own decided rows over its own span
(``decided_production``), with the same "Refused / errors" and "Shadow" lines
(``refused_by_reason``, ``unserved_accepts``).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data, filters
from prefixscope.core.formatting import count_noun, fmt_int
from prefixscope.dashboard.downloads import show_table, utc_column

TITLES = {
    "cross_scope_acceptance": "Cross-scope acceptance",
    "wrong_version_acceptance": "Wrong-version acceptance",
    "old_generation_use": "Old-generation use",
}
HELP = {
    "cross_scope_acceptance": "Accepted candidates whose scope or namespace digest differs from "
                              "the request's, plus rejected ones whose KV was used anyway.",
    "wrong_version_acceptance": "Accepted candidates whose content, model, tokenizer, runtime, "
                                "adapter, prompt-bundle or toolset digest or policy revision "
                                "differs, plus rejected ones whose KV was used anyway.",
    "old_generation_use": "Accepted candidates from another authorization or cache epoch, plus "
                          "rejected ones whose KV was used anyway.",
}
OK_COLOUR = "#2ca02c"
BAD_COLOUR = "#d62728"
EMPTY = filters.NO_DECISIONS


def big_number(value: int) -> str:
    """HTML of one large number: green when 0, red otherwise (pure)."""
    colour = OK_COLOUR if value == 0 else BAD_COLOUR
    return (f"<div style='font-size:4rem;font-weight:700;line-height:1.1;color:{colour}'>"
            f"{value:,}</div>")


def over_text(counts: dict) -> str:
    """The line under the three numbers from ``invariant_counts``: the answered requests with a
    decision (the Requests of Scopes and Rejections for the same run), the refused ones, which
    are checked too (a wrong acceptance counts whether or not the engine answered), and the
    accepts that could not be checked. Pure."""
    refused = int(counts.get("refused_requests", 0))
    text = f"Over {count_noun(int(counts['answered_requests']), 'request')} with a gateway decision"
    if refused:
        text += (f" and {fmt_int(refused)} refused {'request' if refused == 1 else 'requests'}"
                 " (checked too)")
    if counts["unverifiable_accepts"]:
        text += (f"; {fmt_int(counts['unverifiable_accepts'])} accepts were logged without a "
                 "candidate identity and could not be checked")
    return text + "."


db = data.db_path()
f = filters.current()
st.title("Invariants")
st.caption("Three numbers that must stay at 0; no hit rate excuses them. "
           "Each picked run is shown whole.")

with data.guard(db):
    picked = filters.pick_decision_runs(db, key="invariants_runs", empty=EMPTY)
    # the picked runs' own rows, as on Scopes and Rejections (production traffic = its
    # gateway run: the requests with a decision, over the span of the picker's label)
    common = dict(start_s=None, end_s=None, run_ids=picked)
    rows = dict(common, decided_production=True)
    counts = data.query(db, "scopes", "invariant_counts", **rows)
    if counts["decided_requests"] == 0:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    refused = filters.refused_text(data.query(db, "scopes", "refused_by_reason", **common))
    if refused:
        st.caption(refused)
    unserved = filters.unserved_text(data.query(db, "scopes", "unserved_accepts", **common))
    if unserved:
        st.caption(unserved)
    cols = st.columns(3)
    for col, (name, title) in zip(cols, TITLES.items()):
        with col:
            st.markdown(f"**{title}**", help=HELP[name])
            st.markdown(big_number(counts[name]), unsafe_allow_html=True)
            if counts[name] == 0:
                st.success("0: holds", icon=":material/check_circle:")
            else:
                n = int(counts[name])
                st.error(f"{count_noun(n, 'request')} {'violates' if n == 1 else 'violate'} it: see below",
                         icon=":material/error:")
    st.caption(over_text(counts))
    st.subheader("Drill-down")
    pick = st.selectbox("Invariant", list(TITLES), format_func=TITLES.get,
                        key="invariants_pick")
    found = data.query(db, "scopes", "invariant_violations", invariant=pick, **rows)
    if isinstance(found, pd.DataFrame) and not found.empty:
        shown = found.assign(time=utc_column(found["ts_unix_s"]))
        show_table("invariants-1", shown[["time", *[c for c in found.columns
                                                     if c != "ts_unix_s"]]],
                   key="invariants_rows")
    else:
        st.caption(f"No request violates {TITLES[pick].lower()}.")
