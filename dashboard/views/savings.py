"""Savings: what the prefix cache saved, per model, at list prices or labelled shadow prices.

Reads ``savings_by_model`` and ``savings_by_window`` through ``prefixscope.dashboard.data``. Cost without
the cache prices every prompt token as uncached input; cost with it prices cached tokens at the
cached-input price and cache writes at their premium (``docs/metrics.md#cost-and-savings``). Self-hosted
models carry a shadow price: it is labelled as such, with its source, wherever it appears.
"""

from __future__ import annotations

from datetime import date

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data, figures, filters
from prefixscope.core.formatting import (fmt_int, fmt_money, fmt_pct, md_text, plotly_text,
                                         price_label)
from prefixscope.dashboard.downloads import show_table

EMPTY = ("No data in this range — ingest usage logs with `prefixscope ingest requests "
         "usage.jsonl` and a price table, or widen the time range.")


#: The baseline of a regression: the model's hit rate over at most this many days before it.
BASELINE_DAYS = 7



def regression_costs(db: str, f) -> None:
    """Per model whose latest days read ALERT (the daily report's rule, day by day): what the
    regression cost since its first ALERT day, against the model's hit rate over the
    :data:`BASELINE_DAYS` days before it (``prefixscope.alerts.daily.regression_cost``)."""
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    from prefixscope.alerts.daily import DayStatus, DayWindow, Figures, alert_since, regression_cost
    from prefixscope.dashboard import alerts_data

    tz = alerts_data.page_timezone()
    try:
        zone = ZoneInfo(tz)
    except Exception:
        tz, zone = "UTC", ZoneInfo("UTC")
    totals = data.request_hit_rate_totals(db, start_s=f.start_s, end_s=f.end_s, by=("model",),
                                          models=f.models, instances=f.instances,
                                          run_ids=f.run_ids)
    if totals.empty:
        return
    lo = f.start_s if f.start_s is not None else totals["first_ts_unix_s"].min()
    hi = (f.end_s - 1e-3) if f.end_s is not None else totals["last_ts_unix_s"].max()
    if lo != lo or hi != hi:
        return
    first = datetime.fromtimestamp(lo, tz=zone).date()
    last = datetime.fromtimestamp(hi, tz=zone).date()
    rows = alerts_data.daily_statuses(db, first_day_iso=first.isoformat(),
                                      last_day_iso=last.isoformat(), tz=tz, models=f.models,
                                      instances=f.instances, run_ids=f.run_ids)
    statuses = [DayStatus(day=date.fromisoformat(r["day"]), model=r["model"],
                          figures=Figures(r["source"], r["prompt_tokens"], r["cached_tokens"],
                                          r["hit_rate"]),
                          threshold=r["threshold"], status=r["status"]) for r in rows]
    since = alert_since(statuses)
    if not since:
        return
    st.subheader("What the regression cost")
    out = []
    for model, begun in sorted(since.items()):
        d0 = DayWindow.of(begun.day, tz).start_s
        b0 = DayWindow.of(begun.day - timedelta(days=BASELINE_DAYS), tz).start_s
        base = data.request_hit_rate_totals(db, start_s=b0, end_s=d0, by=("model",),
                                            models=(model,), instances=f.instances,
                                            run_ids=f.run_ids)
        # since: the coverage rule of every hit rate (request_hit_rate_totals: a request whose
        # cached_tokens is null is in neither sum); the price: savings_by_model's miss_cost
        since = data.request_hit_rate_totals(db, start_s=d0, end_s=f.end_s, by=("model",),
                                             models=(model,), instances=f.instances,
                                             run_ids=f.run_ids)
        after = data.savings_by_model(db, start_s=d0, end_s=f.end_s, models=(model,),
                                      instances=f.instances, run_ids=f.run_ids)
        if base.empty or since.empty or after.empty or base["hit_rate"].isna().all():
            continue
        b, s, a = base.iloc[0], since.iloc[0], after.iloc[0]
        if pd.isna(s["cached_tokens"]) or pd.isna(s["reported_prompt_tokens"]):
            continue  # cached tokens not reported since: no cost to state (never counted as 0)
        rc = regression_cost(baseline_hit_rate=float(b["hit_rate"]),
                             prompt_tokens=int(s["reported_prompt_tokens"]),
                             cached_tokens=int(s["cached_tokens"]),
                             miss_cost=a["miss_cost"] if "miss_cost" in a else None,
                             missed_tokens=int(a["prompt_tokens"]) - int(a["cached_tokens"]))
        if rc is None:
            continue
        cur = a["currency"] if isinstance(a["currency"], str) else None
        out.append((model, begun.day, rc, cur, a, s))
    for model, day, rc, cur, a, s in out:
        cols = st.columns(3)
        cols[0].metric(f"{md_text(model)}: cost since {day.isoformat()}",
                       fmt_money(rc.cost, cur) if rc.cost is not None and cur else "no price",
                       border=True,
                       help=f"The extra tokens at the price of a missed token "
                            f"({md_text(price_label(a['shadow'], a['price_source']))}).")
        cols[1].metric("Tokens recomputed beyond the baseline", f"{rc.extra_tokens:,}",
                       border=True, help="max(0, baseline hit rate × prompt tokens since − "
                                         "cached tokens since).")
        cols[2].metric("Hit rate: before → since", f"{fmt_pct(rc.baseline_hit_rate)} → "
                       f"{fmt_pct(rc.hit_rate)}", border=True,
                       help=f"Before: the {BASELINE_DAYS} days before {day.isoformat()}; since: "
                            f"{day.isoformat()} to the end of the range (usage log).")
        st.caption(f"{md_text(model)}: {fmt_int(s['reported_requests'])} of "
                   f"{fmt_int(s['requests'])} requests since {day.isoformat()} reported cached "
                   f"tokens ({fmt_pct(s['coverage'])}); the hit rate and the tokens count only "
                   "those (a request that did not report is in neither sum, never counted as 0).")
    if out:
        st.caption("Since the first ALERT day of each model whose latest days read ALERT (the "
                   "daily report's rule, day by day): the prompt tokens the prefill recomputed "
                   "beyond what the model's hit rate before the regression would have served "
                   "from cache, at the price of a missed token (input minus cached-input price "
                   "of the configured price table). Formula: "
                   "docs/metrics.md#what-a-regression-cost.")


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
                    f"{md_text(m, code=True)}: {md_text(price_label(True, src))}." for m, src in
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
        cols[0].metric(f"Without cache ({md_text(cur)}, {kind})", fmt_money(row["cost_without_cache"], cur),
                       border=True)
        cols[1].metric(f"With cache ({md_text(cur)}, {kind})", fmt_money(row["cost_with_cache"], cur),
                       border=True)
        cols[2].metric(f"Saved ({md_text(cur)}, {kind})", fmt_money(row["saved"], cur), border=True,
                       help=f"{fmt_pct(row['saved_fraction'])} of the cost without cache.")
        cols[3].metric(f"Models ({kind} price)", f"{int(row['models']):,}", border=True,
                       help=f"Price sources: {md_text(row['price_sources'])}")

    regression_costs(db, f)
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
        }), caption="Tokens from the usage log (each request's prompt and cached tokens; the "
                    "Overview's come from vLLM's counters, which count a request at the first "
                    "scrape after it, so they can differ by the traffic after the range's last "
                    "scrape: docs/metrics.md#two-sources-of-token-counts). Price sources — "
                    + "; ".join(
            f"{md_text(m)}: {md_text(price_label(sh, src))}" for m, sh, src in
            zip(priced["model"], priced["shadow"], priced["price_source"])))
        notes = priced[priced["note"].notna()] if "note" in priced.columns else priced.iloc[0:0]
        for m, note in zip(notes["model"], notes["note"]):
            st.caption(f"{md_text(m)}: {md_text(note)}")
    if not unpriced.empty:
        st.warning("No price for: " + ", ".join(md_text(m, code=True)
                                                for m in unpriced["model"].astype(str))
                   + ". Add them to the price table (`data/prices.toml`, see docs/metrics.md#cost-and-savings) "
                   "to see their cost; self-hosted models take a shadow price.",
                   icon=":material/money_off:")

    window_label, window_s = filters.window_picker("savings_window", ("1h", "1d"), default="1d")
    by_window = data.savings_by_window(db, start_s=f.start_s, end_s=f.end_s, window_s=window_s,
                                       models=f.models, instances=f.instances, run_ids=f.run_ids)
    st.plotly_chart(figures.savings_over_time(by_window, window_s=window_s), key="savings_time")
    partial = filters.partial_windows_note(f.start_s, f.end_s, window_s, now_s=data.clock())
    if partial and not by_window.empty:
        st.caption(partial)
    misses = by_window[by_window["miss_cost"].notna()] if "miss_cost" in by_window else by_window
    if not misses.empty and misses["currency"].nunique() == 1:
        cur = str(misses["currency"].iloc[0])
        total_miss = float(misses["miss_cost"].sum())
        st.subheader("What the misses cost")
        st.caption(f"{md_text(fmt_money(total_miss, cur))} in this range: the prompt tokens the prefill "
                   "computed (not read from the cache) at input minus cached-input price. A "
                   "regression shows as a step up of its model's line; one chart per model, "
                   "each on its own linear axis (docs/metrics.md#cost-and-savings).")
        models = sorted(misses["model"].dropna().astype(str).unique())
        cols = st.columns(min(len(models), 3) or 1)
        for k, model in enumerate(models):
            cols[k % len(cols)].plotly_chart(figures.window_lines(
                misses[misses["model"] == model], series={"miss_cost": ""}, window_s=window_s,
                by=("model",), title=f"{plotly_text(model)}: cost of the misses "
                f"({plotly_text(cur)})", y_title=plotly_text(cur),
                tickformat=",.2f", hover_format=",.4f"), key=f"savings_misses_{k}")
