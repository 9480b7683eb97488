"""Queries on vLLM counter and gauge samples: hit rate per window, counter increases, cache config.

The rules (``docs/metrics.md``; vLLM's counters: ``vllm/v1/metrics/loggers.py``, 0.32/0.33):

1. A **series** is (run_id, metric, labels, instance): a replay run's samples never continue
   production's or another run's series. Its samples are ordered by ``ts_unix_s``.
2. The **increase** of a sample is ``value - previous value`` of the same series; when the value
   dropped (a restart) it is the new ``value`` (counting from 0), never negative. The first
   sample of a series has no increase.
3. An increase is attributed to the window that contains the **later** sample. No
   extrapolation, no interpolation: the tokens counted between a sample before a gap and the
   first sample after it all land in the window of the latter.
4. A window is ``[origin_s + k * window_s, origin_s + (k + 1) * window_s)``; ``start_s`` and
   ``end_s`` clip on the later sample's time (``start_s <= ts < end_s``), while the previous
   sample may lie before ``start_s``. Windows without any sample are absent (not zero).
5. Hits and queries are summed over series (engines, instances) in a group, then
   ``hit_rate = sum(hits increases) / sum(queries increases)``, NULL when no query tokens.
   Never a ratio of cumulative totals, never a gauge.

Relation to PromQL: for a window [a, b), ``sum of increases`` equals Prometheus'
``increase()`` **without extrapolation** over a range that starts at the last sample before
``a`` and ends at the last sample before ``b`` (Prometheus' own counter-reset rule also counts a
drop as the new value). Summed over consecutive windows it equals the total increase.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import duckdb
import pandas as pd

from prefixscope.core.errors import InvalidArgument
from prefixscope.store.queries import archive
from prefixscope.store.sqlhelpers import bucket_split, window_start_sql

QUERIES_METRIC = "vllm:prefix_cache_queries_total"
HITS_METRIC = "vllm:prefix_cache_hits_total"
EXTERNAL_HITS_METRIC = "vllm:external_prefix_cache_hits_total"
CACHE_CONFIG_METRIC = "vllm:cache_config_info"

#: Column order of rows given to :func:`insert_metric_samples`.
METRIC_SAMPLE_COLUMNS: tuple[str, ...] = (
    "metric", "labels", "instance", "model", "engine", "ts_unix_s", "value", "raw_metric",
    "legacy", "created_zero", "source_id",
)
_BY_ALLOWED = ("model", "instance", "engine")


def _by_columns(by: Sequence[str]) -> list[str]:
    cols = list(by)
    for c in cols:
        if c not in _BY_ALLOWED:
            raise InvalidArgument(f"cannot group counters by {c!r}: use one of {', '.join(_BY_ALLOWED)}")
    if len(set(cols)) != len(cols):
        raise InvalidArgument(f"repeated grouping column in {cols}")
    return cols


_SERIES = ("metric", "labels", "instance")
_ON_SERIES = " AND ".join(f"m.{c} = t.{c}" for c in _SERIES)


def insert_metric_samples(con: duckdb.DuckDBPyConnection, rows: Sequence[tuple], *,
                          run_id: str = "") -> int:
    """Insert sample rows (tuples in :data:`METRIC_SAMPLE_COLUMNS` order); rows whose key
    (run_id, metric, labels, instance, ts_unix_s) already exists are skipped (migration 10: the
    same scrape stored under two runs is two rows), as are repeats inside ``rows`` (the first
    is kept). ``run_id`` is stored on every row (``''`` = production traffic, else the replay
    run they belong to).

    Each sample's increase over its predecessor in its series is stored with it (columns
    ``has_prev, increase, is_reset, prev_ts_unix_s``, migration 70; rules 1-2 of the module
    docstring): for a series whose new samples are all newer than its newest stored one
    (``metric_series_head``, the usual scrape) from the batch and that head alone; for a
    series with a sample older than its newest stored one (out of order: a backfill, an old
    file) every stored sample from the oldest new one on is recomputed over the series, so
    the neighbours of an inserted sample are right too.

    Runs inside the caller's transaction.

    Returns:
        The number of rows added.
    """
    if not rows:
        return 0
    df = pd.DataFrame.from_records(list(rows), columns=list(METRIC_SAMPLE_COLUMNS))
    df = df.astype({"metric": object, "labels": object, "instance": object, "model": object,
                    "engine": object, "ts_unix_s": "float64", "value": "float64",
                    "raw_metric": object, "legacy": bool, "created_zero": bool,
                    "source_id": object})
    df["_ord"] = range(len(df))
    cols = ", ".join(METRIC_SAMPLE_COLUMNS)
    con.register("_prefixscope_samples_in", df)
    try:
        # The batch without repeats, each series with its stored head and whether the batch
        # only appends to it.
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _ps_batch AS
            SELECT {cols} FROM _prefixscope_samples_in
            QUALIFY row_number() OVER (PARTITION BY metric, labels, instance, ts_unix_s
                                       ORDER BY _ord) = 1
        """)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE _ps_touch AS
            SELECT t.metric, t.labels, t.instance, t.lo, h.ts_unix_s AS head_ts,
                   h.value AS head_value, (h.ts_unix_s IS NULL OR t.lo > h.ts_unix_s) AS in_order
            FROM (SELECT metric, labels, instance, min(ts_unix_s) AS lo FROM _ps_batch
                  GROUP BY ALL) t
            LEFT JOIN metric_series_head h ON h.run_id = ? AND h.metric = t.metric
                 AND h.labels = t.labels AND h.instance = t.instance
        """, [run_id])
        added = con.execute(f"""
            INSERT INTO metric_samples ({cols}, run_id, has_prev, increase, is_reset,
                                        prev_ts_unix_s)
            WITH u AS (
                SELECT b.*, FALSE AS is_head FROM _ps_batch b
                JOIN _ps_touch t USING (metric, labels, instance) WHERE t.in_order
                UNION ALL BY NAME
                SELECT metric, labels, instance, head_ts AS ts_unix_s, head_value AS value,
                       TRUE AS is_head
                FROM _ps_touch WHERE in_order AND head_ts IS NOT NULL
            ), s AS (
                SELECT *, lag(value) OVER w AS prev_value, lag(ts_unix_s) OVER w AS prev_ts
                FROM u WINDOW w AS (PARTITION BY metric, labels, instance ORDER BY ts_unix_s)
            )
            SELECT {cols}, ?, prev_value IS NOT NULL,
                   CASE WHEN value < prev_value THEN value ELSE value - prev_value END,
                   coalesce(value < prev_value, FALSE), prev_ts
            FROM s WHERE NOT is_head
            ON CONFLICT DO NOTHING
        """, [run_id]).fetchone()[0]
        late = con.execute("SELECT count(*) FROM _ps_touch WHERE NOT in_order").fetchone()[0]
        if late:
            added += con.execute(f"""
                INSERT INTO metric_samples ({cols}, run_id)
                SELECT {", ".join("b." + c for c in METRIC_SAMPLE_COLUMNS)}, ?
                FROM _ps_batch b JOIN _ps_touch t USING (metric, labels, instance)
                WHERE NOT t.in_order
                ON CONFLICT DO NOTHING
            """, [run_id]).fetchone()[0]
            con.execute(f"""
                UPDATE metric_samples AS m
                SET has_prev = s.prev_value IS NOT NULL,
                    increase = CASE WHEN s.value < s.prev_value THEN s.value
                                    ELSE s.value - s.prev_value END,
                    is_reset = coalesce(s.value < s.prev_value, FALSE),
                    prev_ts_unix_s = s.prev_ts
                FROM (
                    SELECT m.metric, m.labels, m.instance, m.ts_unix_s, m.value, t.lo,
                           lag(m.value) OVER w AS prev_value, lag(m.ts_unix_s) OVER w AS prev_ts
                    FROM metric_samples m JOIN _ps_touch t ON {_ON_SERIES}
                    WHERE m.run_id = ? AND NOT t.in_order
                    WINDOW w AS (PARTITION BY m.metric, m.labels, m.instance ORDER BY m.ts_unix_s)
                ) AS s
                WHERE m.run_id = ? AND m.metric = s.metric AND m.labels = s.labels
                  AND m.instance = s.instance AND m.ts_unix_s = s.ts_unix_s
                  AND s.ts_unix_s >= s.lo
            """, [run_id, run_id])
        lo, hi = con.execute(
            "SELECT min(lo), greatest(max(head_ts) FILTER (WHERE NOT in_order), "
            "(SELECT max(ts_unix_s) FROM _ps_batch)) FROM _ps_touch").fetchone()
        if lo is not None:
            _refresh_counter_rollup(con, run_id, float(lo), float(hi))
        con.execute("""
            INSERT INTO metric_series_head (run_id, metric, labels, instance, ts_unix_s, value,
                                            model, engine)
            SELECT ?, metric, labels, instance, max(ts_unix_s), arg_max(value, ts_unix_s),
                   arg_max(model, ts_unix_s), arg_max(engine, ts_unix_s)
            FROM _ps_batch GROUP BY metric, labels, instance
            ON CONFLICT DO UPDATE SET
                value = CASE WHEN excluded.ts_unix_s > ts_unix_s THEN excluded.value ELSE value END,
                model = CASE WHEN excluded.ts_unix_s > ts_unix_s THEN excluded.model ELSE model END,
                engine = CASE WHEN excluded.ts_unix_s > ts_unix_s THEN excluded.engine
                              ELSE engine END,
                ts_unix_s = greatest(ts_unix_s, excluded.ts_unix_s)
        """, [run_id])
        con.execute("DROP TABLE _ps_batch")
        con.execute("DROP TABLE _ps_touch")
    finally:
        con.unregister("_prefixscope_samples_in")
    return int(added)


def increases_stored(con: duckdb.DuckDBPyConnection) -> bool:
    """True when every stored sample has its increase computed (``has_prev`` not NULL): the
    counter queries then sum stored increases; else (a row written by other means than
    :func:`insert_metric_samples`) they compute every increase from the values."""
    row = con.execute("SELECT count(*) FROM metric_samples WHERE has_prev IS NULL").fetchone()
    return not row[0]


def recompute_increases(con: duckdb.DuckDBPyConnection) -> int:
    """Compute the stored increase of every sample, the series heads and the counter rollup
    from the values (after rows were written directly with SQL). Runs inside the caller's
    transaction.

    Returns:
        Samples updated.
    """
    from prefixscope.store.schema import _COUNTER_INCREASES

    n = con.execute(_COUNTER_INCREASES[4]).fetchone()[0]
    con.execute("DELETE FROM metric_series_head")
    con.execute("""
        INSERT INTO metric_series_head (run_id, metric, labels, instance, ts_unix_s, value,
                                        model, engine)
        SELECT run_id, metric, labels, instance, max(ts_unix_s), arg_max(value, ts_unix_s),
               arg_max(model, ts_unix_s), arg_max(engine, ts_unix_s)
        FROM metric_samples GROUP BY run_id, metric, labels, instance
    """)
    rebuild_counter_rollup(con)
    return int(n)


def _filters(*, models: Sequence[str] | None, instances: Sequence[str] | None,
             end_s: float | None,
             run_ids: Sequence[str] | None = None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if run_ids is not None:
        clauses.append("list_contains(?::VARCHAR[], run_id)")
        params.append(list(run_ids))
    if models is not None:
        clauses.append("list_contains(?::VARCHAR[], model)")
        params.append(list(models))
    if instances is not None:
        clauses.append("list_contains(?::VARCHAR[], instance)")
        params.append(list(instances))
    if end_s is not None:
        clauses.append("ts_unix_s < ?")
        params.append(float(end_s))
    return "".join(f" AND {c}" for c in clauses), params


#: Length of a counter rollup bucket (``counter_rollup_5m``, migration 72), seconds.
COUNTER_ROLLUP_S = 300.0
_CBUCKET_SQL = "floor(ts_unix_s / 300.0) * 300.0"
#: ``counter_rollup_5m`` rows of the stored increases matched by ``{where}``.
COUNTER_ROLLUP_SELECT_SQL = f"""
    SELECT {_CBUCKET_SQL} AS bucket_start_s, run_id, metric, model, instance, engine,
           sum(increase) AS increase, count(*) FILTER (WHERE is_reset) AS resets,
           bool_or(legacy) AS legacy, count(*) AS samples,
           min(prev_ts_unix_s) AS first_ts_unix_s, max(ts_unix_s) AS last_ts_unix_s
    FROM metric_samples WHERE has_prev AND {{where}} GROUP BY ALL"""
_CROLLUP_COLUMNS = ("bucket_start_s, run_id, metric, model, instance, engine, increase, resets, "
                    "legacy, samples, first_ts_unix_s, last_ts_unix_s")


def rebuild_counter_rollup(con: duckdb.DuckDBPyConnection) -> int:
    """Rebuild ``counter_rollup_5m`` from the stored increases (after
    :func:`recompute_increases`). Runs in the caller's transaction. Returns rows written."""
    con.execute("DELETE FROM counter_rollup_5m")
    row = con.execute(f"INSERT INTO counter_rollup_5m ({_CROLLUP_COLUMNS}) "
                      + _counter_rollup_select(archive.relation(con, "metric_samples"), "TRUE")
                      ).fetchone()
    archive.trim_rollup(con, "metric_samples")
    return int(row[0]) if row else 0


