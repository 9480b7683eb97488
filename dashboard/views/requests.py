"""Requests: per-request hit rates from the usage each response reported.

Every number and figure is an aggregate computed in DuckDB (issue 17: no per-request rows in
pandas or in the browser): ``request_counts``, ``request_hit_rate_by_window`` (Σ cached ÷ Σ
prompt tokens of the reporting requests, per window), ``request_hit_rate_bands`` (quantiles of
per-request hit rate per window), ``request_latency_quantiles`` (per cached-share band: cold,
partial, warm, as the TTFT panel; one panel per model, and the band counts under the cards),
``cached_tokens_coverage`` and one page of ``newest_requests`` (LIMIT/OFFSET in the store),
through ``prefixscope.dashboard.data``. Requests whose usage did not report cached tokens are never counted as 0:
they lower the coverage instead (``docs/metrics.md``).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data, figures, filters
from prefixscope.core.formatting import (fmt_int, fmt_ms, fmt_pct, fmt_time, fmt_window, md_text,
                                         plotly_text)
from prefixscope.dashboard.downloads import show_table


def _count(x) -> int:
    """A stored count, null (pd.NA) as 0."""
    return 0 if pd.isna(x) else int(x)

PAGE_ROWS = 500
#: At most this many per-model latency panels (the sidebar's Model filter picks others).
MAX_LATENCY_PANELS = 4


def band_counts_text(quantiles: pd.DataFrame, column: str) -> str:
    """The warm / partial / cold request counts of ``request_latency_quantiles`` rows (the
    rollup's counts per cached-share band; the bands' parts from
    ``store.queries.serving.ttft_bands``, formatted here): ``By the share
    of the prompt from the cache: **warm** (≥ 80% cached) 16 · ... of the 31 requests with a
    latency``."""
    from prefixscope.core.formatting import fmt_share_band
    from prefixscope.store.queries.serving import ttft_bands

    bands = ttft_bands()
    n = {b.name: int(quantiles.loc[quantiles["band"] == b.name, "requests"].sum())
         if not quantiles.empty else 0 for b in bands}
    what = "a time to first token" if column == "ttft_ms" else "a latency"
    parts = " · ".join(f"**{b.name}** ({fmt_share_band(b.low, b.high, b.unit)}) "
                       f"{fmt_int(n[b.name])}" for b in reversed(bands))
    return (f"By the share of the prompt from the cache (the TTFT bands' rule): {parts}, of "
            f"the {fmt_int(sum(n.values()))} reporting requests with {what}.")
LATENCY_ERROR_PCT = f"{data.latency_quantile_error():.1%}"
EMPTY = ("No data in this range — ingest usage logs with `prefixscope ingest requests "
         "usage.jsonl`, or widen the time range.")
COVERAGE_HINT = ("start vLLM with `--enable-prompt-tokens-details` so that every response's usage "
                 "carries `prompt_tokens_details.cached_tokens`")

db = data.db_path()
f = filters.current()
st.title("Requests")
st.caption("Hit rate of each request = cached_tokens ÷ prompt_tokens from the usage it reported. "
           f"{f.describe()}.")

with data.guard(db):
    coverage = data.cached_tokens_coverage(db, start_s=f.start_s, end_s=f.end_s, models=f.models,
                                           instances=f.instances, run_ids=f.run_ids)
    if coverage.empty or int(coverage["requests"].fillna(0).sum()) == 0:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    counts = data.request_counts(db, start_s=f.start_s, end_s=f.end_s, models=f.models,
                                 instances=f.instances, run_ids=f.run_ids)
    window_label, window_s = filters.window_picker("requests_window", ("5m", "1h", "1d"), default="1h")
    windows = data.request_hit_rate_by_window(db, start_s=f.start_s, end_s=f.end_s,
                                              window_s=window_s, by=("model",), models=f.models,
                                              instances=f.instances, run_ids=f.run_ids)

    # Coverage first: without it the per-request numbers describe only part of the traffic.
    partial = coverage[coverage["coverage"].fillna(0.0) < 1.0]
    if not partial.empty:
        names = "; ".join(
            f"{md_text(m) if pd.isna(i) else f'{md_text(m)} / {md_text(i)}'}: cached tokens not reported by "
            f"{fmt_int(_count(n) - _count(r))} of {fmt_int(n)} requests ({fmt_pct(c)} reported)"
            for m, i, n, r, c in zip(partial["model"], partial["instance"], partial["requests"],
                                     partial["reported_requests"], partial["coverage"]))
        st.warning(f"Not every request reported cached tokens: {names}. The hit rates below cover "
                   f"only the requests that did; {COVERAGE_HINT}.", icon=":material/warning:")

    total_requests = int(coverage["requests"].fillna(0).sum())
    reported = int(coverage["reported_requests"].fillna(0).sum())
    c1, c2, c3 = st.columns(3)
    c1.metric("Requests", fmt_int(total_requests), border=True)
    c2.metric("Requests with cached-token counts", fmt_int(reported), border=True,
              help="Requests whose usage carried the field "
                   "`usage.prompt_tokens_details.cached_tokens` (a count of 0 included); the "
                   "others lower the coverage, never the hit rate.")
    c3.metric("Requests with any cached block", fmt_int(counts["hit_requests"]), border=True,
              help="Reporting requests with cached_tokens > 0: one cached block (16 tokens of "
                   "a 2,000-token prompt) counts. The warm / partial / cold counts under the "
                   "cards say how much of each prompt came from the cache.")
    column = ("ttft_ms" if counts["with_ttft"] else
              "latency_ms" if counts["with_latency"] else None)
    pooled = None
    if column is not None:
        pooled = data.request_latency_quantiles(db, column=column, start_s=f.start_s,
                                                end_s=f.end_s, models=f.models,
                                                instances=f.instances, run_ids=f.run_ids)
        st.markdown(band_counts_text(pooled, column))

    left, right = st.columns(2)
    with left:
        histogram = data.request_hit_rate_histogram(db, start_s=f.start_s, end_s=f.end_s, bins=20,
                                                    models=f.models, instances=f.instances,
                                                    run_ids=f.run_ids)
        st.plotly_chart(figures.request_hit_rate_histogram(histogram), key="requests_hist")
    with right:
        st.plotly_chart(figures.coverage_bars(coverage), key="requests_coverage")
    bands = data.request_hit_rate_bands(db, start_s=f.start_s, end_s=f.end_s, window_s=window_s,
                                        models=f.models, instances=f.instances,
                                        run_ids=f.run_ids)
    st.plotly_chart(figures.request_hit_rate_over_time(bands, windows, window_s=window_s,
                                                       threshold=data.alert_threshold()),
                    key="requests_over_time")

    if counts["with_ttft"]:
        st.plotly_chart(figures.ttft_by_band(data.query(
            db, "serving", "ttft_by_band_window", start_s=f.start_s, end_s=f.end_s,
            window_s=window_s, by=("model",), models=f.models, instances=f.instances,
            run_ids=f.run_ids), window_s=window_s), key="requests_ttft_bands")
        st.caption(data.ttft_bands_caption())

    if column is None:
        st.caption("No time to first token or latency recorded for these requests.")
    else:
        if column == "latency_ms":
            st.caption("No time to first token was recorded for these requests; total latency "
                       "shown instead (it includes decoding, which the cache does not shorten).")
        title = ("Time to first token by cached share" if column == "ttft_ms" else
                 "Total latency by cached share")
        models = sorted({m for m in coverage["model"] if isinstance(m, str)})
        if len(models) <= 1:
            st.plotly_chart(figures.latency_by_band(pooled, column=column, title=title),
                            key=f"requests_{column.removesuffix('_ms')}")
        else:
            # one panel per model: pooled, a big model's warm requests sit above a small
            # model's cold ones and the bands read inverted
            shown_models = models[:MAX_LATENCY_PANELS]
            st.caption(f"One panel per model ({len(models)} in this selection): pooled, their "
                       "latencies would mix (a larger model's warm requests can be slower than "
                       "a smaller one's cold requests)."
                       + (f" The first {MAX_LATENCY_PANELS} are shown; pick others in the "
                          "sidebar's Model filter." if len(models) > MAX_LATENCY_PANELS else ""))
            cols = st.columns(2)
            for i, model in enumerate(shown_models):
                q = data.request_latency_quantiles(db, column=column, start_s=f.start_s,
                                                   end_s=f.end_s, models=(model,),
                                                   instances=f.instances, run_ids=f.run_ids)
                cols[i % 2].plotly_chart(
                    figures.latency_by_band(q, column=column, title=f"{title} · {plotly_text(model)}"),
                    key=f"requests_{column.removesuffix('_ms')}_{i}")
        st.caption(f"{figures.BOX_RULE} "
                   "Bands by cached share, cached_tokens ÷ prompt_tokens, as in the TTFT "
                   "panel (requests without prompt tokens left out). "
                   "Quantiles from a histogram in log-spaced bins: each within "
                   f"{LATENCY_ERROR_PCT} of the exact value; count, min and max exact "
                   "(docs/metrics.md \"Latency quantiles\").")

    st.subheader("Per window")
    show_table("requests-1", pd.DataFrame({
        "Window start": windows["window_start_s"].map(fmt_time),
        "Model": windows["model"],
        "Requests": windows["requests"],
        "Reported": windows["reported_requests"],
        "Cached tokens": windows["cached_tokens"],
        "Reported prompt tokens": windows["reported_prompt_tokens"],
        "Hit rate": windows["hit_rate"].map(fmt_pct),
        "Coverage": windows["coverage"].map(fmt_pct),
    }), caption=f"One row per {fmt_window(window_s)} window and model; hit rate = Σ cached "
                "÷ Σ prompt tokens of the requests that reported cached tokens, coverage = "
                "the share of requests that did.", empty="No window in this range.")

    st.subheader("Requests")
    n = counts["reported_requests"]
    if n == 0:
        st.caption("No request in this range reported cached tokens.")
    else:
        pages = (n + PAGE_ROWS - 1) // PAGE_ROWS
        page = 1
        if pages > 1:
            page = int(st.number_input(f"Page (of {pages:,}, newest first)", min_value=1,
                                       max_value=pages, value=1, step=1, key="requests_page"))
        shown = data.newest_requests(db, start_s=f.start_s, end_s=f.end_s, limit=PAGE_ROWS,
                                     offset=(page - 1) * PAGE_ROWS, models=f.models,
                                     instances=f.instances, run_ids=f.run_ids)
        first = (page - 1) * PAGE_ROWS + 1
        one_run = shown["run_id"].nunique(dropna=False) <= 1
        show_table("requests-2", pd.DataFrame({
            "Time (UTC)": shown["ts_unix_s"].map(
                lambda t: fmt_time(t, seconds=True).removesuffix(" UTC")),
            "Model": shown["model"],
            "Instance": shown["instance"],
            "Endpoint": shown["endpoint"],
            "Prompt tokens": shown["prompt_tokens"],
            "Cached tokens": shown["cached_tokens"],
            "Hit rate": shown["hit_rate"].map(fmt_pct),
            "TTFT (ms)": shown["ttft_ms"].map(fmt_ms),
            "Latency (ms)": shown["latency_ms"].map(fmt_ms),
            "Run": shown["run_id"].map(filters.run_label),
            "Request id": shown["request_id"],
        }), caption=(f"Requests {first:,} to {first + len(shown) - 1:,} of {n:,}, newest first."
                     if pages > 1 else f"{n:,} requests, newest first.")
           + (f" All of run {filters.run_label(shown['run_id'].iloc[0])} (the Run column is in "
              "the download)." if one_run and len(shown) else ""),
           # one run: its column says nothing on screen (every key column fits at 1400 px)
           column_config={"Run": None} if one_run else None)
