"""KV cache residency: how long a cached block lives, how long it sits idle before eviction,
how long between reuses (tables ``metric_samples`` and ``kv_events``).

Two sources, shown side by side on the Residency page (``dashboard/views/residency.py``):

1. vLLM's residency histograms (``--kv-cache-metrics``; vLLM 0.32
   ``vllm/v1/metrics/loggers.py``, sampled by ``--kv-cache-metrics-sample``, seconds):
   ``vllm:kv_block_lifetime_seconds`` (allocation to eviction),
   ``vllm:kv_block_idle_before_evict_seconds`` (last access to eviction) and
   ``vllm:kv_block_reuse_gap_seconds`` (between consecutive accesses). Per bucket, the increase
   of the cumulative count over the selected range, summed over series (a series seen once
   counts its value since the server start; a drop is a restart: the later value counts).
2. KV events: for every ``BlockRemoved`` of a block hash, the time since that hash's latest
   ``BlockStored`` on the same instance and rank (DuckDB ``ASOF JOIN``): the lifetime of each
   evicted block, in the same buckets.

Everything is aggregated in SQL; what leaves the store is one row per bucket.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pandas as pd

from prefixscope.store.queries import archive

RESIDENCY_METRICS: tuple[str, ...] = (
    "vllm:kv_block_lifetime_seconds",
    "vllm:kv_block_idle_before_evict_seconds",
    "vllm:kv_block_reuse_gap_seconds",
)
#: vLLM 0.32's default ``kv_cache_residency`` bucket bounds (seconds), used for the KV-event
#: lifetimes so both sources share an x axis.
RESIDENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1200.0, 1800.0)


def residency_histograms(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                         end_s: float | None = None, models: Sequence[str] | None = None,
                         instances: Sequence[str] | None = None,
                         run_ids: Sequence[str] | None = ("",)) -> pd.DataFrame:
    """Cumulative bucket counts of the residency histograms over a time range.

    Args:
        start_s, end_s: samples with ``start_s <= ts < end_s`` (Unix s; None = open).
        models, instances: filters (None = all). run_ids: default production only.

    Returns:
        Columns ``metric, le`` (bucket upper bound in seconds, ``inf`` last), ``count``
        (cumulative: observations <= le), plus ``sum_s`` and ``total`` (the ``_sum`` and
        ``_count`` increases, the same on every row of a metric); ordered by metric, le.
        Empty when no residency sample is stored.
    """
    where = ["ts_unix_s >= coalesce(?, -1e300)", "ts_unix_s < coalesce(?, 1e300)",
             "metric IN (SELECT unnest(?))"]
    params: list = [start_s, end_s,
                    [m + s for m in RESIDENCY_METRICS for s in ("_bucket", "_sum", "_count")]]
    for col, vals in (("model", models), ("instance", instances), ("run_id", run_ids)):
        if vals is not None:
            where.append(f"{col} IN (SELECT unnest(?))")
            params.append(list(vals))
    return con.execute(f"""
        WITH s AS (
            SELECT metric, labels, instance, run_id, value, ts_unix_s,
                   lag(value) OVER (PARTITION BY metric, labels, instance, run_id
                                    ORDER BY ts_unix_s) AS prev
            FROM {archive.relation(con, "metric_samples", start_s, end_s)}
            WHERE {" AND ".join(where)}
        ), inc AS (
            -- the first sample of a series counts from the server start; a drop is a restart
            SELECT metric, labels, sum(CASE WHEN prev IS NULL OR value < prev THEN value
                                            ELSE value - prev END) AS v
            FROM s GROUP BY metric, labels, instance, run_id
        ), b AS (
            SELECT regexp_replace(metric, '_bucket$', '') AS metric,
                   CAST(json_extract_string(labels, '$.le') AS DOUBLE) AS le, sum(v) AS count
            FROM inc WHERE metric LIKE '%\\_bucket' ESCAPE '\\' GROUP BY 1, 2
        ), t AS (
            SELECT regexp_replace(metric, '_(sum|count)$', '') AS metric,
                   sum(v) FILTER (WHERE metric LIKE '%\\_sum' ESCAPE '\\') AS sum_s,
                   sum(v) FILTER (WHERE metric LIKE '%\\_count' ESCAPE '\\') AS total
            FROM inc WHERE metric NOT LIKE '%\\_bucket' ESCAPE '\\' GROUP BY 1
        )
        SELECT b.metric, b.le, b.count, t.sum_s, t.total
        FROM b LEFT JOIN t USING (metric) ORDER BY b.metric, b.le
    """, params).df()


def histogram_quantile(buckets: pd.DataFrame, q: float) -> float | None:
    """Prometheus ``histogram_quantile`` on one metric's cumulative buckets (columns ``le``,
    ``count``, ascending ``le`` with ``inf`` last): linear interpolation inside the bucket that
    holds rank ``q * total``; the highest finite bound when it falls in ``+Inf``. None when
    the histogram is empty."""
    if buckets.empty:
        return None
    total = float(buckets["count"].iloc[-1])
    if total <= 0:
        return None
    rank = q * total
    lo_le, lo_count = 0.0, 0.0
    for le, count in zip(buckets["le"], buckets["count"]):
        if count >= rank:
            if le == float("inf"):
                return lo_le
            if count == lo_count:
                return float(le)
            return lo_le + (float(le) - lo_le) * (rank - lo_count) / (float(count) - lo_count)
        lo_le, lo_count = float(le), float(count)
    return lo_le


def kv_event_lifetimes(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                       end_s: float | None = None,
                       instances: Sequence[str] | None = None,
                       run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Lifetimes of evicted blocks from KV events, bucketed like vLLM's residency histograms.

    A ``BlockRemoved`` (removal time in the range) pairs with the latest earlier
    ``BlockStored`` of the same hash on the same instance and data-parallel rank; removals
    without a stored event (the capture began later) are left out.

    KV events carry no run id: an instance's events belong to the runs that stored metric
    samples (``metric_series_head``) or requests (``request_rollup_1m``) for that instance, and
    an instance with neither belongs to production (``''``). ``run_ids`` (None = every run)
    keeps the events of the instances of those runs, so a capture ingested under its own run
    (``vllm-cpu-0.32``) does not show on the production run.

    Returns:
        One row: ``evicted`` (paired removals), ``unpaired`` (removals without a store),
        ``mean_s``, ``p50_s``, ``p90_s``, ``max_s`` (seconds, exact over the pairs), and
        ``buckets``: a list of ``(le, cumulative count)`` with :data:`RESIDENCY_BUCKETS` and
        ``inf``. Zero counts and NULL times without removals.
    """
    where = ["r.batch_ts_unix_s >= coalesce(?, -1e300)", "r.batch_ts_unix_s < coalesce(?, 1e300)"]
    params: list = [start_s, end_s]
    if instances is not None:
        where.append("r.instance IN (SELECT unnest(?))")
        params.append(list(instances))
    if run_ids is not None:
        where.append("""r.instance IN (
            WITH owned AS (SELECT instance, run_id FROM metric_series_head
                           UNION SELECT instance, run_id FROM request_rollup_1m)
            SELECT instance FROM owned WHERE run_id IN (SELECT unnest(?))
            UNION
            SELECT DISTINCT instance FROM kv_events
            WHERE list_contains(?, '') AND instance NOT IN (
                SELECT instance FROM owned WHERE instance IS NOT NULL))""")
        params += [list(run_ids), list(run_ids)]
    edges = [*RESIDENCY_BUCKETS, float("inf")]
    pairs = f"""
        WITH st AS (SELECT instance, dp_rank, block_hash, batch_ts_unix_s AS ts
                    FROM kv_events WHERE event_type = 'BlockStored'),
        r AS (SELECT instance, dp_rank, block_hash, batch_ts_unix_s
              FROM kv_events WHERE event_type = 'BlockRemoved'),
        p AS (
            SELECT r.batch_ts_unix_s - st.ts AS life
            FROM r ASOF LEFT JOIN st ON r.instance = st.instance AND r.dp_rank = st.dp_rank
                AND r.block_hash = st.block_hash AND r.batch_ts_unix_s >= st.ts
            WHERE {" AND ".join(where)}
        )"""
    row = con.execute(f"""{pairs}
        SELECT count(life), count(*) - count(life), avg(life), quantile_cont(life, 0.5),
               quantile_cont(life, 0.9), max(life) FROM p
    """, params).fetchone()
    counts = con.execute(f"""{pairs}, e AS (SELECT unnest(?) AS le)
        SELECT e.le, count(p.life) FROM e LEFT JOIN p ON p.life <= e.le
        GROUP BY e.le ORDER BY e.le
    """, [*params, edges]).fetchall()
    return pd.DataFrame([{
        "evicted": int(row[0]), "unpaired": int(row[1]), "mean_s": row[2], "p50_s": row[3],
        "p90_s": row[4], "max_s": row[5],
        "buckets": [(float(le), int(c)) for le, c in counts]}])


