"""Queries on ingest bookkeeping: sources, runs, quarantine, table sizes.

Writers (:func:`ingest_transaction`, :func:`source_checkpoint`, :func:`upsert_ingest_source`,
:func:`insert_quarantine`, :func:`insert_ingest_run`) run inside the caller's transaction (the first
opens and ends it); the rules they serve are in
``ingest/bookkeeping.py`` and the JSONL tail driver ``ingest/jsonl_driver.py``. Tables:
``ingest_sources``, ``ingest_runs``, ``quarantine`` (``docs/schema.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import duckdb

from prefixscope.store.sqlhelpers import insert_rows_bulk

if TYPE_CHECKING:  # DataFrames come from DuckDB's .df(); writers need no pandas import
    import pandas as pd

#: Column order of the rows given to :func:`insert_quarantine`.
QUARANTINE_COLUMNS: tuple[str, ...] = (
    "source_id", "location", "line", "field", "reason", "ingest_run_id", "at_unix_s")


@contextlib.contextmanager
def ingest_transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """One ingest batch's transaction: ``BEGIN``; ``COMMIT`` when the block ends, ``ROLLBACK``
    (then re-raise) when it raises anything, so none of the batch's writes are kept.

    Raises:
        duckdb.TransactionException: ``con`` is already inside a transaction.
    """
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        # a COMMIT that failed (a full disk) has ended the transaction already: the first
        # error is the one raised, never "cannot rollback - no transaction is active"
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def source_checkpoint(con: duckdb.DuckDBPyConnection, source_id: str
                      ) -> tuple[int, int, str | None] | None:
    """A source's stored checkpoint: ``(offset bytes, lines read, fingerprint hex or None)``.

    Returns None when the source was never ingested or has no checkpoint (URL sources).
    """
    row = con.execute(
        "SELECT checkpoint_offset, checkpoint_line, fingerprint FROM ingest_sources "
        "WHERE source_id = ?", [source_id]).fetchone()
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1] or 0), row[2]


def upsert_ingest_source(con: duckdb.DuckDBPyConnection, *, source_id: str, kind: str,
                         location: str, rows_added: int, checkpoint_offset: int | None,
                         checkpoint_line: int | None, fingerprint: str | None,
                         note: str | None, now_unix_s: float) -> None:
    """Create or update one ``ingest_sources`` row.

    A new row gets ``first_ingest_unix_s = last_ingest_unix_s = now_unix_s``. An existing row
    adds ``rows_added`` to its total, sets ``last_ingest_unix_s``, and takes the checkpoint
    (``checkpoint_offset`` bytes, ``checkpoint_line`` lines), ``fingerprint`` and ``note``
    only where they are not None (None keeps the stored value). Runs inside the caller's
    transaction.
    """
    con.execute(
        """
        INSERT INTO ingest_sources (source_id, kind, location, checkpoint_offset, checkpoint_line,
            fingerprint, rows_added, first_ingest_unix_s, last_ingest_unix_s, note)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (source_id) DO UPDATE SET
            checkpoint_offset = COALESCE(excluded.checkpoint_offset, ingest_sources.checkpoint_offset),
            checkpoint_line = COALESCE(excluded.checkpoint_line, ingest_sources.checkpoint_line),
            fingerprint = COALESCE(excluded.fingerprint, ingest_sources.fingerprint),
            rows_added = ingest_sources.rows_added + excluded.rows_added,
            last_ingest_unix_s = excluded.last_ingest_unix_s,
            note = COALESCE(excluded.note, ingest_sources.note)
        """,
        [source_id, kind, location, checkpoint_offset, checkpoint_line, fingerprint,
         rows_added, now_unix_s, now_unix_s, note])


def insert_quarantine(con: duckdb.DuckDBPyConnection, rows: Sequence[Sequence[object]]) -> None:
    """Insert quarantine entries (tuples in :data:`QUARANTINE_COLUMNS` order: source_id,
    location, line (1-based, 0 = no lines), field, reason, ingest_run_id, at_unix_s). A
    ``(source_id, line)`` already quarantined keeps its first entry. Runs inside the caller's
    transaction."""
    if not rows:
        return
    # one entry per (source_id, line) within the batch too (a bulk INSERT would refuse the
    # repeat); the first wins, as across batches
    seen: set[tuple] = set()
    unique = []
    for r in rows:
        key = (r[0], r[2])
        if key not in seen:
            seen.add(key)
            unique.append(tuple(r))
    insert_rows_bulk(con, "quarantine", QUARANTINE_COLUMNS, unique,
                     conflict="ON CONFLICT (source_id, line) DO NOTHING")


def insert_ingest_run(con: duckdb.DuckDBPyConnection, *, ingest_run_id: str, source_id: str,
                      kind: str, started_unix_s: float, finished_unix_s: float, rows_read: int,
                      rows_added: int, rows_duplicate: int, rows_quarantined: int, status: str,
                      message: str | None) -> None:
    """Insert one ``ingest_runs`` row (``status``: ``ok``, ``partial`` or ``failed``; times in
    Unix seconds; counts in rows). Raises ``duckdb.ConstraintException`` when
    ``ingest_run_id`` exists. Runs inside the caller's transaction, if any."""
    con.execute(
        "INSERT INTO ingest_runs (ingest_run_id, source_id, kind, started_unix_s, "
        "finished_unix_s, rows_read, rows_added, rows_duplicate, rows_quarantined, status, "
        "message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [ingest_run_id, source_id, kind, started_unix_s, finished_unix_s, rows_read,
         rows_added, rows_duplicate, rows_quarantined, status, message])


def table_row_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Rows per base table of the main schema, by table name (ascending)."""
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = 'main' AND table_type = 'BASE TABLE' ORDER BY table_name").fetchall()]
    counts: dict[str, int] = {}
    for t in tables:
        quoted = '"' + t.replace('"', '""') + '"'
        counts[t] = int(con.execute(f"SELECT count(*) FROM {quoted}").fetchone()[0])
    return counts


def quarantined_lines(con: duckdb.DuckDBPyConnection, *, limit: int = 1000) -> pd.DataFrame:
    """Quarantined input lines, newest first.

    Columns: location (file or URL), line (1-based), field, reason, at_unix_s.
    """
    return con.execute(
        "SELECT location, line, field, reason, at_unix_s FROM quarantine "
        "ORDER BY at_unix_s DESC, location, line LIMIT ?", [limit]).df()


def ingest_sources(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every ingested source, most recently ingested first (the dashboard's Data sources page).

    Columns: source_id, kind, location (file or URL), rows_added (rows written, all batches),
    checkpoint_line (lines read so far; NULL for URLs), first_ingest_unix_s, last_ingest_unix_s
    (Unix s), note (e.g. the legacy-name notice; NULL when none).
    """
    return con.execute(
        "SELECT source_id, kind, location, rows_added, checkpoint_line, first_ingest_unix_s, "
        "last_ingest_unix_s, note FROM ingest_sources "
        "ORDER BY last_ingest_unix_s DESC NULLS LAST, location").df()
