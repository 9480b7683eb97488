"""Files of JSON records (one request each) from other tools, into ``requests``.

Shared by the LiteLLM and Langfuse readers: a reader supplies ``to_row(record) -> row dict or
None`` (None = not a request, e.g. a span without usage; :class:`BadLine` = quarantine) and this
module reads the file in the form the tool exports:

- **JSON lines** (``.jsonl``, ``.ndjson``, or any file whose first byte is ``{`` followed by a
  newline-separated record per line): tailed from its checkpoint by
  ``ingest/jsonl_driver.py`` (one transaction per batch, quarantine, re-run adds nothing).
- **One JSON document**: an array of records, or an object with the records under ``data``
  (API responses, UI exports). Read whole, one transaction, ``line`` = the record's 1-based
  position; read again, primary keys add nothing.
- **CSV with a header row** (``.csv``: ``psql \\copy ... TO ... CSV HEADER`` of a table):
  streamed with the stdlib ``csv`` module in bounded reads (8 MiB of whole lines at a time, a
  physical line of more than 16 MiB skipped unread, a cell of more than 1 MiB refused), columns
  by name, committed per 20,000 records; JSON-typed columns arrive as JSON text and are
  decoded by the reader. ``line`` = the record's 1-based position; no checkpoint (a second run
  reads the file again and the primary keys add nothing).

Rows go through :func:`prefixscope.ingest.usage_rows.insert_dict_rows`, the usage-log writer.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import duckdb

from prefixscope.core.bounds import MAX_LINE_BYTES, TOO_DEEP, check_regular, json_too_deep
from prefixscope.core.errors import SourceUnavailable, invalid_json_reason
from prefixscope.core.formatting import count_noun
from prefixscope.ingest.bookkeeping import (
    Checkpoint,
    IngestSummary,
    Quarantined,
    new_ingest_run_id,
    source_id_for,
)
from prefixscope.ingest.jsonl_driver import (
    _BOM,
    LONG_LINE,
    BadLine,
    bounded_line_runs,
    open_source_file,
    line_guard,
    ParsedChunk,
    TailResult,
    commit_batch,
    complete_json_tail,
    ingest_jsonl_tail,
    with_tail_note,
)
from prefixscope.ingest.usage_rows import insert_dict_rows, row_problem
from prefixscope.store.db import release_between_batches

ToRow = Callable[[dict[str, Any]], "dict[str, Any] | None"]
#: A line's (or record's) rows and its quarantine ``(field, reason)``, or None.
LineRows = tuple[list[dict[str, Any]], "tuple[str | None, str] | None"]

__all__ = ["BadLine", "LineRows", "ToRow", "ingest_record_file", "ingest_record_lines"]


def _is_envelope(obj: Any) -> bool:
    """An API answer holding records: ``{"data": [...], "meta": {...}}`` (Langfuse's public
    API, LiteLLM's paged ``/spend/logs``), not a record itself (a record has an ``id``)."""
    return isinstance(obj, dict) and isinstance(obj.get("data"), list) and "id" not in obj \
        and "request_id" not in obj


def _kind_of_file(path: str) -> str:
    """``csv``, ``jsonl`` or ``json`` (one or more whole documents) for a record file.

    A ``{`` file is JSON lines when its first line (read up to the line bound,
    :data:`MAX_LINE_BYTES`) is one complete record; a first line that is an API answer
    (``{"data": [...], ...}`` on one line, as ``curl > obs.json`` saves it) or not complete
    JSON (a pretty-printed document) makes it a document."""
    low = path.lower()
    if low.endswith(".csv"):
        return "csv"
    if low.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    with open(path, "rb") as fh:
        head = fh.read(MAX_LINE_BYTES + 1)
    if head.startswith(_BOM):  # skipped as before JSON lines (_documents reads it as utf-8-sig)
        head = head[len(_BOM):]
    head = head.lstrip()
    if head.startswith(b"["):
        return "json"
    if head.startswith(b"{"):
        # One pretty-printed document, one API answer on one line, or one record a line?
        first_line = head.split(b"\n", 1)[0].strip()
        if json_too_deep(first_line):  # json.loads would recurse past Python's limit
            return "jsonl"  # each line is then refused: JSON nested deeper than 64 levels
        try:
            first = json.loads(first_line)
        except ValueError:
            return "json"
        return "json" if _is_envelope(first) else "jsonl"
    return "jsonl"


def _documents(data: bytes) -> list[Any]:
    """The records of a whole-file read: one document (an array, an API answer
    ``{"data": [...]}``, or one record), or several written one after another (API pages
    appended with ``curl >> FILE``, or JSON lines whose first line is past the sniff bound).

    Raises:
        ValueError: not JSON (:func:`json.loads`' error, at the first bad document).
        RecursionError: nested past Python's limit.
    """
    try:
        docs = [json.loads(data)]
    except json.JSONDecodeError as exc:
        if not exc.msg.startswith("Extra data"):
            raise
        text = data.decode("utf-8-sig")
        decoder, docs, at = json.JSONDecoder(), [], 0
        while True:
            while at < len(text) and text[at] in " \t\r\n":
                at += 1
            if at == len(text):
                break
            doc, at = decoder.raw_decode(text, at)
            docs.append(doc)
    records: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            records.extend(doc)
        elif isinstance(doc, dict) and "data" in doc and not _is_envelope(doc) \
                and "id" not in doc and "request_id" not in doc:
            raise TypeError("data")  # {"data": <not an array>}
        elif _is_envelope(doc):
            records.extend(doc["data"])
        else:
            records.append(doc)
    return records


def _record_rows(to_row: ToRow, rec: Any) -> LineRows:
    """The record's rows (none or one) and its quarantine ``(field, reason)`` or None."""
    if isinstance(rec, _CsvBad):
        return [], (None, rec.reason)
    if not isinstance(rec, dict):
        return [], (None, "not a JSON object")
    try:
        row = to_row(rec)
    except BadLine as exc:
        return [], (exc.field, exc.reason)
    except (TypeError, ValueError, OverflowError, RecursionError, AttributeError) as exc:
        # A value of a type no reader rule expected: the record, not the file, is bad
        # (issue 12: no input crashes or poisons a source). The exception text may quote
        # the value, so only its type is named.
        return [], (None, f"a value of an unexpected type or size ({type(exc).__name__})")
    if row is None:
        return [], None
    problem = row_problem(row)
    if problem is not None:
        return [], (problem[0], problem[1])
    return [row], None


def _row(to_row: ToRow, rec: Any, location: str, line: int, source_id: str,
         rows: list, bad: list) -> bool:
    """Append the record's row (with source id and line); False when it gave none."""
    got, problem = _record_rows(to_row, rec)
    if problem is not None:
        bad.append(Quarantined(location, line, problem[1], problem[0]))
    for row in got:
        row["source_id"] = source_id
        row["line"] = line
        rows.append(row)
    return bool(got)


def _line_guard(raw: bytes, max_line_bytes: int) -> str | None:
    if max_line_bytes == MAX_LINE_BYTES:
        return line_guard(raw)  # the shared bound of every JSONL reader
    if raw == LONG_LINE or len(raw) > max_line_bytes:
        return f"line longer than {max_line_bytes:,} bytes ({max_line_bytes >> 20} MiB)"
    return TOO_DEEP if json_too_deep(raw) else None


def ingest_record_lines(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                        kind: str, line_rows: Callable[[bytes], LineRows],
                        skip_line: Callable[[bytes], bool] | None = None,
                        note: Callable[[Any], str | None] | None = None,
                        accept_tail: Callable[[bytes], bool] | None = None,
                        max_line_bytes: int = MAX_LINE_BYTES,
                        keep_problems: int = 100) -> TailResult:
    """Tail a file of JSON lines from its checkpoint (``ingest/jsonl_driver.py``): each line's
    rows through the usage-log writer, one transaction per batch.

    Args:
        con: read-write, migrated connection, not inside a transaction.
        kind: ``ingest_sources.kind``.
        line_rows: raw line (no newline, byte-order mark dropped) -> ``(rows, problem)``: the
            line's rows (zero or more, ``source_id`` and ``line`` are set here) and its
            quarantine ``(field, reason)`` or None; the line's rows are kept beside a problem.
            Raises :class:`BadLine` for a line refused whole.
        skip_line: a line it is true of is counted as skipped (not a record of this source).
        note: the driver's summary note (``counts -> str | None``).
        accept_tail: read a final line without newline when this is true of it (default:
            never; ``ingest_record_file`` reads it when it is complete JSON).
        max_line_bytes: longest line (default the shared 1 MiB bound); a longer one, or one
            nested too deep, is quarantined before ``line_rows`` sees it.

    A line without rows and without a problem counts as skipped, as blank lines do.

    Returns:
        The driver's :class:`~prefixscope.ingest.jsonl_driver.TailResult`.

    Raises:
        SourceUnavailable: the file cannot be read.
    """
    location = str(path)
    source_id = source_id_for(kind, location)

    def parse(data: bytes, first_line: int) -> ParsedChunk:
        rows: list[dict[str, Any]] = []
        bad: list[Quarantined] = []
        skipped = 0
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for i, raw in enumerate(lines):
            no = first_line + i
            if not raw.strip() or (skip_line is not None and skip_line(raw)):
                skipped += 1
                continue
            if no == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            guard = _line_guard(raw, max_line_bytes)  # over-long or nested too deep
            if guard is not None:
                bad.append(Quarantined(location, no, guard, None))
                continue
            try:
                got, problem = line_rows(raw)
            except BadLine as exc:
                bad.append(Quarantined(location, no, exc.reason, exc.field))
                continue
            for row in got:
                row["source_id"] = source_id
                row["line"] = no
            rows.extend(got)
            if problem is not None:
                bad.append(Quarantined(location, no, problem[1], problem[0]))
            elif not got:
                skipped += 1
        return ParsedChunk(rows, len(rows), bad, skipped)

    return ingest_jsonl_tail(con, location, kind=kind, parse_chunk=parse,
                             insert=insert_dict_rows, batch_bytes=16 << 20, note=note,
                             accept_tail=accept_tail,
                             keep_problems=keep_problems, max_line_bytes=max_line_bytes)


def skipped_note(n: int, what: str) -> str | None:
    """The summary note of ``n`` records skipped (``to_row`` gave None, or a blank line):
    ``1 record skipped (failed requests: status failure, no usage)``; None for 0."""
    return f"{count_noun(n, 'record')} skipped ({what})" if n else None


def ingest_record_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                       kind: str, to_row: ToRow, keep_problems: int = 100,
                       skipped_what: str = "blank lines, or records without usage"
                       ) -> TailResult:
    """Ingest one file of records (JSON lines, one JSON document or CSV; module docstring).

    Args:
        con: read-write, migrated connection, not inside a transaction.
        kind: ``ingest_sources.kind`` (e.g. ``litellm``, ``langfuse``).
        to_row: record -> row dict, None (skip), or raises :class:`BadLine`.
        skipped_what: what a skipped record is, for the summary's note (:func:`skipped_note`).

    Returns:
        A :class:`~prefixscope.ingest.jsonl_driver.TailResult` (for a whole-file read:
        ``start``/``end`` are offset 0 and the file size).

    Raises:
        SourceUnavailable: missing or unreadable file; a whole-file JSON document that is not
            JSON (the message names the byte).
    """
    location = str(path)
    try:
        check_regular(location)  # a FIFO or a device is refused before it is opened
    except OSError as exc:
        raise SourceUnavailable(f"cannot read {location}: {exc}") from None
    release_between_batches(con)  # a batch writer: not held while the file is read
    form = _kind_of_file(location)
    source_id = source_id_for(kind, location)
    if form == "jsonl":
        def line_rows(raw: bytes) -> LineRows:
            try:
                rec = json.loads(raw)
            except ValueError as exc:
                raise BadLine(None, invalid_json_reason(exc)) from None
            return _record_rows(to_row, rec)

        return with_tail_note(ingest_record_lines(
            con, location, kind=kind, line_rows=line_rows, keep_problems=keep_problems,
            note=lambda c: skipped_note(c.lines_skipped, skipped_what),
            accept_tail=complete_json_tail), location)
    if form == "csv":
        return _csv_file(con, location, kind, source_id, to_row, keep_problems, skipped_what)
    return _whole_file(con, location, form, kind, source_id, to_row, keep_problems,
                       skipped_what)