def _counter_rollup_select(rel: str, where: str) -> str:
    """:data:`COUNTER_ROLLUP_SELECT_SQL` over ``rel`` (:func:`archive.relation`)."""
    return COUNTER_ROLLUP_SELECT_SQL.replace(" FROM metric_samples WHERE ",
                                             f" FROM {rel} WHERE ").format(where=where)


def _refresh_counter_rollup(con: duckdb.DuckDBPyConnection, run_id: str, lo: float,
                            hi: float) -> None:
    """Recompute the rollup buckets of run ``run_id`` from ``lo`` to ``hi`` (sample times whose
    increase the insert wrote or changed) from the stored increases."""
    b_lo = math.floor(lo / COUNTER_ROLLUP_S) * COUNTER_ROLLUP_S
    b_hi = math.floor(hi / COUNTER_ROLLUP_S) * COUNTER_ROLLUP_S + COUNTER_ROLLUP_S
    con.execute("DELETE FROM counter_rollup_5m WHERE run_id = ? AND bucket_start_s >= ? "
                "AND bucket_start_s < ?", [run_id, b_lo, b_hi])
    con.execute(f"INSERT INTO counter_rollup_5m ({_CROLLUP_COLUMNS}) "
                + _counter_rollup_select(
                    archive.relation(con, "metric_samples", b_lo, b_hi),
                    "run_id = ? AND ts_unix_s >= ? AND ts_unix_s < ?"),
                [run_id, b_lo, b_hi])
    archive.trim_rollup(con, "metric_samples")


