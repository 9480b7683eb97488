"""Queries for live replay runs: the ``runs`` row and the run-scoped counter deltas.

Tables: ``runs`` (kind ``replay-live``) and ``live_run_counters`` (migration 7,
``docs/schema.md``). Written by :mod:`prefixscope.cli.commands.replay_live` after the per-request
usage JSONL and the two ``/metrics`` expositions went through the ordinary ingest path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pandas as pd

from prefixscope.store.queries.replay import insert_run


def save_live_run(con: duckdb.DuckDBPyConnection, *, run_id: str, label: str | None,
                  created_unix_s: float, params: Mapping[str, Any], instance: str,
                  before: Mapping[str, float], after: Mapping[str, float],
                  deltas: Mapping[str, float], before_ts_unix_s: float, after_ts_unix_s: float,
                  settled: bool) -> int:
    """Record one live replay run and its counter deltas, in one transaction.

    Safe to run twice: the run row is written by :func:`prefixscope.store.queries.replay.insert_run` (the
    one writer of ``runs``; an existing row is kept, and a run directory's ``run.json`` is
    written once, so a second ingest has the same values) and the instance's counter rows are
    replaced.

    Args:
        con: read-write connection, not inside a transaction.
        run_id: the run id (also the ``run_id`` of its ``requests`` rows).
        label: free text shown in run lists, or None.
        created_unix_s: run start, Unix seconds.
        params: the replay parameters (stored as JSON in ``runs.params_json``).
        instance: the server's scrape instance (host:port).
        before, after: counter totals (summed over series) in the before/after scrapes.
        deltas: run-scoped increase per counter (see ``prefixscope.replay.live_metrics.counter_deltas``).
        before_ts_unix_s, after_ts_unix_s: scrape times, Unix seconds.
        settled: the queries counter caught up with the run's prompt tokens before the after
            scrape.

    Returns:
        The number of counter rows written.
    """
    rows = [
        (run_id, instance, metric, before.get(metric), after.get(metric), float(delta),
         before_ts_unix_s, after_ts_unix_s, bool(settled))
        for metric, delta in sorted(deltas.items())
    ]
    con.execute("BEGIN TRANSACTION")
    try:
        insert_run(con, run_id=run_id, kind="replay-live", label=label,
                   created_unix_s=created_unix_s, params=params)
        con.execute("DELETE FROM live_run_counters WHERE run_id = ? AND instance = ?",
                    [run_id, instance])
        if rows:
            con.executemany("INSERT INTO live_run_counters VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return len(rows)


def live_run_counters(con: duckdb.DuckDBPyConnection, *,
                      run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Counter deltas of live replay runs, one row per (run, instance, counter).

    Columns: run_id, instance, metric, before_value, after_value, delta (tokens for the
    prefix-cache and token counters), before_ts_unix_s, after_ts_unix_s, settled. Ordered by
    run_id, instance, metric.
    """
    sql = ("SELECT run_id, instance, metric, before_value, after_value, delta, before_ts_unix_s, "
           "after_ts_unix_s, settled FROM live_run_counters")
    params: list[Any] = []
    if run_ids is not None:
        sql += " WHERE list_contains(?, run_id)"
        params.append(list(run_ids))
    return con.execute(sql + " ORDER BY run_id, instance, metric", params).df()


def live_run_summary(con: duckdb.DuckDBPyConnection, *,
                     run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Per live run: usage sums next to the counter deltas (the run's consistency check).

    Columns: run_id, label, created_unix_s, requests, prompt_tokens (Σ usage.prompt_tokens),
    cached_tokens (Σ cached_tokens of requests that reported it), counter_queries
    (Δ vllm:prefix_cache_queries_total), counter_hits (Δ vllm:prefix_cache_hits_total),
    hit_rate (= cached_tokens / prompt_tokens of reporting requests, NULL when none),
    counter_hit_rate (= counter_hits / counter_queries, NULL when 0), settled.
    Ordered by created_unix_s.
    """
    sql = """
        WITH r AS (
            SELECT run_id, count(*) AS requests, sum(prompt_tokens) AS prompt_tokens,
                   sum(cached_tokens) AS cached_tokens,
                   sum(CASE WHEN cached_tokens IS NOT NULL THEN prompt_tokens END) AS reported_prompt
            FROM requests GROUP BY run_id
        ), c AS (
            SELECT run_id,
                   sum(CASE WHEN metric = 'vllm:prefix_cache_queries_total' THEN delta END) AS q,
                   sum(CASE WHEN metric = 'vllm:prefix_cache_hits_total' THEN delta END) AS h,
                   bool_and(settled) AS settled
            FROM live_run_counters GROUP BY run_id
        )
        SELECT runs.run_id, runs.label, runs.created_unix_s, coalesce(r.requests, 0) AS requests,
               r.prompt_tokens, r.cached_tokens, c.q AS counter_queries, c.h AS counter_hits,
               r.cached_tokens / nullif(r.reported_prompt, 0) AS hit_rate,
               c.h / nullif(c.q, 0) AS counter_hit_rate, c.settled
        FROM runs LEFT JOIN r USING (run_id) LEFT JOIN c USING (run_id)
        WHERE runs.kind = 'replay-live'
    """
    params: list[Any] = []
    if run_ids is not None:
        sql += " AND list_contains(?, runs.run_id)"
        params.append(list(run_ids))
    return con.execute(sql + " ORDER BY runs.created_unix_s, runs.run_id", params).df()
