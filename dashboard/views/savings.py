"""Savings: what the prefix cache saved, per model, at list prices or labelled shadow prices.

Reads ``savings_by_model`` and ``savings_by_window`` through ``prefixscope.dashboard.data``. Cost without
the cache prices every prompt token as uncached input; cost with it prices cached tokens at the
cached-input price and cache writes at their premium (``docs/metrics.md#cost-and-savings``). Self-hosted
models carry a shadow price: it is labelled as such, with its source, wherever it appears.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data, figures, filters
from prefixscope.core.formatting import fmt_money, fmt_pct
from prefixscope.dashboard.downloads import show_table

EMPTY = ("No data in this range — ingest usage logs with `prefixscope ingest requests "
         "usage.jsonl` and a price table, or widen the time range.")


def price_label(shadow: object, source: object) -> str:
    """How a price is described, naming its kind and source: ``'shadow price: <source>'`` or
    ``'list price: <source>'`` (a source that already starts with its kind is not repeated)."""
    kind = "shadow price" if bool(shadow) else "list price"
    src = str(source).strip() if source is not None and source == source else ""
    if not src:
        return f"{kind}: source not given"
    if src.lower().startswith(kind):
        return src
    return f"{kind}: {src}"


db = data.db_path()
f = filters.current()
st.title("Savings")
st.caption("Saved = cost without the cache − cost with it. Cost without: every prompt token at the "
           "input price. Cost with: cached tokens at the cached-input price, cache writes at their "
           f"price, the rest at the input price; output tokens cost the same in both. {f.describe()}.")

with data.guard(db):
    by_model = data.savings_by_model(db, start_s=f.start_s, end_s=f.end_s, models=f.models,
                                     instances=f.instances, run_ids=f.run_ids)
    if by_model.empty:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    priced = by_model[by_model["cost_without_cache"].notna()]
    unpriced = by_model[by_model["cost_without_cache"].isna()]

    if not priced.empty and bool(priced["shadow"].fillna(False).any()):
        shadowed = priced[priced["shadow"].fillna(False).astype(bool)]
        st.info("Self-hosted models are costed at a **shadow price** — what the same tokens would "
                "cost elsewhere, not an invoice. " + " ".join(
                    f"`{m}`: {price_label(True, src)}." for m, src in
                    zip(shadowed["model"], shadowed["price_source"])),
                icon=":material/price_change:")

    totals = data.savings_totals(db, start_s=f.start_s, end_s=f.end_s, models=f.models,
                                 instances=f.instances, run_ids=f.run_ids)
    for _, row in totals.iterrows():  # one row per currency and price kind: never mixed
        cur = row["currency"]
        if not isinstance(cur, str) or not cur:
            continue  # the unpriced models: named below, never "(None, list)"
        kind = "shadow" if bool(row["shadow"]) else "list"
        cols = st.columns(4)
        cols[0].metric(f"Without cache ({cur}, {kind})", fmt_money(row["cost_without_cache"], cur),
                       border=True)
        cols[1].metric(f"With cache ({cur}, {kind})", fmt_money(row["cost_with_cache"], cur),
                       border=True)
        cols[2].metric(f"Saved ({cur}, {kind})", fmt_money(row["saved"], cur), border=True,
                       help=f"{fmt_pct(row['saved_fraction'])} of the cost without cache.")
        cols[3].metric(f"Models ({kind} price)", f"{int(row['models']):,}", border=True,
                       help=f"Price sources: {row['price_sources']}")

    st.plotly_chart(figures.savings_by_model_bars(by_model), key="savings_models")

    st.subheader("Per model")
    if not priced.empty:
        show_table("savings-1", pd.DataFrame({
            "Model": priced["model"],
            "Price": ["shadow" if bool(x) else "list" for x in priced["shadow"]],
            "Prompt tokens": priced["prompt_tokens"],
            "Cached tokens": priced["cached_tokens"],
            "Cache-write tokens": priced["cache_write_tokens"],
            "Completion tokens": priced["completion_tokens"],
            "Without cache": [fmt_money(v, c) for v, c in zip(priced["cost_without_cache"], priced["currency"])],
            "With cache": [fmt_money(v, c) for v, c in zip(priced["cost_with_cache"], priced["currency"])],
            "Saved": [fmt_money(v, c) for v, c in zip(priced["saved"], priced["currency"])],
            "Saved share": priced["saved_fraction"].map(fmt_pct),
        }), caption="Price sources — " + "; ".join(
            f"{m}: {price_label(sh, src)}" for m, sh, src in
            zip(priced["model"], priced["shadow"], priced["price_source"])))
        notes = priced[priced["note"].notna()] if "note" in priced.columns else priced.iloc[0:0]
        for m, note in zip(notes["model"], notes["note"]):
            st.caption(f"{m}: {note}")
    if not unpriced.empty:
        st.warning("No price for: " + ", ".join(f"`{m}`" for m in unpriced["model"].astype(str))
                   + ". Add them to the price table (`data/prices.toml`, see docs/metrics.md#cost-and-savings) "
                   "to see their cost; self-hosted models take a shadow price.",
                   icon=":material/money_off:")

    window_label, window_s = filters.window_picker("savings_window", ("1h", "1d"), default="1d")
    by_window = data.savings_by_window(db, start_s=f.start_s, end_s=f.end_s, window_s=window_s,
                                       models=f.models, instances=f.instances, run_ids=f.run_ids)
    st.plotly_chart(figures.savings_over_time(by_window, window_s=window_s), key="savings_time")
    misses = by_window[by_window["miss_cost"].notna()] if "miss_cost" in by_window else by_window
    if not misses.empty and misses["currency"].nunique() == 1:
        cur = str(misses["currency"].iloc[0])
        total_miss = float(misses["miss_cost"].sum())
        st.subheader("What the misses cost")
        st.caption(f"{fmt_money(total_miss, cur)} in this range: the prompt tokens the prefill "
                   "computed (not read from the cache) at input minus cached-input price. A "
                   "regression shows as a step up of its model's line (log axis: models of very different "
                   "sizes side by side; docs/metrics.md#cost-and-savings).")
        st.plotly_chart(figures.window_lines(
            misses, series={"miss_cost": ""}, window_s=window_s, by=("model",),
            title=f"Cost of the misses ({cur})", y_title=f"{cur} (log)", tickformat=",.2f",
            hover_format=",.4f", log_y=True), key="savings_misses")