def counter_rollup_current(con: duckdb.DuckDBPyConnection) -> bool:
    """True when ``counter_rollup_5m`` counts every stored increase (it is maintained by
    :func:`insert_metric_samples`): the counter queries then read it for whole buckets.
    Archived samples whose rollup is kept count as stored (:func:`archive.rollup_balance`)."""
    try:
        n, r = archive.rollup_balance(con, "metric_samples")
    except duckdb.CatalogException:
        return False
    return n == r


def _increases_cte(metrics: Sequence[str], *, start_s: float | None, end_s: float | None,
                   models: Sequence[str] | None,
                   instances: Sequence[str] | None,
                   run_ids: Sequence[str] | None = None,
                   stored: bool = True, rollup: bool = False,
                   le: bool = False,
                   con: duckdb.DuckDBPyConnection | None = None) -> tuple[str, list[Any]]:
    """SQL defining CTE ``inc``: rows of increases with columns metric, instance, model,
    engine, ts_unix_s (the later sample's time, or a rollup bucket's start), prev_ts_unix_s
    (earliest earlier sample), last_ts_unix_s (latest later sample), legacy, increase,
    resets (drops counted). Implements rules 1-4 of the module docstring.

    ``stored``: read the increases stored at ingest (a filtered scan: the time filter narrows
    it); False computes them from the values with a window over every sample of the series
    (the same numbers; used when :func:`increases_stored` is False). The filters on run,
    model and instance are constant over a series, and ``end_s`` only drops later samples,
    so neither changes a sample's predecessor: both give identical rows. ``rollup`` (with
    ``stored``): whole 5-minute buckets of the range from ``counter_rollup_5m``, the part
    buckets at either end from the samples (the caller's windows must be whole buckets).
    ``le``: one more column ``le``, the histogram bucket's upper bound label (text, ``+Inf``
    last; NULL for a sample without one), for a histogram's ``_bucket`` series (no rollup:
    the rollup has no labels). ``con`` (the store's connection): samples are read through
    :func:`archive.relation` (the table and the archived days' Parquet files the range
    reaches), and before the rollup's floor (:func:`archive.rollup_floor`) from the samples;
    None reads ``metric_samples``."""
    if le and rollup:
        raise InvalidArgument("the counter rollup has no le label: rollup=False with le")
    def rel(lo_s: float | None, hi_s: float | None) -> str:
        return "metric_samples" if con is None else archive.relation(con, "metric_samples",
                                                                     lo_s, hi_s)

    where, params = _filters(models=models, instances=instances, end_s=end_s, run_ids=run_ids)
    start_clause = ""
    start_params: list[Any] = []
    if start_s is not None:
        start_clause = " AND ts_unix_s >= ?"
        start_params = [float(start_s)]
    le_col = ", json_extract_string(labels, '$.le') AS le" if le else ""
    le_sel = ", le" if le else ""
    raw_cols = ("metric, instance, model, engine, ts_unix_s, prev_ts_unix_s, "
                "ts_unix_s AS last_ts_unix_s, legacy, increase, CAST(is_reset AS BIGINT) AS resets"
                + le_col)
    if stored and rollup:
        floor_s = None if con is None else archive.rollup_floor(con, "metric_samples")
        split = bucket_split(start_s, end_s, COUNTER_ROLLUP_S, floor_s=floor_s)
        if split is not None:  # else the range lies inside a bucket or before the floor
            gwhere, gparams = _filters(models=models, instances=instances, end_s=None,
                                       run_ids=run_ids)
            whole, whole_params = split.whole_where("bucket_start_s")
            mid = f"list_contains(?::VARCHAR[], metric){gwhere} AND {whole}"
            parts = [f"SELECT metric, instance, model, engine, bucket_start_s AS ts_unix_s, "
                     f"first_ts_unix_s AS prev_ts_unix_s, last_ts_unix_s, legacy, increase, "
                     f"resets FROM counter_rollup_5m WHERE {mid}"]
            all_params: list[Any] = [list(metrics), *gparams, *whole_params]
            if split.head is not None:
                since = "" if start_s is None else " AND ts_unix_s >= ?"
                parts.append(f"SELECT {raw_cols} FROM {rel(*split.head)} WHERE has_prev AND "
                             f"list_contains(?::VARCHAR[], metric){gwhere}{since} "
                             f"AND {_CBUCKET_SQL} < ?")
                all_params += [list(metrics), *gparams,
                               *([] if start_s is None else [float(start_s)]), split.lo]
            if split.tail is not None:
                parts.append(f"SELECT {raw_cols} FROM {rel(*split.tail)} WHERE has_prev AND "
                             f"list_contains(?::VARCHAR[], metric){where}{start_clause} "
                             f"AND {_CBUCKET_SQL} >= ?")
                all_params += [list(metrics), *params, *start_params, split.hi]
            return "inc AS (" + " UNION ALL ".join(parts) + ")", all_params
    if stored:
        sql = f"""
        inc AS (
            SELECT {raw_cols}
            FROM {rel(start_s, end_s)}
            WHERE list_contains(?::VARCHAR[], metric){where}{start_clause} AND has_prev
        )"""
        return sql, [list(metrics), *params, *start_params]
    sql = f"""
        base AS (
            SELECT run_id, metric, labels, instance, model, engine, ts_unix_s, value, legacy
            FROM {rel(None, end_s)}
            WHERE list_contains(?::VARCHAR[], metric){where}
        ),
        steps AS (
            SELECT metric, instance, model, engine, ts_unix_s, value, legacy{le_col},
                   lag(value) OVER w AS prev_value,
                   lag(ts_unix_s) OVER w AS prev_ts_unix_s
            FROM base
            WINDOW w AS (PARTITION BY run_id, metric, labels, instance ORDER BY ts_unix_s)
        ),
        inc AS (
            SELECT metric, instance, model, engine, ts_unix_s, prev_ts_unix_s,
                   ts_unix_s AS last_ts_unix_s, legacy{le_sel},
                   CASE WHEN value < prev_value THEN value ELSE value - prev_value END AS increase,
                   CAST(value < prev_value AS BIGINT) AS resets
            FROM steps
            WHERE prev_value IS NOT NULL{start_clause}
        )"""
    return sql, [list(metrics), *params, *start_params]


