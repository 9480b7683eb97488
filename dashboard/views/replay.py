"""Replay: simulated (and live) replay runs side by side — hit rate, tokens saved, cost.

Reads ``prefixscope.store.queries.replay.replay_runs`` and ``replay_run_windows``, and the price table
(``prefixscope.store.queries.savings.price_table``). Per run: hit rate = Σ cached_tokens ÷ Σ prompt_tokens;
tokens saved = Σ cached_tokens (prefill tokens the cache served); cost without and with the
cache at one price-table entry (a self-hosted model's shadow price by default, labelled as
such), ``docs/replay.md#outputs``. The sidebar's time, model and instance filters do not apply:
a run is compared whole. The page's own run picker lists every replay run, newest first (the
two newest are picked at first).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data, figures, filters
from prefixscope.core.formatting import fmt_money, fmt_pct, fmt_tokens, md_text
from prefixscope.dashboard.downloads import show_table

EACH_MODEL = "each run's own model"
#: Run kinds this page compares (captures and production are not replays).
REPLAY_KINDS = ("replay-sim", "replay-live")
#: What a run's hit rate is (the Hit rate column's help, docs/replay.md "Which hit rate").
HIT_RATE_HELP = ("Σ cached ÷ Σ prompt tokens of the run: its trace replayed through the exact "
                 "cache model with the run's own layout and cache (the Layout and Cache columns).")
HIT_RATE_CAPTION = ("Hit rate: each run's trace replayed through the exact cache model with the "
                    "run's own layout (a layout file, e.g. timestamp-at-end.yaml, or as "
                    "recorded) and cache (Cache: B = block size, capacity in blocks). The "
                    "Breakers page's what-ifs are other replays of the diagnosed trace: its "
                    "suggested layout (every fixable breaker fixed by its own transform) and one "
                    "breaker alone made to match, so they differ from a run here when the "
                    "layout or the capacity differs.")
EMPTY = ("No replay runs stored yet — run `prefixscope replay sim TRACE --ingest` (or "
         "`prefixscope replay compare TRACE --layout-b LAYOUT --ingest`), or `make demo`.")


def run_params(params_json: object) -> dict:
    """The replay parameters of a run (``runs.params_json``), {} when absent or unreadable."""
    if not isinstance(params_json, str) or not params_json:
        return {}
    try:
        value = json.loads(params_json)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def describe_cache(p: dict) -> str:
    """``'B=16, 2,000 blocks'`` from a run's parameters ('' when unknown)."""
    if "block_size" not in p:
        return ""
    cap = p.get("capacity_blocks")
    return f"B={p['block_size']}, " + ("unbounded" if cap is None else f"{int(cap):,} blocks")


def layout_of(p: dict) -> str:
    """The prompt layout of a run: its name, ``as recorded`` for a chat trace without one, and
    '' for traces without prompts (hash ids, token ids)."""
    if p.get("layout"):
        return str(p["layout"])
    fmt = (p.get("summary") or {}).get("format") or p.get("format")
    return "as recorded" if fmt == "chat" else ""


db = data.db_path()
f = filters.current()
st.title("Replay")
st.caption("Runs of `prefixscope replay sim` / `replay compare` (exact model of vLLM's prefix "
           "cache) and `replay live`, side by side. Hit rate = Σ cached ÷ Σ prompt tokens of the "
           "run; tokens saved = Σ cached tokens (prefill the cache served); cost without the "
           "cache prices every prompt token as input, cost with it prices cached tokens at the "
           "cached-input price (docs/replay.md#outputs).")

st.page_link(str(Path(__file__).resolve().parent / "breakers.py"),
             label="Why do these runs miss? Breakers (prefixscope diagnose)",
             icon=":material/troubleshoot:")