def residency_runs(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                   end_s: float | None = None, models: Sequence[str] | None = None,
                   instances: Sequence[str] | None = None) -> pd.DataFrame:
    """Which runs hold residency data in a range: what the Residency page names when the
    sidebar's Run selection has none (a capture's KV events stored under its own run).

    Args:
        start_s, end_s: KV events with ``start_s <= batch_ts_unix_s < end_s`` and residency
            samples with ``start_s <= ts_unix_s < end_s`` (Unix s; None = open).
        models: filter of the histogram samples (KV events carry no model). instances:
            filter of both (None = all).

    Returns:
        One row per run with any: ``run_id`` (``''`` = production), ``kv_events`` (KV events
        of the instances the run owns, by :func:`kv_event_lifetimes`' rule: an instance no run
        names is production's), ``histogram_samples`` (``_count`` samples of
        :data:`RESIDENCY_METRICS`); ordered by ``kv_events + histogram_samples`` descending,
        then run id. Counts only, never per-event rows.
    """
    ev_where = ["batch_ts_unix_s >= coalesce(?, -1e300)", "batch_ts_unix_s < coalesce(?, 1e300)"]
    ev_params: list = [start_s, end_s]
    h_where = ["ts_unix_s >= coalesce(?, -1e300)", "ts_unix_s < coalesce(?, 1e300)",
               "metric IN (SELECT unnest(?))"]
    h_params: list = [start_s, end_s, [m + "_count" for m in RESIDENCY_METRICS]]
    if instances is not None:
        ev_where.append("instance IN (SELECT unnest(?))")
        ev_params.append(list(instances))
    for col, vals in (("model", models), ("instance", instances)):
        if vals is not None:
            h_where.append(f"{col} IN (SELECT unnest(?))")
            h_params.append(list(vals))
    return con.execute(f"""
        WITH owned AS (SELECT instance, run_id FROM metric_series_head
                       UNION SELECT instance, run_id FROM request_rollup_1m
                       WHERE instance IS NOT NULL),
        ev AS (SELECT instance, count(*) AS n FROM kv_events
               WHERE {" AND ".join(ev_where)} GROUP BY instance),
        ev_run AS (SELECT coalesce(o.run_id, '') AS run_id, sum(ev.n) AS kv_events
                   FROM ev LEFT JOIN owned o USING (instance) GROUP BY 1),
        h AS (SELECT run_id, count(*) AS histogram_samples
              FROM {archive.relation(con, "metric_samples", start_s, end_s)}
              WHERE {" AND ".join(h_where)} GROUP BY run_id)
        SELECT coalesce(ev_run.run_id, h.run_id) AS run_id,
               CAST(coalesce(ev_run.kv_events, 0) AS BIGINT) AS kv_events,
               CAST(coalesce(h.histogram_samples, 0) AS BIGINT) AS histogram_samples
        FROM ev_run FULL OUTER JOIN h ON ev_run.run_id = h.run_id
        ORDER BY kv_events + histogram_samples DESC, run_id
    """, ev_params + h_params).df()
