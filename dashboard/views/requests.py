"""Requests: per-request hit rates from the usage each response reported.

Reads ``request_hit_rates`` (one row per request that reported
``usage.prompt_tokens_details.cached_tokens``), ``request_hit_rate_by_window`` (Σ cached ÷ Σ
prompt tokens of the reporting requests, per window) and ``cached_tokens_coverage`` through
``prefixscope.dashboard.data``. Requests whose usage did not report cached tokens are never counted as 0:
they lower the coverage instead (``docs/metrics.md``).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data, figures, filters
from prefixscope.core.formatting import fmt_int, fmt_ms, fmt_pct, fmt_time, fmt_tokens

WINDOWS_S = {"5m": 300.0, "1h": 3600.0, "1d": 86400.0}
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
    requests = data.request_hit_rates(db, start_s=f.start_s, end_s=f.end_s, models=f.models,
                                      instances=f.instances, run_ids=f.run_ids)
    window_label = st.radio("Window", list(WINDOWS_S), index=1, horizontal=True,
                            key="requests_window")
    window_s = WINDOWS_S[window_label]
    windows = data.request_hit_rate_by_window(db, start_s=f.start_s, end_s=f.end_s,
                                              window_s=window_s, by=("model",), models=f.models,
                                              instances=f.instances, run_ids=f.run_ids)

    # Coverage first: without it the per-request numbers describe only part of the traffic.
    partial = coverage[coverage["coverage"].fillna(0.0) < 1.0]
    if not partial.empty:
        names = ", ".join(f"{m} / {i} ({fmt_pct(c)})" for m, i, c in
                          zip(partial["model"], partial["instance"], partial["coverage"]))
        st.warning(f"Not every request reported cached tokens: {names}. The hit rates below cover "
                   f"only the requests that did; {COVERAGE_HINT}.", icon=":material/warning:")

    total_requests = int(coverage["requests"].fillna(0).sum())
    reported = int(coverage["reported_requests"].fillna(0).sum())
    c1, c2, c3 = st.columns(3)
    c1.metric("Requests", fmt_int(total_requests), border=True)
    c2.metric("Reported cached_tokens", fmt_int(reported), border=True,
              help="Requests whose usage carried prompt_tokens_details.cached_tokens (0 included).")
    hits = int((requests["cached_tokens"].fillna(0) > 0).sum()) if not requests.empty else 0
    c3.metric("Requests with a hit", fmt_int(hits), border=True,
              help="Reporting requests with cached_tokens > 0.")

    left, right = st.columns(2)
    with left:
        histogram = data.request_hit_rate_histogram(db, start_s=f.start_s, end_s=f.end_s, bins=20,
                                                    models=f.models, instances=f.instances,
                                                    run_ids=f.run_ids)
        st.plotly_chart(figures.request_hit_rate_histogram(histogram), key="requests_hist")
    with right:
        st.plotly_chart(figures.coverage_bars(coverage), key="requests_coverage")
    st.plotly_chart(figures.request_hit_rate_over_time(requests, windows, window_s=window_s,
                                                       threshold=data.alert_threshold()),
                    key="requests_over_time")

    if not requests.empty and requests["ttft_ms"].notna().any():
        st.plotly_chart(figures.latency_by_hit(requests, column="ttft_ms"), key="requests_ttft")
    elif not requests.empty and requests["latency_ms"].notna().any():
        st.caption("No time to first token was recorded for these requests; total latency shown "
                   "instead (it includes decoding, which the cache does not shorten).")
        st.plotly_chart(figures.latency_by_hit(requests, column="latency_ms",
                                               title="Total latency, hit vs miss"),
                        key="requests_latency")
    else:
        st.caption("No time to first token or latency recorded for these requests.")

    st.subheader("Per window")
    if windows.empty:
        st.caption("No window in this range.")
    else:
        st.dataframe(pd.DataFrame({
            "window start": windows["window_start_s"].map(fmt_time),
            "model": windows["model"],
            "requests": windows["requests"].map(fmt_int),
            "reported": windows["reported_requests"].map(fmt_int),
            "cached tokens": windows["cached_tokens"].map(fmt_int),
            "reported prompt tokens": windows["reported_prompt_tokens"].map(fmt_int),
            "hit rate": windows["hit_rate"].map(fmt_pct),
            "coverage": windows["coverage"].map(fmt_pct),
        }), hide_index=True)

    st.subheader("Requests")
    if requests.empty:
        st.caption("No request in this range reported cached tokens.")
    else:
        shown = requests.sort_values("ts_unix_s", ascending=False, na_position="last").head(500)
        st.dataframe(pd.DataFrame({
            "time": shown["ts_unix_s"].map(lambda t: fmt_time(t, seconds=True)),
            "model": shown["model"],
            "instance": shown["instance"],
            "endpoint": shown["endpoint"],
            "prompt": shown["prompt_tokens"].map(fmt_tokens),
            "cached": shown["cached_tokens"].map(fmt_tokens),
            "hit rate": shown["hit_rate"].map(fmt_pct),
            "TTFT (ms)": shown["ttft_ms"].map(fmt_ms),
            "latency (ms)": shown["latency_ms"].map(fmt_ms),
            "run": shown["run_id"].map(filters.run_label),
            "request id": shown["request_id"],
        }), hide_index=True)
        if len(requests) > 500:
            st.caption(f"Newest 500 of {len(requests):,} requests shown.")
