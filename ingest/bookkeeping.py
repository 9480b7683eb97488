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

JSONL files are tailed by one driver that applies all four rules: ``ingest/jsonl_driver.py``.
The SQL behind these functions is in ``store/queries/ingest.py``.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

import duckdb

from prefixscope.store.queries.ingest import (
    insert_ingest_run,
    insert_quarantine,
    source_checkpoint,
    upsert_ingest_source,
)

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
class SourceOutcome:
    """One ingested source (a file, a scrape): its summary and the lines this call quarantined
    (file:line, field, reason). ``ScrapeOutcome`` in :mod:`prefixscope.ingest.exposition`."""

    summary: IngestSummary
    problems: tuple[Quarantined, ...] = ()


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
        rows_reinterpreted: ``ingest requests`` only: rows read whose usage was reinterpreted
            (cached tokens above prompt tokens: read as exclusive input, flag
            ``exclusive-input-suspected``); None for the other ingesters (then not in
            :meth:`as_dict`).
        rows_repeated_in_file: ``ingest kv-events FILE`` only: of ``rows_duplicate``, the rows
            of batches repeated within this read of the file (a replayed batch: same seq and
            time as an earlier line), not stored by an earlier ingest; None elsewhere.
    """

    source: str
    kind: str
    rows_read: int
    rows_added: int
    rows_duplicate: int
    rows_quarantined: int
    note: str | None = None
    rows_reinterpreted: int | None = None
    rows_repeated_in_file: int | None = None

    def as_dict(self) -> dict[str, object]:
        """The summary as a JSON-ready dict (``rows_reinterpreted``, ``rows_repeated_in_file``
        only when set)."""
        d: dict[str, object] = {
            "source": self.source, "kind": self.kind, "rows_read": self.rows_read,
            "rows_added": self.rows_added, "rows_duplicate": self.rows_duplicate,
            "rows_quarantined": self.rows_quarantined, "note": self.note,
        }
        if self.rows_reinterpreted is not None:
            d["rows_reinterpreted"] = self.rows_reinterpreted
        if self.rows_repeated_in_file is not None:
            d["rows_repeated_in_file"] = self.rows_repeated_in_file
        return d


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
    row = source_checkpoint(con, source_id)
    return None if row is None else Checkpoint(*row)


def resume_offset(con: duckdb.DuckDBPyConnection, source_id: str,
                  path: str | os.PathLike[str]) -> Checkpoint:
    """Where to resume reading ``path``: see :func:`resume_from` (the start when the file
    cannot be opened)."""
    try:
        with open(path, "rb") as fh:
            return resume_from(con, source_id, fh)
    except OSError:
        return Checkpoint(0, 0, None)


def resume_from(con: duckdb.DuckDBPyConnection, source_id: str, fh: BinaryIO) -> Checkpoint:
    """Where to resume reading the open file ``fh``: its stored checkpoint if the file still
    starts with the same bytes (:func:`fingerprint_of`) and is not shorter than the checkpoint's
    offset, else the start (offset 0, line 0: the file was truncated, rotated or replaced).

    Reading the handle that is then read on avoids a race with a rotation between check and
    read. The handle's position is not changed.
    """
    cp = get_checkpoint(con, source_id)
    start = Checkpoint(0, 0, None)
    if cp is None or cp.offset == 0:
        return start
    if os.fstat(fh.fileno()).st_size < cp.offset or fingerprint_of(fh, cp.offset) != cp.fingerprint:
        return start
    return cp


def fingerprint_upto(path: str | os.PathLike[str], offset: int) -> str:
    """Fingerprint to store with a checkpoint at ``offset``: SHA-256 (hex) of the first
    ``min(offset, 4 KiB)`` bytes."""
    with open(path, "rb") as fh:
        return fingerprint_of(fh, offset)


def fingerprint_of(fh: BinaryIO, offset: int) -> str:
    """As :func:`fingerprint_upto`, from an open binary file (its position is not changed)."""
    n = min(offset, FINGERPRINT_BYTES)
    return hashlib.sha256(os.pread(fh.fileno(), n, 0) if n else b"").hexdigest()


def upsert_source(con: duckdb.DuckDBPyConnection, *, source_id: str, kind: str, location: str,
                  rows_added: int, checkpoint: Checkpoint | None = None,
                  note: str | None = None) -> None:
    """Create or update a source's row: adds ``rows_added``, sets the checkpoint and note
    (None keeps the stored ones). Runs inside the caller's transaction."""
    upsert_ingest_source(
        con, source_id=source_id, kind=kind, location=clean_location(location),
        rows_added=rows_added,
        checkpoint_offset=checkpoint.offset if checkpoint else None,
        checkpoint_line=checkpoint.line if checkpoint else None,
        fingerprint=checkpoint.fingerprint if checkpoint else None,
        note=note, now_unix_s=time.time())


def record_quarantine(con: duckdb.DuckDBPyConnection, *, source_id: str, ingest_run_id: str,
                      entries: list[Quarantined]) -> int:
    """Store quarantine entries (a line already quarantined is kept once; reasons cut to 500
    characters). Returns the count given. Runs inside the caller's transaction."""
    if not entries:
        return 0
    now = time.time()
    insert_quarantine(con, [
        (source_id, clean_location(q.location), q.line, q.field, q.reason[:500], ingest_run_id,
         now) for q in entries])
    return len(entries)


def run_status(rows_read: int, rows_quarantined: int) -> str:
    """An ingest run's status: ``ok`` (nothing quarantined), ``partial`` (some rows read, some
    quarantined) or ``failed`` (only quarantined)."""
    if not rows_quarantined:
        return "ok"
    return "partial" if rows_read else "failed"


def record_run(con: duckdb.DuckDBPyConnection, *, source_id: str, kind: str,
               started_unix_s: float, summary: IngestSummary, status: str,
               ingest_run_id: str | None = None) -> str:
    """Record one ingest run (status ``ok``, ``partial`` or ``failed``); returns its id."""
    run_id = ingest_run_id or uuid.uuid4().hex
    insert_ingest_run(
        con, ingest_run_id=run_id, source_id=source_id, kind=kind,
        started_unix_s=started_unix_s, finished_unix_s=time.time(),
        rows_read=summary.rows_read, rows_added=summary.rows_added,
        rows_duplicate=summary.rows_duplicate, rows_quarantined=summary.rows_quarantined,
        status=status, message=summary.note)
    return run_id


def new_ingest_run_id() -> str:
    """A fresh ingest run id (hex)."""
    return uuid.uuid4().hex
