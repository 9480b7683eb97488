"""Residency: how long does my cache last? KV block lifetime, idle time before eviction and
the gap between reuses, from vLLM's residency histograms and from the KV events.

Reads ``prefixscope.store.queries.residency`` (``residency_histograms``, ``kv_event_lifetimes``)
through ``prefixscope.dashboard.data.query``: one row per bucket, never per block. The
histograms come from a vLLM started with ``--kv-cache-metrics`` (sampled by
``--kv-cache-metrics-sample``); the KV-event lifetimes pair each ``BlockRemoved`` with its
block's latest ``BlockStored`` (``docs/metrics.md#kv-residency``).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from prefixscope.core.formatting import MISSING, fmt_int, md_text
from prefixscope.dashboard import data, filters
from prefixscope.dashboard.downloads import show_table
from prefixscope.store.queries.residency import RESIDENCY_METRICS, histogram_quantile

TITLES = {
    "vllm:kv_block_lifetime_seconds": "Lifetime (allocated → evicted)",
    "vllm:kv_block_idle_before_evict_seconds": "Idle before eviction",
    "vllm:kv_block_reuse_gap_seconds": "Gap between reuses",
}
EMPTY = ("No KV residency data in this range. Start vLLM with `--kv-cache-metrics` (and "
         "`--kv-cache-metrics-sample 1.0` to see every block) and ingest its `/metrics` "
         "(`prefixscope ingest metrics URL --every 15`), or ingest its KV events "
         "(`prefixscope ingest kv-events`).")

#: Why a figure reads "—" (shown under the KPIs whenever one source is missing).
NO_HISTOGRAMS = ("no vLLM residency histograms for this run: start vLLM with "
                 "`--kv-cache-metrics` (`--kv-cache-metrics-sample 1.0` for every block) and "
                 "ingest its `/metrics`; idle time and reuse gaps come only from them.")
NO_EVENTS = ("no KV events for this run: start vLLM with `--kv-events-config "
             "'{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",...}'` and ingest "
             "them (`prefixscope ingest kv-events --zmq tcp://HOST:5557`).")


def other_runs_note(runs: pd.DataFrame, selected) -> str:
    """What the runs outside the selection hold (``store.queries.residency.residency_runs``
    rows; ``selected`` = the sidebar's run ids, None = all): ``591 KV events and 9 residency
    histogram samples are stored under the run `vllm-cpu-0.32`: pick it in the sidebar's Run
    filter (or clear the filter for every run).`` Empty when no other run holds any."""
    if selected is None or runs.empty:
        return ""
    other = runs[~runs["run_id"].isin(list(selected))]
    other = other[(other["kv_events"] > 0) | (other["histogram_samples"] > 0)]
    if other.empty:
        return ""
    parts = []
    for _, r in other.iterrows():
        what = []
        if r["kv_events"]:
            what.append(f"{fmt_int(r['kv_events'])} KV events")
        if r["histogram_samples"]:
            what.append(f"{fmt_int(r['histogram_samples'])} residency histogram samples")
        run = md_text(filters.run_label(r["run_id"]), code=True)
        parts.append(f"{' and '.join(what)} under the run {run}")
    runs_word = "it" if len(parts) == 1 else "one of them"
    return (f"Stored outside this selection: {'; '.join(parts)}. Pick {runs_word} in the "
            "sidebar's **Run** filter (or clear the filter for every run).")


def outside_range_note(runs: pd.DataFrame) -> str:
    """What the whole store holds when the time range has no residency data
    (``store.queries.residency.residency_runs`` rows over every time): ``591 KV events are
    stored outside this time range: set the sidebar's Time range to **all** ...``. Empty when
    the store holds none."""
    if runs.empty:
        return ""
    events = int(runs["kv_events"].sum())
    samples = int(runs["histogram_samples"].sum())
    if not events and not samples:
        return ""
    what = []
    if events:
        what.append(f"{fmt_int(events)} KV events")
    if samples:
        what.append(f"{fmt_int(samples)} residency histogram samples")
    return (f"{' and '.join(what)} {'are' if events + samples != 1 else 'is'} stored outside "
            "this time range: set the sidebar's **Time range** to **all** (or one that "
            "reaches them).")


def fmt_s(x) -> str:
    """Seconds for a person: ``850 ms``, ``12.3 s``, ``4.2 min``, ``1.5 h``; ``—`` for none."""
    if x is None or pd.isna(x):
        return MISSING
    x = float(x)
    if x < 1:
        return f"{x * 1000:,.0f} ms"
    if x < 120:
        return f"{x:,.1f} s"
    if x < 7200:
        return f"{x / 60:,.1f} min"
    return f"{x / 3600:,.1f} h"


def _label(le: float) -> str:
    return "> 1800 s" if le == float("inf") else f"≤ {le:g} s"


def bucket_figure(series: dict[str, list[tuple[float, float]]], title: str) -> go.Figure:
    """Bars of observations per bucket (cumulative counts differenced) for each source."""
    fig = go.Figure()
    for name, cum in series.items():
        les = [le for le, _ in cum]
        counts = [c for _, c in cum]
        per = [counts[0]] + [b - a for a, b in zip(counts, counts[1:])]
        fig.add_bar(x=[_label(le) for le in les], y=per, name=name)
    fig.update_layout(title=title, barmode="group", height=320, margin=dict(t=40, b=40),
                      xaxis_title="seconds", yaxis_title="blocks", legend=dict(orientation="h"))
    return fig


f = filters.current()
db = data.db_path()
st.title("Residency")
st.caption("How long does my cache last: KV blocks from allocation to eviction, idle time "
           "before eviction, and the gap between reuses. " + f.describe())

with data.guard(db):
    hist = data.query(db, "residency", "residency_histograms", start_s=f.start_s, end_s=f.end_s,
                      models=f.models, instances=f.instances, run_ids=f.run_ids)
    events = data.query(db, "residency", "kv_event_lifetimes", start_s=f.start_s,
                        end_s=f.end_s, instances=f.instances, run_ids=f.run_ids).iloc[0]
    have_hist = not hist.empty and float(hist["total"].fillna(0).max()) > 0
    elsewhere = ""
    if not have_hist or events["evicted"] == 0:
        elsewhere = other_runs_note(
            data.query(db, "residency", "residency_runs", start_s=f.start_s, end_s=f.end_s,
                       models=f.models, instances=f.instances), f.run_ids)
    if not have_hist and events["evicted"] == 0:
        outside = ""
        if not elsewhere and (f.start_s is not None or f.end_s is not None):
            outside = outside_range_note(data.query(
                db, "residency", "residency_runs", models=f.models, instances=f.instances))
        if elsewhere:
            st.info(f"No KV residency data in this range for the selected run. {elsewhere}",
                    icon=":material/filter_alt:")
        elif outside:
            st.info(f"No KV residency data in this range. {outside}",
                    icon=":material/date_range:")
        else:
            st.info(EMPTY, icon=":material/info:")
        st.stop()

    rows = []
    for metric in RESIDENCY_METRICS:
        g = hist[hist["metric"] == metric]
        total = float(g["total"].iloc[0]) if not g.empty and pd.notna(g["total"].iloc[0]) else 0
        rows.append({"Measure": TITLES[metric], "Source": metric,
                     "Blocks": fmt_int(total),
                     "Mean": fmt_s(g["sum_s"].iloc[0] / total) if total else MISSING,
                     "Median": fmt_s(histogram_quantile(g, 0.5)),
                     "90th percentile": fmt_s(histogram_quantile(g, 0.9))})
    rows.append({"Measure": "Lifetime of evicted blocks", "Source": "KV events (stored → removed)",
                 "Blocks": fmt_int(events["evicted"]), "Mean": fmt_s(events["mean_s"]),
                 "Median": fmt_s(events["p50_s"]), "90th percentile": fmt_s(events["p90_s"])})
    lifetime = rows[0]
    c1, c2, c3 = st.columns(3)
    c1.metric("Median block lifetime", lifetime["Median"] if have_hist else rows[-1]["Median"],
              border=True, help="Half of the evicted blocks lived shorter than this.")
    c2.metric("Median idle before eviction", rows[1]["Median"], border=True,
              help="How long an evicted block had gone unused: a hit needs a request within "
                   "this time.")
    c3.metric("Median gap between reuses", rows[2]["Median"], border=True,
              help="Time between two hits on one block (vLLM keeps the most recent accesses).")
    if not have_hist:
        st.caption(f"— {NO_HISTOGRAMS}")
    if events["evicted"] == 0:
        st.caption(f"— {NO_EVENTS}")
    if elsewhere:
        st.caption(elsewhere)
    show_table("residency-summary", pd.DataFrame(rows), caption=(
               "Histogram quantiles are interpolated inside vLLM's buckets (as Prometheus "
               "histogram_quantile); the KV-event figures are exact over the paired events. "
               "vLLM samples the histograms (`--kv-cache-metrics-sample`, default 1% of blocks)."))

    series = {}
    g = hist[hist["metric"] == "vllm:kv_block_lifetime_seconds"]
    if not g.empty:
        series["vllm histogram"] = list(zip(g["le"], g["count"]))
    if events["evicted"]:
        series["KV events"] = list(events["buckets"])
    st.plotly_chart(bucket_figure(series, "Block lifetime"), key="residency-lifetime")
    for metric in RESIDENCY_METRICS[1:]:
        g = hist[hist["metric"] == metric]
        if not g.empty and float(g["total"].fillna(0).max()) > 0:
            st.plotly_chart(bucket_figure({"vllm histogram": list(zip(g["le"], g["count"]))},
                                          TITLES[metric]), key=f"residency-{metric}")