def increases_of_samples(samples: Sequence[tuple[str, str, float, float]],
                         metrics: Sequence[str]) -> dict[str, float]:
    """Total increase of each counter over a few samples held in memory, by the rules of this
    module (rules 1-2: per series, a drop counts from the new value, summed over series
    afterwards), with the same SQL as the stored samples (:func:`_increases_cte`) on a private
    in-memory DuckDB. The live replayer's before/after deltas use it, so that a reset of one
    engine's series is never hidden by growth in another.

    Args:
        samples: ``(metric, labels, ts_unix_s, value)``; ``labels`` identifies the series
            (e.g. sorted-key JSON). A counter's created-zero is a sample of value 0 at its
            created time.
        metrics: counters to total.

    Returns:
        ``{metric: increase}`` for each metric with at least one series of two samples or more
        (a series seen once has no increase); absent otherwise.
    """
    con = duckdb.connect(":memory:")
    try:
        con.execute("CREATE TABLE metric_samples (run_id VARCHAR, metric VARCHAR, labels VARCHAR,"
                    " instance VARCHAR, model VARCHAR, engine VARCHAR, ts_unix_s DOUBLE,"
                    " value DOUBLE, legacy BOOLEAN)")
        if samples:
            con.executemany("INSERT INTO metric_samples VALUES ('', ?, ?, '', NULL, NULL, ?, ?,"
                            " false)", [list(s) for s in samples])
        cte, params = _increases_cte(tuple(metrics), start_s=None, end_s=None, models=None,
                                     instances=None, stored=False)
        rows = con.execute(f"WITH {cte} SELECT metric, sum(increase) FROM inc GROUP BY metric",
                           params).fetchall()
    finally:
        con.close()
    return {m: float(v) for m, v in rows}
