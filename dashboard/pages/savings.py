"""Savings: what the prefix cache saved, per model, at list prices or labelled shadow prices.

Reads ``savings_by_model`` and ``savings_by_window`` through ``dashboard.data``. Cost without
the cache prices every prompt token as uncached input; cost with it prices cached tokens at the
cached-input price and cache writes at their premium (``docs/metrics.md#cost``). Self-hosted
models carry a shadow price: it is labelled as such, with its source, wherever it appears.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data, figures, filters
from dashboard.formatting import fmt_money, fmt_pct, fmt_tokens

WINDOWS_S = {"1h": 3600.0, "1d": 86400.0}
EMPTY = ("No data in this range — ingest usage logs with `prefixscope ingest requests "
         "usage.jsonl` and a price table, or widen the time range.")


def price_label(shadow: object, source: object) -> str:
    """How a price is described: ``'shadow price (source: ...)'`` or ``'list price (source: ...)'``."""
    kind = "shadow price" if bool(shadow) else "list price"
    src = str(source) if source is not None and source == source and str(source) else "unknown"
    return f"{kind} (source: {src})"


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
        sources = sorted({price_label(True, s) for s in
                          priced.loc[priced["shadow"].fillna(False).astype(bool), "price_source"]})
        st.info("Self-hosted models are costed at a **shadow price** — what the same tokens would "
                "cost elsewhere, not an invoice: " + "; ".join(sources) + ".",
                icon=":material/price_change:")

    for currency, g in priced.groupby("currency", dropna=False, sort=True):
        cols = st.columns(4)
        cols[0].metric(f"Without cache ({currency})", fmt_money(g["cost_without_cache"].sum(), currency),
                       border=True)
        cols[1].metric(f"With cache ({currency})", fmt_money(g["cost_with_cache"].sum(), currency),
                       border=True)
        cols[2].metric(f"Saved ({currency})", fmt_money(g["saved"].sum(), currency), border=True)
        cols[3].metric("Models priced", f"{len(g):,}", border=True,
                       help="Models with a price in this currency (list or shadow).")

    st.plotly_chart(figures.savings_by_model_bars(by_model), key="savings_models")

    st.subheader("Per model")
    if not priced.empty:
        st.dataframe(pd.DataFrame({
            "model": priced["model"],
            "price": [price_label(s, src) for s, src in zip(priced["shadow"], priced["price_source"])],
            "prompt tokens": priced["prompt_tokens"].map(fmt_tokens),
            "cached tokens": priced["cached_tokens"].map(fmt_tokens),
            "cache-write tokens": priced["cache_write_tokens"].map(fmt_tokens),
            "completion tokens": priced["completion_tokens"].map(fmt_tokens),
            "without cache": [fmt_money(v, c) for v, c in zip(priced["cost_without_cache"], priced["currency"])],
            "with cache": [fmt_money(v, c) for v, c in zip(priced["cost_with_cache"], priced["currency"])],
            "saved": [fmt_money(v, c) for v, c in zip(priced["saved"], priced["currency"])],
            "saved share": priced["saved_fraction"].map(fmt_pct),
        }), hide_index=True)
    if not unpriced.empty:
        st.warning("No price for: " + ", ".join(f"`{m}`" for m in unpriced["model"].astype(str))
                   + ". Add them to the price table (`data/prices.toml`, see docs/metrics.md#cost) "
                   "to see their cost; self-hosted models take a shadow price.",
                   icon=":material/money_off:")

    window_label = st.radio("Window", list(WINDOWS_S), index=1, horizontal=True, key="savings_window")
    window_s = WINDOWS_S[window_label]
    by_window = data.savings_by_window(db, start_s=f.start_s, end_s=f.end_s, window_s=window_s,
                                       models=f.models, instances=f.instances, run_ids=f.run_ids)
    st.plotly_chart(figures.savings_over_time(by_window, window_s=window_s), key="savings_time")
