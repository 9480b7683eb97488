"""Ingest bookkeeping: source ids, checkpoints, ingest runs and the quarantine.

Every ingester uses these so that the rules hold for all sources:

1. A source is identified by ``kind`` and its resolved location (absolute path or URL without
   credentials): :func:`source_id_for`.
2. Rows, quarantine entries and the new checkpoint of one batch are written in **one**
   transaction by the caller (``BEGIN`` ... ``COMMIT``), so a crash loses nothing and repeats
   nothing; tables' primary keys make a repeated batch add no rows.
3. A file is read again from its checkpoint when its first 4 KiB still match the recorded
   fingerprint and it has not shrunk; otherwise from the start (primary keys de-duplicate).
4. A quarantine entry names file, line, field and reason, never the offending prompt text.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import duckdb

FINGERPRINT_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A record that could not be ingested.

    Attributes:
        location: file path or URL.
        line: 1-based line number (0 when the source has no lines).
        reason: short reason; never prompt text or a tenant id.
        field: JSON path or metric/label name at fault, if known.
    """

    location: str
    line: int
    reason: str
    field: str | None = None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a file source was read up to: byte offset and line count, and its fingerprint."""

    offset: int
    line: int
    fingerprint: str | None


@dataclass(frozen=True, slots=True)
class IngestSummary:
    """Outcome of ingesting one source (what the CLI prints and ``--json`` returns).

    Attributes:
        source: location as given.
        kind: source kind.
        rows_read: records parsed (good ones).
        rows_added: rows newly written (re-ingesting adds 0).
        rows_duplicate: parsed rows already present.
        rows_quarantined: records set aside with a reason.
        note: e.g. the legacy-name notice, or why nothing could be read.
    """

    source: str
    kind: str
    rows_read: int
    rows_added: int
    rows_duplicate: int
    rows_quarantined: int
    note: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The summary as a JSON-ready dict."""
        return {
            "source": self.source, "kind": self.kind, "rows_read": self.rows_read,
            "rows_added": self.rows_added, "rows_duplicate": self.rows_duplicate,
            "rows_quarantined": self.rows_quarantined, "note": self.note,
        }


def clean_location(location: str) -> str:
    """Absolute path for a file; for a URL, the URL without user:password."""
    if "://" in location:
        parts = urlsplit(location)
        netloc = parts.hostname or ""
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    return str(Path(location).resolve())


def source_id_for(kind: str, location: str) -> str:
    """Stable source id: ``kind:`` + :func:`clean_location`."""
    return f"{kind}:{clean_location(location)}"


def get_checkpoint(con: duckdb.DuckDBPyConnection, source_id: str) -> Checkpoint | None:
    """The stored checkpoint of a source, or None if never ingested."""
    row = con.execute(
        "SELECT checkpoint_offset, checkpoint_line, fingerprint FROM ingest_sources "
        "WHERE source_id = ?", [source_id]).fetchone()
    if row is None or row[0] is None:
        return None
    return Checkpoint(int(row[0]), int(row[1] or 0), row[2])


def resume_offset(con: duckdb.DuckDBPyConnection, source_id: str,
                  path: str | os.PathLike[str]) -> Checkpoint:
    """Where to resume reading ``path``: its checkpoint if the file still starts with the same
    bytes (see :func:`fingerprint_upto`) and is not shorter, else the start (offset 0, line 0)."""
    cp = get_checkpoint(con, source_id)
    start = Checkpoint(0, 0, None)
    if cp is None or cp.offset == 0:
        return start
    try:
        if os.path.getsize(path) < cp.offset or fingerprint_upto(path, cp.offset) != cp.fingerprint:
            return start
    except OSError:
        return start
    return cp


def fingerprint_upto(path: str | os.PathLike[str], offset: int) -> str:
    """Fingerprint to store with a checkpoint at ``offset``: SHA-256 of the first
    ``min(offset, 4 KiB)`` bytes."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read(min(offset, FINGERPRINT_BYTES))).hexdigest()


def upsert_source(con: duckdb.DuckDBPyConnection, *, source_id: str, kind: str, location: str,
                  rows_added: int, checkpoint: Checkpoint | None = None,
                  note: str | None = None) -> None:
    """Create or update a source's row: adds ``rows_added``, sets the checkpoint and note.
    Runs inside the caller's transaction."""
    now = time.time()
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
        [source_id, kind, clean_location(location),
         checkpoint.offset if checkpoint else None, checkpoint.line if checkpoint else None,
         checkpoint.fingerprint if checkpoint else None, rows_added, now, now, note])


def record_quarantine(con: duckdb.DuckDBPyConnection, *, source_id: str, ingest_run_id: str,
                      entries: list[Quarantined]) -> int:
    """Store quarantine entries (a line already quarantined is kept once). Returns the count
    given. Runs inside the caller's transaction."""
    if not entries:
        return 0
    now = time.time()
    con.executemany(
        "INSERT INTO quarantine (source_id, location, line, field, reason, ingest_run_id, at_unix_s) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (source_id, line) DO NOTHING",
        [[source_id, clean_location(q.location), q.line, q.field, q.reason[:500], ingest_run_id, now]
         for q in entries])
    return len(entries)


def record_run(con: duckdb.DuckDBPyConnection, *, source_id: str, kind: str,
               started_unix_s: float, summary: IngestSummary, status: str,
               ingest_run_id: str | None = None) -> str:
    """Record one ingest run (status ``ok``, ``partial`` or ``failed``); returns its id."""
    run_id = ingest_run_id or uuid.uuid4().hex
    con.execute(
        "INSERT INTO ingest_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [run_id, source_id, kind, started_unix_s, time.time(), summary.rows_read,
         summary.rows_added, summary.rows_duplicate, summary.rows_quarantined, status,
         summary.note])
    return run_id


def new_ingest_run_id() -> str:
    """A fresh ingest run id (hex)."""
    return uuid.uuid4().hex