def _use_stored(con: duckdb.DuckDBPyConnection, stored: bool | None) -> bool:
    return increases_stored(con) if stored is None else bool(stored)


def _use_rollup(con: duckdb.DuckDBPyConnection, stored: bool, rollup: bool | None,
                window_s: float | None = None, origin_s: float = 0.0) -> bool:
    if not stored or rollup is False:
        return False
    if window_s is not None and (float(window_s) % COUNTER_ROLLUP_S
                                 or float(origin_s) % COUNTER_ROLLUP_S):
        return False
    return counter_rollup_current(con) if rollup is None else True


def hit_rate_by_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                       end_s: float | None = None, window_s: float = 3600,
                       by: Sequence[str] = ("model", "instance"),
                       models: Sequence[str] | None = None,
                       instances: Sequence[str] | None = None,
                       origin_s: float = 0.0,
                       run_ids: Sequence[str] | None = None,
                       stored: bool | None = None,
                       rollup: bool | None = None) -> pd.DataFrame:
    """Token-weighted prefix-cache hit rate per window from counter increases.

    ``hit_tokens`` = sum of increases of ``vllm:prefix_cache_hits_total`` and ``query_tokens``
    = sum of increases of ``vllm:prefix_cache_queries_total`` over the series of the group whose
    later sample falls in the window (rules in the module docstring).

    Args:
        start_s, end_s: keep increases whose later sample has ``start_s <= ts < end_s``
            (Unix seconds; None = unbounded).
        window_s: window length in seconds (300, 3600, 86400 on the dashboard).
        by: grouping columns, any of ``model``, ``instance``, ``engine`` (may be empty).
        models, instances: filters (None = all).
        origin_s: windows start at ``origin_s + k * window_s`` (0 = aligned to the UTC epoch).
        run_ids: keep samples of these runs (``''`` = production, the default of the
            report, hitrate and daily commands; replay runs have their own run id); None = all.
        stored: sum the increases stored at ingest (True) or compute them from the values
            (False); None = stored when every sample has one (:func:`increases_stored`).
            Both give the same rows.
        rollup: with stored increases and windows of whole 5-minute buckets, sum the
            per-bucket rollup (``counter_rollup_5m``) for the whole buckets of the range and
            the samples for the part buckets at its ends (True), or the samples only (False);
            None = the rollup when :func:`counter_rollup_current`. Same rows.

    Returns:
        DataFrame ordered by window then group: ``window_start_s, window_end_s, <by>,
        hit_tokens, query_tokens`` (tokens, BIGINT), ``hit_rate`` (fraction, NaN/None when
        ``query_tokens`` is 0), ``restarts`` (drops seen in the queries counter's series),
        ``legacy`` (any sample came from a ``vllm:gpu_prefix_cache_*`` name),
        ``external_hit_tokens`` (increase of ``vllm:external_prefix_cache_hits_total``; local
        plus external hit rate = (hit + external) / query).

    Raises:
        InvalidArgument: unknown grouping column or ``window_s <= 0``.
    """
    if window_s <= 0:
        raise InvalidArgument("window_s must be > 0")
    cols = _by_columns(by)
    use = _use_stored(con, stored)
    cte, params = _increases_cte((QUERIES_METRIC, HITS_METRIC, EXTERNAL_HITS_METRIC),
                                 start_s=start_s, end_s=end_s, models=models, instances=instances,
                                 run_ids=run_ids, stored=use,
                                 rollup=_use_rollup(con, use, rollup, window_s, origin_s),
                                 con=con)
    sel = "".join(f", {c}" for c in cols)
    window_start, window_params = window_start_sql("ts_unix_s", window_s=window_s,
                                                   origin_s=origin_s)
    sql = f"""
        WITH {cte},
        win AS (
            SELECT {window_start} AS window_start_s{sel}, metric, increase, resets, legacy
            FROM inc
        ),
        agg AS (
            SELECT window_start_s{sel},
                   coalesce(sum(increase) FILTER (WHERE metric = ?), 0) AS hits,
                   coalesce(sum(increase) FILTER (WHERE metric = ?), 0) AS queries,
                   coalesce(sum(increase) FILTER (WHERE metric = ?), 0) AS external_hits,
                   CAST(coalesce(sum(resets) FILTER (WHERE metric = ?), 0) AS BIGINT)
                       AS restarts,
                   bool_or(legacy) FILTER (WHERE metric <> ?) AS legacy
            FROM win
            GROUP BY ALL
        )
        SELECT window_start_s, window_start_s + ? AS window_end_s{sel},
               CAST(round(hits) AS BIGINT) AS hit_tokens,
               CAST(round(queries) AS BIGINT) AS query_tokens,
               CASE WHEN queries > 0 THEN hits / queries END AS hit_rate,
               restarts,
               coalesce(legacy, false) AS legacy,
               CAST(round(external_hits) AS BIGINT) AS external_hit_tokens
        FROM agg
        ORDER BY window_start_s{sel}
    """
    all_params = [*params, *window_params, HITS_METRIC, QUERIES_METRIC, EXTERNAL_HITS_METRIC,
                  QUERIES_METRIC, EXTERNAL_HITS_METRIC, float(window_s)]
    return con.execute(sql, all_params).df()