#: Largest JSON document read whole (JSON lines and CSV have no such bound: batches).
MAX_DOCUMENT_BYTES = 256 << 20
_CSV_FIELD_MAX = 1 << 20  # the line bound of every JSONL source (docs/ingest.md#bounds)
#: Longest physical CSV line read (a longer one is skipped without being held whole).
CSV_MAX_LINE_BYTES = 16 << 20
CSV_LINE_TOO_LONG = f"CSV line longer than {CSV_MAX_LINE_BYTES:,} bytes (16 MiB)"
CSV_FIELD_TOO_LONG = "CSV field longer than 1,048,576 bytes (1 MiB)"
#: Records (or quarantined records) per CSV transaction, and bytes read at a time.
CSV_BATCH_RECORDS = 20_000
_CSV_READ_BYTES = 8 << 20


class _CsvBad:
    """A CSV record the reader could not split (a field past the bound, a stray quote)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _csv_stream(fh, location: str) -> Iterator[Any]:
    """CSV with a header row, read in bounded steps -> one dict per record (as
    ``csv.DictReader`` gives it: extra cells under ``None``, missing ones None), or a
    :class:`_CsvBad` for a record the stdlib reader refuses (its message is not kept: it may
    quote the field) or a physical line longer than :data:`CSV_MAX_LINE_BYTES` (skipped, never
    held). Blank lines are not records. Memory: one read step plus one record."""
    runs = bounded_line_runs(fh, _CSV_READ_BYTES, location, CSV_MAX_LINE_BYTES)
    long_lines = [0]  # over-long lines seen by the reader and not yet reported

    def lines() -> Iterator[str]:
        first = True
        for data, _real in runs:
            if first:
                first = False
                if data.startswith(_BOM):
                    data = data[len(_BOM):]
            if data.startswith(LONG_LINE + b"\n"):
                long_lines[0] += 1
                yield "\n"  # an empty line where it was: its record is reported
                data = data[len(LONG_LINE) + 1:]
            for line in io.StringIO(data.decode("utf-8", errors="replace"), newline=""):
                if len(line) > CSV_MAX_LINE_BYTES:  # ended within the read: held, not kept
                    long_lines[0] += 1
                    yield "\n"
                else:
                    yield line
        if runs.tail:  # a last line without newline (an export is complete when read)
            yield runs.tail.decode("utf-8", errors="replace")

    reader = csv.reader(lines())
    fieldnames: list[str] | None = None
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if fieldnames is None:
                raise SourceUnavailable(f"{location}: the CSV header row cannot be split into "
                                        "fields") from None
            big = "field larger" in str(exc)
            yield _CsvBad(CSV_FIELD_TOO_LONG if big else "CSV record cannot be split into fields")
            continue
        if long_lines[0]:
            long_lines[0] = 0
            if fieldnames is None:
                raise SourceUnavailable(f"{location}: the CSV header row is a {CSV_LINE_TOO_LONG}")
            yield _CsvBad(CSV_LINE_TOO_LONG)  # the record it was in (or stood for) is cut
            continue
        if not row:
            continue  # a blank line
        if fieldnames is None:
            fieldnames = row
            continue
        rec: dict[Any, Any] = dict(zip(fieldnames, row))
        if len(row) > len(fieldnames):
            rec[None] = row[len(fieldnames):]
        elif len(row) < len(fieldnames):
            for key in fieldnames[len(row):]:
                rec[key] = None
        yield rec


def _record_note(read: int, n_bad: int, skipped: int, what: str) -> str | None:
    """A whole-file or CSV read's note: the records skipped (:func:`skipped_note`), after
    ``no request records in the file`` when nothing else was there."""
    notes = [] if read or n_bad else ["no request records in the file"]
    more = skipped_note(skipped, what)
    return "; ".join(notes + ([more] if more else [])) or None


def _csv_file(con, location: str, kind: str, source_id: str, to_row: ToRow,
              keep_problems: int, skipped_what: str) -> TailResult:
    """A CSV export read in batches of :data:`CSV_BATCH_RECORDS` records, each committed in one
    transaction with its quarantine entries (``line`` = the record's 1-based position); no
    checkpoint: a second run (or a run after a crash) reads the file again and the primary
    keys add nothing twice."""
    started = time.time()
    fh = open_source_file(location)  # refuses binary files too
    run_id = new_ingest_run_id()
    read = added = n_bad = batches = 0
    count = {"position": 0, "skipped": 0}
    problems: list[Quarantined] = []

    def parsed(records: Iterator[Any]) -> Iterator[tuple[list, list]]:
        """(rows, quarantined) per batch; the last one may be empty (it records the run)."""
        rows: list[dict[str, Any]] = []
        bad: list[Quarantined] = []
        for rec in records:
            count["position"] += 1
            no = count["position"]
            if not _row(to_row, rec, location, no, source_id, rows, bad) and \
                    (not bad or bad[-1].line != no):
                count["skipped"] += 1
            if len(rows) + len(bad) >= CSV_BATCH_RECORDS:
                yield rows, bad
                rows, bad = [], []
        yield rows, bad

    old_limit = csv.field_size_limit()
    csv.field_size_limit(_CSV_FIELD_MAX)
    try:
        with fh:
            size = os.fstat(fh.fileno()).st_size
            it = parsed(_csv_stream(fh, location))
            cur = next(it)
            while cur is not None:
                rows, bad = cur
                nxt = next(it, None)  # one ahead: the last batch carries the run record
                read += len(rows)
                n_bad += len(bad)
                room = keep_problems - len(problems)
                if room > 0:
                    problems.extend(bad[:room])
                summary = None
                if nxt is None:
                    note = _record_note(read, n_bad, count["skipped"], skipped_what)
                    summary = _csv_summary(location, kind, read, added, n_bad, note)
                n = commit_batch(con, insert=insert_dict_rows, rows=rows, quarantined=bad,
                                 source_id=source_id, kind=kind, location=location,
                                 ingest_run_id=run_id, checkpoint=None, run_summary=summary,
                                 started_unix_s=started)
                added += n
                batches += 1
                cur = nxt
    finally:
        csv.field_size_limit(old_limit)
    return TailResult(summary(n), problems, Checkpoint(0, 0, None),
                      Checkpoint(size, count["position"], None), count["skipped"], batches,
                      run_id)


def _csv_summary(location: str, kind: str, read: int, added_before: int, n_bad: int,
                 note: str | None) -> Callable[[int], IngestSummary]:
    def summary(n: int) -> IngestSummary:
        added = added_before + n
        return IngestSummary(location, kind, read, added, read - added, n_bad, note)
    return summary


def _whole_file(con, location: str, form: str, kind: str, source_id: str, to_row: ToRow,
                keep_problems: int, skipped_what: str) -> TailResult:
    started = time.time()
    try:
        size = os.stat(location).st_size
    except OSError as exc:
        raise SourceUnavailable(f"cannot read {location}: {exc.strerror or exc}") from exc
    if size > MAX_DOCUMENT_BYTES:  # read whole and decoded whole: 173 MB took 3.6 GB
        raise SourceUnavailable(
            f"{location}: a JSON document larger than "
            "256 MiB is not read whole; give it as JSON lines (one record a line, read in "
            "batches), e.g. jq -c '.data[]?, .[]?' FILE > FILE.jsonl")
    try:
        with open(location, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise SourceUnavailable(f"cannot read {location}: {exc.strerror or exc}") from exc
    try:
        records = _documents(data)
    except ValueError as exc:
        raise SourceUnavailable(f"{location}: {invalid_json_reason(exc)}") from None
    except RecursionError:
        raise SourceUnavailable(f"{location}: {TOO_DEEP}") from None
    except TypeError:
        raise SourceUnavailable(f"{location}: expected an array of records or "
                                "{\"data\": [...]}") from None
    rows: list[dict[str, Any]] = []
    bad: list[Quarantined] = []
    skipped = 0
    for i, rec in enumerate(records, start=1):
        if not _row(to_row, rec, location, i, source_id, rows, bad) and \
                (not bad or bad[-1].line != i):
            skipped += 1
    read = len(rows)
    note = _record_note(read, len(bad), skipped, skipped_what)

    def summary(n: int) -> IngestSummary:
        return IngestSummary(location, kind, read, n, read - n, len(bad), note)

    end = Checkpoint(len(data), len(records), None)
    run_id = new_ingest_run_id()
    added = commit_batch(con, insert=insert_dict_rows, rows=rows, quarantined=bad,
                         source_id=source_id, kind=kind, location=location,
                         ingest_run_id=run_id, checkpoint=None, run_summary=summary,
                         started_unix_s=started)
    return TailResult(summary(added), bad[:keep_problems], Checkpoint(0, 0, None), end,
                      skipped, 1, run_id)