with data.guard(db):
    listed = data.query(db, "replay", "run_list", kinds=REPLAY_KINDS)
    if listed.empty:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    picked = filters.run_picker(listed, key="replay_runs", default_n=2,
                                label="Runs to compare")
    if not picked:
        st.info("Pick at least one run.", icon=":material/info:")
        st.stop()
    runs = data.query(db, "replay", "replay_runs", run_ids=picked)
    if runs.empty:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    prices = data.query(db, "savings", "price_table")
    choices = [EACH_MODEL, *prices["model"].tolist()]
    shadow = prices.loc[prices["shadow"].astype(bool), "model"].tolist() if not prices.empty else []
    own_priced = set(runs["model"].dropna()) <= set(prices["model"]) if not prices.empty else False
    price_as = st.selectbox("Price the runs as", choices,
                            index=0 if own_priced or not shadow else choices.index(shadow[0]),
                            help="A price-table entry applied to every run (e.g. a self-hosted "
                                 "model's shadow price), or each run's own model.")
    if price_as != EACH_MODEL:
        runs = data.query(db, "replay", "replay_runs", run_ids=picked, price_as=price_as)

    labels = {r: (lab if isinstance(lab, str) and lab else r)
              for r, lab in zip(runs["run_id"], runs["label"])}
    sel = runs[runs["run_id"].isin(picked)].copy()
    sel["label"] = [labels[r] for r in sel["run_id"]]
    params = [run_params(p) for p in sel["params_json"]]

    best = sel.loc[sel["hit_rate"].idxmax()] if sel["hit_rate"].notna().any() else None
    cols = st.columns(3)
    cols[0].metric("Runs shown", f"{len(sel):,}", border=True)
    cols[1].metric("Best hit rate", fmt_pct(best["hit_rate"]) if best is not None else "—",
                   help=None if best is None else
                   f"{md_text(labels[best['run_id']])}: {HIT_RATE_HELP}", border=True)
    cols[2].metric("Tokens saved (sum)", fmt_tokens(sel["cached_tokens"].sum()), border=True)

    priced = sel[sel["cost_without_cache"].notna()]
    if not priced.empty:
        kinds = {"shadow price" if bool(s) else "list price" for s in priced["shadow"]}
        srcs = sorted({str(s) for s in priced["price_source"] if isinstance(s, str)})
        st.info(f"Costs at the {' / '.join(sorted(kinds))}"
                + (f" of {md_text(price_as, code=True)}" if price_as != EACH_MODEL else "")
                + (": " + "; ".join(md_text(s) for s in srcs) if srcs else "") + ".",
                icon=":material/price_change:")

    show_table("replay-1", pd.DataFrame({
        "Run": sel["label"],
        "Hit rate": sel["hit_rate"].map(fmt_pct),
        "Layout": [layout_of(p) or "—" for p in params],
        "Cache": [describe_cache(p) or "—" for p in params],
        "Requests": sel["requests"],
        "Prompt tokens": sel["prompt_tokens"],
        "Tokens saved": sel["cached_tokens"],
        "Kind": sel["kind"],
        "Run id": sel["run_id"],
    }), caption=HIT_RATE_CAPTION, column_config={
        "Hit rate": st.column_config.Column(width=75, help=HIT_RATE_HELP),
        "Cache": st.column_config.Column(width=140, help="B = block size (tokens), capacity "
                                                         "in blocks of the replayed cache"),
        "Kind": None, "Run id": None,  # in the download, not on screen (the picker says both)
    })
    if not priced.empty:
        show_table("replay-cost", pd.DataFrame({
            "Run": priced["label"],
            "Without cache": [fmt_money(v, c) for v, c in
                              zip(priced["cost_without_cache"], priced["currency"])],
            "With cache": [fmt_money(v, c) for v, c in
                           zip(priced["cost_with_cache"], priced["currency"])],
            "Saved": [fmt_money(v, c) for v, c in zip(priced["saved"], priced["currency"])],
            "Price": ["shadow" if bool(v) else "list" for v in priced["shadow"]],
        }), caption="Cost of each run's prompt and output tokens without the cache (every "
                    "prompt token at the input price) and with it (cached tokens at the "
                    "cached-input price), at the price named above.")
    unpriced = sel[sel["cost_without_cache"].isna()]
    if not unpriced.empty:
        st.caption("No price for the model of: " + ", ".join(md_text(x) for x in unpriced["label"])
                   + " — pick a price-table entry above, or load one with "
                     "`prefixscope ingest prices data/prices.toml`.")

    left, right = st.columns(2)
    left.plotly_chart(figures.run_hit_rate_bars(sel), key="replay_hit_rate")
    if not priced.empty and priced["currency"].nunique() == 1:
        right.plotly_chart(figures.run_cost_bars(priced, str(priced["currency"].iloc[0])), key="replay_cost")

    window_s = 60.0 * st.select_slider("Window (minutes)", options=[1, 5, 15, 60, 1440], value=5)
    windows = data.query(db, "replay", "replay_run_windows", run_ids=tuple(picked), window_s=window_s)
    if not windows.empty:
        st.plotly_chart(figures.run_windows_figure(windows, labels, window_s), key="replay_windows")