def hit_rate_totals(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                    end_s: float | None = None, by: Sequence[str] = ("model",),
                    models: Sequence[str] | None = None,
                    instances: Sequence[str] | None = None,
                    run_ids: Sequence[str] | None = None,
                    stored: bool | None = None,
                    rollup: bool | None = None) -> pd.DataFrame:
    """Hit rate over a whole time range per group (one row per group).

    ``run_ids`` filters by run as in :func:`hit_rate_by_window` (None = all runs).

    Same increases as :func:`hit_rate_by_window` (its windows summed), so
    ``hit_rate = sum(hit increases) / sum(query increases)`` over the range.

    Returns:
        DataFrame ordered by group: ``<by>, hit_tokens, query_tokens`` (tokens), ``hit_rate``
        (fraction, None when no query tokens), ``legacy`` (bool), ``first_ts_unix_s`` (the
        earliest sample an increase was measured from, possibly before ``start_s``),
        ``last_ts_unix_s`` (the latest sample counted).
    """
    cols = _by_columns(by)
    use = _use_stored(con, stored)
    cte, params = _increases_cte((QUERIES_METRIC, HITS_METRIC), start_s=start_s, end_s=end_s,
                                 models=models, instances=instances, run_ids=run_ids,
                                 stored=use, rollup=_use_rollup(con, use, rollup), con=con)
    sel = ", ".join(cols)
    group = f"GROUP BY {sel}" if cols else ""
    lead = f"{sel}, " if cols else ""
    order = f"ORDER BY {sel}" if cols else ""
    sql = f"""
        WITH {cte},
        agg AS (
            SELECT {lead}
                   coalesce(sum(increase) FILTER (WHERE metric = ?), 0) AS hits,
                   coalesce(sum(increase) FILTER (WHERE metric = ?), 0) AS queries,
                   bool_or(legacy) AS legacy,
                   min(prev_ts_unix_s) AS first_ts_unix_s,
                   max(last_ts_unix_s) AS last_ts_unix_s
            FROM inc
            {group}
        )
        SELECT {lead}CAST(round(hits) AS BIGINT) AS hit_tokens,
               CAST(round(queries) AS BIGINT) AS query_tokens,
               CASE WHEN queries > 0 THEN hits / queries END AS hit_rate,
               coalesce(legacy, false) AS legacy, first_ts_unix_s, last_ts_unix_s
        FROM agg
        WHERE last_ts_unix_s IS NOT NULL
        {order}
    """
    return con.execute(sql, [*params, HITS_METRIC, QUERIES_METRIC]).df()


