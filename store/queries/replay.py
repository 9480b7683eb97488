"""Queries on replay runs (table ``runs`` joined with their ``requests`` and ``prices``).

Definitions (``docs/replay.md`` "Outputs" and ``docs/metrics.md`` "Cost and savings"):

- A run's requests are the ``requests`` rows with its ``run_id``.
- ``hit_rate`` = Σ cached_tokens / Σ prompt_tokens over the run's requests that reported
  cached tokens (a simulated run reports them all); NULL when that sum is 0.
- Cost, in the price table's currency, per million tokens at the model's price row (``prices``;
  ``shadow`` marks a self-hosted model's shadow price), with P prompt, C cached, W cache-write
  of which W1h with a 1 h TTL (NULL counts 0) and O completion tokens — the formulas of
  ``store/queries/savings.py``::

      cost_without_cache = (P * input + O * output) / 1e6
      cost_with_cache    = ((P - C - W) * input + C * cached_input + (W - W1h) * cache_write
                            + W1h * cache_write_1h + O * output) / 1e6
      saved              = cost_without_cache - cost_with_cache

  NULL when the run's model has no price row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pandas as pd

from prefixscope.core.errors import InvalidArgument
from prefixscope.store.sqlhelpers import window_start_sql


def replay_runs(con: duckdb.DuckDBPyConnection, *, kinds: Sequence[str] | None = None,
                run_ids: Sequence[str] | None = None,
                price_as: str | None = None) -> pd.DataFrame:
    """One row per run (newest first), with its totals and cost.

    Args:
        kinds: only these kinds (``replay-sim``, ``replay-live``...); None = every kind.
        run_ids: only these runs; None = all.
        price_as: cost every run at this price-table entry (e.g. a self-hosted model's shadow
            price); None = at the price of each request's own model.

    Returns:
        Columns ``run_id, label, kind, created_unix_s, params_json`` (the run's parameters and
        summary, JSON text), ``model``, ``first_ts_unix_s``, ``last_ts_unix_s``, ``requests``,
        ``prompt_tokens``, ``cached_tokens``, ``cache_write_tokens``, ``completion_tokens``
        (tokens), ``hit_rate`` (fraction or NULL), ``currency``, ``shadow``, ``price_source``,
        ``cost_without_cache``, ``cost_with_cache``, ``saved`` (DOUBLE, currency units; NULL
        without a price). ``model`` is the run's most frequent model.
    """
    where = ["TRUE"]
    params: list = []
    if kinds is not None:
        where.append("list_contains(?::VARCHAR[], r.kind)")
        params.append([str(k) for k in kinds])
    if run_ids is not None:
        where.append("list_contains(?::VARCHAR[], r.run_id)")
        params.append([str(x) for x in run_ids])
    sql = f"""
        WITH agg AS (
            SELECT q.run_id, q.model,
                   count(*) AS requests,
                   sum(q.prompt_tokens) AS prompt_tokens,
                   sum(q.cached_tokens) AS cached_tokens,
                   sum(CASE WHEN q.cached_tokens IS NOT NULL THEN q.prompt_tokens END)
                       AS reported_prompt_tokens,
                   sum(coalesce(q.cache_write_tokens, 0)) AS cache_write_tokens,
                   sum(coalesce(q.cache_write_1h_tokens, 0)) AS cache_write_1h_tokens,
                   sum(coalesce(q.completion_tokens, 0)) AS completion_tokens,
                   min(q.ts_unix_s) AS first_ts_unix_s, max(q.ts_unix_s) AS last_ts_unix_s
            FROM requests q
            WHERE q.run_id IN (SELECT run_id FROM runs)
            GROUP BY q.run_id, q.model
        ), costed AS (
            SELECT a.*, p.currency, p.shadow, p.price_source,
                   (a.prompt_tokens * p.input_per_mtok
                    + a.completion_tokens * p.output_per_mtok) / 1e6 AS cost_without_cache,
                   ((a.prompt_tokens - coalesce(a.cached_tokens, 0) - a.cache_write_tokens)
                        * p.input_per_mtok
                    + coalesce(a.cached_tokens, 0) * p.cached_input_per_mtok
                    + (a.cache_write_tokens - a.cache_write_1h_tokens) * p.cache_write_per_mtok
                    + a.cache_write_1h_tokens * p.cache_write_1h_per_mtok
                    + a.completion_tokens * p.output_per_mtok) / 1e6 AS cost_with_cache
            FROM agg a LEFT JOIN prices p ON p.model = coalesce(?, a.model)
        ), per_run AS (
            SELECT run_id,
                   arg_max(model, requests) AS model,
                   min(first_ts_unix_s) AS first_ts_unix_s,
                   max(last_ts_unix_s) AS last_ts_unix_s,
                   sum(requests) AS requests, sum(prompt_tokens) AS prompt_tokens,
                   sum(cached_tokens) AS cached_tokens,
                   sum(reported_prompt_tokens) AS reported_prompt_tokens,
                   sum(cache_write_tokens) AS cache_write_tokens,
                   sum(completion_tokens) AS completion_tokens,
                   -- one currency per run when every model is priced in it, else NULL cost
                   CASE WHEN count(DISTINCT currency) = 1 AND count(currency) = count(*)
                        THEN any_value(currency) END AS currency,
                   bool_or(shadow) AS shadow,
                   string_agg(DISTINCT price_source, '; ') AS price_source,
                   CASE WHEN count(DISTINCT currency) = 1 AND count(currency) = count(*)
                        THEN sum(cost_without_cache) END AS cost_without_cache,
                   CASE WHEN count(DISTINCT currency) = 1 AND count(currency) = count(*)
                        THEN sum(cost_with_cache) END AS cost_with_cache
            FROM costed GROUP BY run_id
        )
        SELECT r.run_id, r.label, r.kind, r.created_unix_s, r.params_json, p.model,
               p.first_ts_unix_s, p.last_ts_unix_s,
               coalesce(p.requests, 0) AS requests, p.prompt_tokens, p.cached_tokens,
               p.cache_write_tokens, p.completion_tokens,
               CAST(p.cached_tokens AS DOUBLE) / NULLIF(p.reported_prompt_tokens, 0) AS hit_rate,
               p.currency, p.shadow, p.price_source,
               CAST(p.cost_without_cache AS DOUBLE) AS cost_without_cache,
               CAST(p.cost_with_cache AS DOUBLE) AS cost_with_cache,
               CAST(p.cost_without_cache - p.cost_with_cache AS DOUBLE) AS saved
        FROM runs r LEFT JOIN per_run p ON p.run_id = r.run_id
        WHERE {" AND ".join(where)}
        ORDER BY r.created_unix_s DESC NULLS LAST, r.run_id
    """
    return con.execute(sql, [price_as, *params]).df()


def replay_run_windows(con: duckdb.DuckDBPyConnection, *, run_ids: Sequence[str],
                       window_s: float = 300.0) -> pd.DataFrame:
    """Hit rate per window of *run time* (seconds since each run's first request), per run, so
    runs placed at different times line up.

    Returns:
        Columns ``run_id, window_start_s`` (seconds since the run's first request),
        ``window_end_s``, ``requests``, ``prompt_tokens``, ``cached_tokens`` (tokens),
        ``hit_rate`` (fraction or NULL). Ordered by run, then window.

    Raises:
        InvalidArgument: ``window_s`` is not positive.
    """
    if not window_s or window_s <= 0:
        raise InvalidArgument(f"window_s must be positive, got {window_s}")
    # Run time starts at 0 for each run: windows aligned to origin 0 of rel_s.
    window_start, window_params = window_start_sql("rel_s", window_s=window_s)
    sql = f"""
        WITH q AS (
            SELECT run_id, ts_unix_s - min(ts_unix_s) OVER (PARTITION BY run_id) AS rel_s,
                   prompt_tokens, cached_tokens
            FROM requests
            WHERE list_contains(?::VARCHAR[], run_id) AND ts_unix_s IS NOT NULL
        )
        SELECT run_id, {window_start} AS window_start_s,
               {window_start} + ? AS window_end_s,
               count(*) AS requests, sum(prompt_tokens) AS prompt_tokens,
               sum(cached_tokens) AS cached_tokens,
               CAST(sum(cached_tokens) AS DOUBLE)
                   / NULLIF(sum(CASE WHEN cached_tokens IS NOT NULL THEN prompt_tokens END), 0)
                   AS hit_rate
        FROM q GROUP BY ALL ORDER BY run_id, window_start_s
    """
    return con.execute(sql, [[str(r) for r in run_ids], *window_params, *window_params,
                             float(window_s)]).df()


def insert_run(con: duckdb.DuckDBPyConnection, *, run_id: str, kind: str, label: str | None,
               created_unix_s: float | None, params: Mapping[str, Any] | None,
               source_id: str | None = None) -> bool:
    """Insert one ``runs`` row; an existing ``run_id`` is kept unchanged (safe to run twice).

    ``params`` is stored as sorted-key JSON text (``params_json``). Runs inside the caller's
    transaction. Returns True when the row was added.
    """
    before = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    con.execute(
        "INSERT INTO runs (run_id, kind, label, created_unix_s, params_json, source_id) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
        [run_id, kind, label, created_unix_s,
         None if params is None else json.dumps(dict(params), sort_keys=True, default=str),
         source_id])
    return before == 0


def run_list(con: duckdb.DuckDBPyConnection, *, kinds: Sequence[str] | None = None,
             with_decisions: bool = False) -> pd.DataFrame:
    """Every stored run for a run picker, newest first (``created_unix_s`` descending, runs
    without a creation time last, then by run id).

    Args:
        kinds: only these kinds (``replay-sim``, ``replay-live``, ``capture``...); None = all.
        with_decisions: only runs with gateway decisions (the Scopes, Rejections and
            Invariants pages), including decision runs without a ``runs`` row and the
            production run when its decisions are all archived.

    Returns:
        Columns ``run_id, kind, label, created_unix_s`` (kind/label NULL for a decision run
        without a ``runs`` row); with ``with_decisions`` also ``first_ts_unix_s`` and
        ``last_ts_unix_s``, the span of the run's decisions (Unix s; archived days from their
        UTC day's start / end).
    """
    where, params = ["TRUE"], []
    if kinds is not None:
        where.append("list_contains(?::VARCHAR[], kind)")
        params.append([str(k) for k in kinds])
    base = "SELECT run_id, kind, label, created_unix_s FROM runs"
    if with_decisions:
        from prefixscope.store.queries import archive

        decided = "SELECT run_id, ts_unix_s FROM gateway_decisions"
        if archive.archived_rows(con, "gateway_decisions"):  # production decisions archived
            decided += (" UNION ALL SELECT '', max(epoch(day::TIMESTAMP)) + 86400 FROM "
                        "archive_parts WHERE tbl = 'gateway_decisions'"
                        " UNION ALL SELECT '', min(epoch(day::TIMESTAMP)) FROM "
                        "archive_parts WHERE tbl = 'gateway_decisions'")
        base = ("SELECT d.run_id, r.kind, r.label, coalesce(r.created_unix_s, d.last_ts) AS "
                "created_unix_s, d.first_ts AS first_ts_unix_s, d.last_ts AS last_ts_unix_s "
                "FROM (SELECT run_id, min(ts_unix_s) AS first_ts, max(ts_unix_s) AS last_ts "
                f"FROM ({decided}) GROUP BY run_id) d LEFT JOIN runs r USING (run_id)")
    return con.execute(
        f"SELECT * FROM ({base}) WHERE {' AND '.join(where)} "
        "ORDER BY created_unix_s DESC NULLS LAST, run_id", params).df()


def unknown_run_ids(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> list[str]:
    """The ids of ``run_ids`` that no stored row belongs to: not in ``runs``, and no request,
    metric series or gateway decision carries them (``''``, production traffic, is always
    known). Order as given.

    One indexed lookup per id in ``runs``; only an id missing there is looked for in the data
    tables (``requests``, ``metric_series_head``, ``gateway_decisions``; first match stops).
    """
    unknown = []
    for run_id in dict.fromkeys(str(r) for r in run_ids):
        if run_id == "":
            continue
        found = con.execute(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = $r) "
            "OR EXISTS (SELECT 1 FROM requests WHERE run_id = $r) "
            "OR EXISTS (SELECT 1 FROM metric_series_head WHERE run_id = $r) "
            "OR EXISTS (SELECT 1 FROM gateway_decisions WHERE run_id = $r)",
            {"r": run_id}).fetchone()[0]
        if not found:
            unknown.append(run_id)
    return unknown
