"""Writes of the gateway decision log: rows into ``gateway_decisions`` and ``gateway_events``.

Rows come from ``ingest/decisions.py`` (one per decision or version event line, format in
``docs/scopes.md#decision-log``); the reads are in :mod:`prefixscope.store.queries.scopes`. Keys:
``gateway_decisions (run_id, request_id)``, ``gateway_events (event_id)``; a row whose key
exists is skipped, so ingesting a log twice adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from prefixscope.core.identity import IDENTITY_FIELDS
from prefixscope.store.sqlhelpers import insert_rows_bulk

#: The identity fields logged as short digests/integers (scope and namespace have own columns).
SHORT_FIELDS: tuple[str, ...] = tuple(f for f in IDENTITY_FIELDS if f not in ("scope", "namespace"))

#: Column order of the rows given to :func:`insert_decision_rows`.
DECISION_COLUMNS: tuple[str, ...] = (
    "run_id", "request_id", "source_id", "line", "ts_unix_s", "instance", "model", "scope",
    "namespace_digest", "decision", "first_mismatch", "reasons", "candidate_cached_tokens",
    "accepted_cached_tokens", "salt_applied",
    *SHORT_FIELDS,
    "candidate_request_id", "candidate_scope", "candidate_namespace_digest",
    *(f"candidate_{f}" for f in SHORT_FIELDS),
    "error", "client_salt_replaced", "candidate_tokens_basis", "bypass",
)

#: Column order of the rows given to :func:`insert_decision_rows` as ``events``.
EVENT_COLUMNS: tuple[str, ...] = (
    "event_id", "run_id", "source_id", "line", "ts_unix_s", "event", "namespace_digest",
    "new_value")


def decision_log_row_count(con: duckdb.DuckDBPyConnection) -> int:
    """Rows in ``gateway_decisions`` plus rows in ``gateway_events``."""
    return int(con.execute("SELECT (SELECT count(*) FROM gateway_decisions) + "
                           "(SELECT count(*) FROM gateway_events)").fetchall()[0][0])


def insert_decision_rows(con: duckdb.DuckDBPyConnection, decisions: Sequence[Sequence[object]],
                         events: Sequence[Sequence[object]]) -> int:
    """Insert decision rows (tuples in :data:`DECISION_COLUMNS` order) and event rows (tuples
    in :data:`EVENT_COLUMNS` order); rows whose key exists are skipped. The scope rollup
    (``scope_rollup_5m``) of the minutes the decisions touch is recomputed in the same
    transaction (:func:`prefixscope.store.queries.scope_rollup.refresh_for_decisions`). Runs
    inside the caller's transaction.

    Returns:
        Rows added (decisions + events).
    """
    if not decisions and not events:
        return 0
    before = decision_log_row_count(con)
    for table, columns, rows in (("gateway_decisions", DECISION_COLUMNS, decisions),
                                 ("gateway_events", EVENT_COLUMNS, events)):
        if rows:
            insert_rows_bulk(con, table, columns, rows)
    if decisions:
        import pyarrow as pa

        from prefixscope.store.queries import scope_rollup

        i_run, i_req, i_ts = (DECISION_COLUMNS.index(c)
                              for c in ("run_id", "request_id", "ts_unix_s"))
        _prefixscope_decision_keys = pa.table({  # noqa: F841 - read by DuckDB's replacement scan
            "run_id": pa.array([r[i_run] for r in decisions], pa.string()),
            "request_id": pa.array([r[i_req] for r in decisions], pa.string()),
            "ts_unix_s": pa.array([None if r[i_ts] is None else float(r[i_ts])
                                   for r in decisions], pa.float64())})
        con.execute("CREATE OR REPLACE TEMP TABLE _ps_decision_keys AS "
                    "SELECT * FROM _prefixscope_decision_keys")
        scope_rollup.refresh_for_decisions(con, "_ps_decision_keys")
        con.execute("DROP TABLE _ps_decision_keys").fetchall()
    return decision_log_row_count(con) - before