def counter_increase_by_window(con: duckdb.DuckDBPyConnection, *, metric: str,
                               start_s: float | None = None, end_s: float | None = None,
                               window_s: float = 3600, by: Sequence[str] = ("model", "instance"),
                               models: Sequence[str] | None = None,
                               instances: Sequence[str] | None = None,
                               origin_s: float = 0.0,
                               run_ids: Sequence[str] | None = None,
                               stored: bool | None = None,
                               rollup: bool | None = None) -> pd.DataFrame:
    """Increase of any stored counter per window (same rules as :func:`hit_rate_by_window`).

    Args:
        metric: canonical sample name, e.g. ``vllm:num_preemptions_total`` (a histogram's
            ``_count``/``_sum`` works too; its ``_bucket`` with ``le`` in ``by``).
        by: grouping columns among ``model``, ``instance``, ``engine`` and ``le`` (a histogram
            bucket's upper bound label as text, e.g. ``0.01`` or ``+Inf``: the bucket
            increases ``histogram_quantile`` needs; the 5-minute rollup is not used then).

    Returns:
        DataFrame ``window_start_s, window_end_s, <by>, increase`` (the counter's unit, DOUBLE),
        ordered by window then group.
    """
    if window_s <= 0:
        raise InvalidArgument("window_s must be > 0")
    le = "le" in by
    _by_columns([c for c in by if c != "le"])
    cols = list(by)
    if le and cols.count("le") > 1:
        raise InvalidArgument(f"repeated grouping column in {cols}")
    use_stored = _use_stored(con, stored)
    cte, params = _increases_cte((metric,), start_s=start_s, end_s=end_s, models=models,
                                 instances=instances, run_ids=run_ids, stored=use_stored,
                                 rollup=not le and _use_rollup(con, use_stored, rollup,
                                                               window_s, origin_s),
                                 le=le, con=con)
    sel = "".join(f", {c}" for c in cols)
    window_start, window_params = window_start_sql("ts_unix_s", window_s=window_s,
                                                   origin_s=origin_s)
    sql = f"""
        WITH {cte},
        win AS (SELECT {window_start} AS window_start_s{sel}, increase FROM inc)
        SELECT window_start_s, window_start_s + ? AS window_end_s{sel},
               sum(increase) AS increase
        FROM win
        GROUP BY ALL
        ORDER BY window_start_s{sel}
    """
    return con.execute(sql, [*params, *window_params, float(window_s)]).df()


