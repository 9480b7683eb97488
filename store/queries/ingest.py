"""Queries on ingest bookkeeping: sources, runs, quarantine, table sizes."""

from __future__ import annotations

import duckdb
import pandas as pd


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
