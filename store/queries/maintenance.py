"""Rebuild the rollup tables from the stored rows (``prefixscope db rebuild-rollups``).

The rollups (``request_rollup_1m``, ``latency_rollup_1d``, ``counter_rollup_5m``,
``scope_rollup_5m``) are maintained by the ingest transactions that write the rows; rows
written with SQL, or a migration that could not refill a rollup from archived days (migration
78: the latency bands), leave one stale, and the pages then read the raw rows (same answers,
slower). Rebuilding reads the table and, for archived days, their Parquet files.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from prefixscope.store.queries import metrics, requests, scope_rollup
from prefixscope.store.queries.ingest import ingest_transaction


@dataclass(frozen=True)
class RollupState:
    """One rollup table: ``rows`` written by the rebuild (None: not rebuilt), and whether the
    queries read it (``current``) before and after."""

    table: str
    current_before: bool
    current_after: bool
    rows: int | None


def rollup_states(con: duckdb.DuckDBPyConnection) -> dict[str, bool]:
    """``{table: current}`` for the four rollup tables: True when the queries read the table
    (it counts every stored row), False when they read the raw rows."""
    return {"request_rollup_1m": requests.rollup_current(con),
            "latency_rollup_1d": requests.latency_rollup_current(con),
            "counter_rollup_5m": metrics.counter_rollup_current(con),
            "scope_rollup_5m": scope_rollup.current(con)}


def rebuild_rollups(con: duckdb.DuckDBPyConnection, *, only_stale: bool = False
                    ) -> list[RollupState]:
    """Rebuild the rollup tables from every stored row, in one transaction (all or none).

    Args:
        con: a writer connection, not inside a transaction.
        only_stale: rebuild only the tables whose queries read raw rows today.

    Returns:
        One :class:`RollupState` per table, in the order ``request_rollup_1m``,
        ``latency_rollup_1d`` (it is checked against the first), ``counter_rollup_5m``,
        ``scope_rollup_5m``.

    Raises:
        duckdb.TransactionException: ``con`` is already inside a transaction.
    """
    before = rollup_states(con)
    steps = (("request_rollup_1m", requests.rebuild_request_rollup),
             ("latency_rollup_1d", requests.rebuild_latency_rollup),
             ("counter_rollup_5m", metrics.rebuild_counter_rollup),
             ("scope_rollup_5m", scope_rollup.rebuild))
    written: dict[str, int | None] = {}
    with ingest_transaction(con):
        for table, rebuild in steps:
            stale = not before[table] or (table == "latency_rollup_1d"
                                          and written.get("request_rollup_1m") is not None)
            written[table] = rebuild(con) if (stale or not only_stale) else None
    after = rollup_states(con)
    return [RollupState(t, before[t], after[t], written[t]) for t, _ in steps]