def gauge_series(con: duckdb.DuckDBPyConnection, *, metric: str, start_s: float | None = None,
                 end_s: float | None = None, models: Sequence[str] | None = None,
                 instances: Sequence[str] | None = None,
                 run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Samples of a gauge (e.g. ``vllm:kv_cache_usage_perc``, a fraction 0..1), oldest first.

    Returns:
        DataFrame ``ts_unix_s, model, instance, engine, value``.
    """
    where, params = _filters(models=models, instances=instances, end_s=end_s, run_ids=run_ids)
    if start_s is not None:
        where += " AND ts_unix_s >= ?"
        params.append(float(start_s))
    return con.execute(
        "SELECT ts_unix_s, model, instance, engine, value FROM "
        f"{archive.relation(con, 'metric_samples', start_s, end_s)} "
        f"WHERE metric = ? AND NOT created_zero{where} "
        "ORDER BY ts_unix_s, instance, engine", [metric, *params]).df()


def cache_config(con: duckdb.DuckDBPyConnection, *,
                 instances: Sequence[str] | None = None,
                 run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """The latest ``vllm:cache_config_info`` labels per instance and engine.

    ``model`` is the latest ``model_name`` seen on any sample of that instance and engine
    (cache_config_info itself has no model label). Reads the newest sample of each series
    (``metric_series_head``, migrations 70 and 76, maintained by
    :func:`insert_metric_samples`), not every sample: the newest sample of an instance and
    engine is the newest of its series.

    Returns:
        DataFrame ``instance, model, engine, block_size`` (tokens per block),
        ``num_gpu_blocks`` (blocks, the null block included), ``hash_algo``,
        ``enable_prefix_caching`` (bool), ``ts_unix_s`` (scrape of that config), ordered by
        instance and engine. Integers are NULL when the label is "None" or absent.
    """
    where, params = _filters(models=None, instances=instances, end_s=None, run_ids=run_ids)
    sql = f"""
        WITH cfg AS (
            SELECT instance, engine, labels, ts_unix_s,
                   row_number() OVER (PARTITION BY instance, engine
                                      ORDER BY ts_unix_s DESC, labels) AS rn
            FROM metric_series_head
            WHERE metric = ?{where}
        ),
        models AS (
            SELECT instance, engine, arg_max(model, ts_unix_s) AS model
            FROM metric_series_head
            WHERE model IS NOT NULL{where}
            GROUP BY instance, engine
        )
        SELECT cfg.instance, models.model, cfg.engine,
               TRY_CAST(json_extract_string(cfg.labels, '$.block_size') AS BIGINT) AS block_size,
               TRY_CAST(json_extract_string(cfg.labels, '$.num_gpu_blocks') AS BIGINT)
                   AS num_gpu_blocks,
               json_extract_string(cfg.labels, '$.prefix_caching_hash_algo') AS hash_algo,
               lower(json_extract_string(cfg.labels, '$.enable_prefix_caching')) = 'true'
                   AS enable_prefix_caching,
               cfg.ts_unix_s
        FROM cfg
        LEFT JOIN models ON models.instance = cfg.instance
             AND models.engine IS NOT DISTINCT FROM cfg.engine
        WHERE cfg.rn = 1
        ORDER BY cfg.instance, cfg.engine
    """
    return con.execute(sql, [CACHE_CONFIG_METRIC, *params, *params]).df()


def metric_filter_values(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Values for the dashboard's filters, from the stored samples (created-zero samples aside).

    Returns:
        ``{"models": [...], "instances": [...], "run_ids": [...], "production_instances":
        [...], "min_ts_unix_s": float | None, "max_ts_unix_s": float | None,
        "production_max_ts_unix_s": float | None}``, lists sorted ascending;
        ``production_instances`` are those with production samples (``run_id = ''``), and
        ``production_max_ts_unix_s`` is their newest sample.
    """
    models = [r[0] for r in con.execute(
        "SELECT DISTINCT model FROM metric_samples WHERE model IS NOT NULL ORDER BY model"
    ).fetchall()]
    instances = [r[0] for r in con.execute(
        "SELECT DISTINCT instance FROM metric_samples ORDER BY instance").fetchall()]
    run_ids = [r[0] for r in con.execute(
        "SELECT DISTINCT run_id FROM metric_samples ORDER BY run_id").fetchall()]
    production = [r[0] for r in con.execute(
        "SELECT DISTINCT instance FROM metric_samples WHERE run_id = '' ORDER BY instance"
    ).fetchall()]
    lo, hi, hi_prod = con.execute(
        "SELECT min(ts_unix_s), max(ts_unix_s), max(ts_unix_s) FILTER (WHERE run_id = '') "
        "FROM metric_samples WHERE NOT created_zero"
    ).fetchone()
    lo = archive.with_archived_start(con, "metric_samples", lo)
    return {"models": models, "instances": instances, "run_ids": run_ids,
            "production_instances": production,
            "min_ts_unix_s": None if lo is None else float(lo),
            "max_ts_unix_s": None if hi is None else float(hi),
            "production_max_ts_unix_s": None if hi_prod is None else float(hi_prod)}


def last_sample_ts(con: duckdb.DuckDBPyConnection, *,
                   instances: Sequence[str] | None = None,
                   run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Latest scrape per instance and model (for staleness checks).

    Returns:
        DataFrame ``instance, model, last_ts_unix_s`` (Unix seconds), ordered by instance, model.
        Samples without a model label (cache_config_info) count for every model of their
        instance only through the model-labelled samples of the same scrape.
    """
    where, params = _filters(models=None, instances=instances, end_s=None, run_ids=run_ids)
    return con.execute(
        "SELECT instance, model, max(ts_unix_s) AS last_ts_unix_s FROM metric_samples "
        f"WHERE NOT created_zero AND model IS NOT NULL{where} "
        "GROUP BY instance, model ORDER BY instance, model", params).df()


def source_notes(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Notes recorded on metric sources (e.g. the legacy-name notice).

    Returns:
        DataFrame ``source_id, kind, location, note, last_ingest_unix_s`` for metric sources
        (kinds ``metrics-file``, ``metrics-url``, ``prometheus``) with a note, newest first.
    """
    return con.execute(
        "SELECT source_id, kind, location, note, last_ingest_unix_s FROM ingest_sources "
        "WHERE kind IN ('metrics-file', 'metrics-url', 'prometheus') AND note IS NOT NULL "
        "ORDER BY last_ingest_unix_s DESC").df()
