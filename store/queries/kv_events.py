"""Queries on vLLM KV-cache events: the set of cached block hashes, event counts per window.

Event order: ``(batch_ts_unix_s, seq, event_index, hash_index)``. Within one publisher run the
sequence number orders batches; the batch time orders publisher runs (a restarted vLLM counts
seq from 0 again). A **clear point** is an ``AllBlocksCleared`` event, or the first batch of a
new publisher run (a batch whose seq is lower than the previous batch's: the restarted engine
starts with an empty cache and sends no AllBlocksCleared).

Events rebuild the *set* of cached hashes (vLLM 0.33 ``vllm/distributed/kv_events.py``;
``vllm-prefix-cache.md`` section 9), not reference counts or LRU order. Duplicate-hash blocks
(several physical blocks with one hash, e.g. after skip-read requests) are counted: a hash stays
cached until it was removed as often as it was stored. A removal of a hash whose store was never
seen (ingest started mid-stream) is ignored rather than counted below zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pandas as pd

from prefixscope.core.errors import InvalidArgument
from prefixscope.store.sqlhelpers import window_start_sql

#: Column order of rows given to :func:`insert_kv_event_rows`.
KV_EVENT_COLUMNS: tuple[str, ...] = (
    "instance", "dp_rank", "seq", "batch_ts_unix_s", "event_index", "hash_index", "event_type",
    "block_hash", "parent_block_hash", "num_tokens", "block_size", "medium", "lora_name",
    "group_idx", "has_extra_keys", "topic", "received_from", "source_id",
)
_DTYPES = {
    "instance": object, "dp_rank": "int32", "seq": "int64", "batch_ts_unix_s": "float64",
    "event_index": "int32", "hash_index": "int32", "event_type": object,
    "block_hash": "UInt64", "parent_block_hash": "UInt64", "num_tokens": "Int32",
    "block_size": "Int32", "medium": object, "lora_name": object, "group_idx": "Int32",
    "has_extra_keys": "boolean", "topic": object, "received_from": object, "source_id": object,
}


def insert_kv_event_rows(con: duckdb.DuckDBPyConnection, rows: Sequence[tuple]) -> int:
    """Insert event rows (tuples in :data:`KV_EVENT_COLUMNS` order); rows whose key already
    exists (a replayed batch) are skipped. Runs inside the caller's transaction.

    Returns:
        The number of rows added.
    """
    if not rows:
        return 0
    # column by column from the Python values: a hash column must never pass through float64
    # (hashes are 64-bit; a float keeps 53 bits)
    columns = list(zip(*rows))
    df = pd.DataFrame({name: pd.array(list(values), dtype=_DTYPES[name])
                       for name, values in zip(KV_EVENT_COLUMNS, columns)})
    cols = ", ".join(KV_EVENT_COLUMNS)
    con.register("_prefixscope_kv_in", df)
    try:
        added = con.execute(
            f"INSERT INTO kv_events ({cols}) SELECT {cols} FROM _prefixscope_kv_in "
            "ON CONFLICT DO NOTHING").fetchone()[0]
    finally:
        con.unregister("_prefixscope_kv_in")
    return int(added)


def _ordered_events_cte(until_seq: int | None, until_ts_unix_s: float | None) -> tuple[str, list]:
    where = ""
    params: list = []
    if until_seq is not None:
        where += " AND seq <= ?"
        params.append(int(until_seq))
    if until_ts_unix_s is not None:
        where += " AND batch_ts_unix_s <= ?"
        params.append(float(until_ts_unix_s))
    sql = f"""
        ev AS (
            SELECT seq, batch_ts_unix_s, event_type, block_hash,
                   row_number() OVER (ORDER BY batch_ts_unix_s, seq, event_index, hash_index) AS pos
            FROM kv_events
            WHERE instance = ?{where}
        ),
        batches AS (
            SELECT batch_ts_unix_s, seq, min(pos) AS first_pos,
                   lag(seq) OVER (ORDER BY batch_ts_unix_s, seq) AS prev_seq
            FROM ev GROUP BY batch_ts_unix_s, seq
        ),
        clear_points AS (
            SELECT pos AS p FROM ev WHERE event_type = 'AllBlocksCleared'
            UNION ALL
            SELECT first_pos - 1 FROM batches WHERE seq < prev_seq
        ),
        last_clear AS (SELECT coalesce(max(p), 0) AS p FROM clear_points)"""
    return sql, params


def cached_block_set(con: duckdb.DuckDBPyConnection, *, instance: str,
                     until_seq: int | None = None,
                     until_ts_unix_s: float | None = None) -> set[int]:
    """The block hashes cached on ``instance`` after its stored events, rebuilt from
    BlockStored / BlockRemoved / AllBlocksCleared (rules in the module docstring).

    Args:
        instance: publisher name as stored.
        until_seq: only events of batches with ``seq <= until_seq`` (meant for one publisher
            run; seq restarts at 0 when vLLM restarts).
        until_ts_unix_s: only batches with ``ts <= until_ts_unix_s`` (engine clock, seconds).

    Returns:
        The set of cached 64-bit block hashes (Python ints in [0, 2^64)).

    Formula: after the last clear point, per hash with stores s and removals r in event order,
    the count is the running sum of +1/-1 floored at 0 after each step, which equals
    ``P_N - min(0, min_k P_k)`` for the unfloored prefix sums ``P_k``; cached iff > 0.
    """
    cte, params = _ordered_events_cte(until_seq, until_ts_unix_s)
    sql = f"""
        WITH {cte},
        deltas AS (
            SELECT block_hash, pos,
                   CASE WHEN event_type = 'BlockStored' THEN 1 ELSE -1 END AS delta
            FROM ev, last_clear
            WHERE ev.pos > last_clear.p AND block_hash IS NOT NULL
        ),
        running AS (
            SELECT block_hash, delta,
                   sum(delta) OVER (PARTITION BY block_hash ORDER BY pos) AS prefix
            FROM deltas
        )
        SELECT block_hash FROM running
        GROUP BY block_hash
        HAVING sum(delta) - least(0, min(prefix)) > 0
    """
    return {int(r[0]) for r in con.execute(sql, [instance, *params]).fetchall()}


def kv_event_counts_by_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                              end_s: float | None = None, window_s: float = 3600,
                              instances: Sequence[str] | None = None,
                              origin_s: float = 0.0) -> pd.DataFrame:
    """KV events per window, instance and event type (by batch time).

    Returns:
        DataFrame ``window_start_s, window_end_s, instance, event_type, events`` (events, an
        AllBlocksCleared counts 1), ``block_hashes`` (hashes stored or removed; 0 for clears),
        ``batches`` (distinct batches), ordered by window, instance, event type.

    Raises:
        InvalidArgument: ``window_s <= 0``.
    """
    if window_s <= 0:
        raise InvalidArgument("window_s must be > 0")
    where = ""
    params: list = []
    if start_s is not None:
        where += " AND batch_ts_unix_s >= ?"
        params.append(float(start_s))
    if end_s is not None:
        where += " AND batch_ts_unix_s < ?"
        params.append(float(end_s))
    if instances is not None:
        where += " AND list_contains(?::VARCHAR[], instance)"
        params.append(list(instances))
    window_start, window_params = window_start_sql("batch_ts_unix_s", window_s=window_s,
                                                   origin_s=origin_s)
    sql = f"""
        WITH win AS (
            SELECT {window_start} AS window_start_s, instance,
                   event_type, dp_rank, seq, batch_ts_unix_s, event_index, block_hash
            FROM kv_events WHERE TRUE{where}
        )
        SELECT window_start_s, window_start_s + ? AS window_end_s, instance, event_type,
               count(DISTINCT (dp_rank, seq, batch_ts_unix_s, event_index)) AS events,
               count(block_hash) AS block_hashes,
               count(DISTINCT (dp_rank, seq, batch_ts_unix_s)) AS batches
        FROM win
        GROUP BY ALL
        ORDER BY window_start_s, instance, event_type
    """
    return con.execute(sql, [*window_params, *params, float(window_s)]).df()


def kv_event_instances(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Publishers with stored events.

    Returns:
        DataFrame ``instance, batches, first_ts_unix_s, last_ts_unix_s, max_seq``, by instance.
    """
    return con.execute(
        "SELECT instance, count(DISTINCT (dp_rank, seq, batch_ts_unix_s)) AS batches, "
        "min(batch_ts_unix_s) AS first_ts_unix_s, max(batch_ts_unix_s) AS last_ts_unix_s, "
        "max(seq) AS max_seq FROM kv_events GROUP BY instance ORDER BY instance").df()
