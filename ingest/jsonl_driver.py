"""One driver for tailing a JSONL file into DuckDB: checkpoint, parse, one transaction, summary.

Every JSONL ingester (decision logs, KV-event captures; usage logs can adopt it) does the same
steps, so they are written once here and the ingester supplies only two functions:

- a **chunk parser** ``parse_chunk(data, first_line) -> ParsedChunk`` (pure, no DuckDB needed):
  ``data`` is a run of complete lines as bytes, each ending in ``b"\\n"`` (except a final line
  without newline that ``accept_tail`` accepted); ``first_line`` is the 1-based number of its
  first line in the file. It returns the good rows in any form the inserter takes (a list of
  tuples, an Arrow table, ...), their count, the quarantined lines (file, line, field, reason;
  never the value) and the count of lines skipped (blank). It must accept ``b""`` (no lines)
  and return an empty batch. :func:`line_parser` builds one from a per-line function.
- an **inserter** ``insert(con, rows) -> rows added``, called inside the driver's transaction;
  rows whose key exists must be skipped (``ON CONFLICT DO NOTHING``) so a repeat adds nothing.
  It may raise :class:`RetryBatch` to have the whole batch rolled back and run once more (e.g.
  a plain ``INSERT`` tried first for speed, then ``ON CONFLICT DO NOTHING``).

Contract of :func:`ingest_jsonl_tail` (the rules of ``ingest/bookkeeping.py``):

1. The file is opened once; reading resumes at the stored checkpoint (byte offset, line
   count) when the file is not shorter than it and its first ``min(offset, 4 KiB)`` bytes
   have the stored SHA-256 fingerprint; otherwise (truncated, rotated, replaced) it starts at
   byte 0, line 0 and primary keys drop what was stored before.
2. Only complete lines are consumed. A final line without newline is left for the next run
   (a writer may still be writing it) unless ``accept_tail(tail)`` says it is complete.
3. ``batch_bytes=None``: everything new is one batch. Otherwise batches of about
   ``batch_bytes`` of whole lines (a longer line makes a longer batch).
4. Each batch is **one transaction**: rows (inserter), quarantine entries (a line
   quarantined before is kept once), the source's new checkpoint (offset, line, fingerprint)
   and, in the last batch, the ``ingest_runs`` record with the totals. Nothing new still
   commits one empty batch (the source's last-ingest time and the run record). On any error
   the batch is rolled back: its rows and its checkpoint stay as they were; earlier batches
   of the same call stay committed (each with its own checkpoint); the error propagates.
5. The connection is the caller's (``prefixscope.store.db.batch_writer``, or ``writer``: one
   short unit of work, then close); the driver opens no connection and must not be called
   inside a transaction. A batch writer is released after the checkpoint is read and after
   each commit, so the database file is held only while a batch is written. Its SQL
   (transaction, source row, quarantine, run record) is in ``store/queries/ingest.py``.
6. Returns a :class:`TailResult`; ``summary.rows_read`` counts good rows, ``rows_added`` new
   rows, ``rows_duplicate`` = read - added, ``rows_quarantined`` lines set aside; run status
   ``ok``/``partial``/``failed`` (:func:`~ingest.bookkeeping.run_status`).

Speed: the driver splits nothing itself beyond finding the last newline of a read and counting
newlines (both at memchr speed); ``map_chunks`` lets a caller parse batches elsewhere (a process
pool, DuckDB's JSON reader) while earlier batches are inserted, as long as results come back in
file order.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Generic, TypeVar

import duckdb
import msgspec

from prefixscope.ingest.bookkeeping import (
    FINGERPRINT_BYTES,
    Checkpoint,
    IngestSummary,
    Quarantined,
    fingerprint_of,
    new_ingest_run_id,
    record_quarantine,
    record_run,
    resume_from,
    run_status,
    source_id_for,
    upsert_source,
)
from prefixscope.core.bounds import (
    BINARY_REASON,
    BINARY_SAMPLE_BYTES,
    LINE_TOO_LONG,
    MAX_LINE_BYTES,
    TOO_DEEP,
    json_too_deep,
    NotReadable,
    looks_binary,
    open_regular,
)
from prefixscope.core.errors import SourceUnavailable
from prefixscope.store.db import release_between_batches
from prefixscope.store.queries.ingest import ingest_transaction

R = TypeVar("R")
T = TypeVar("T")

#: Bytes read at a time when ``batch_bytes`` is None (the batch is still the whole rest).
READ_BYTES = 8 << 20


class BadLine(Exception):
    """A line that cannot be ingested (raised by a per-line parser, see :func:`line_parser`).

    Attributes:
        field: JSON path or key at fault, or None when the line as a whole is bad.
        reason: short reason; never the offending value, prompt text or a tenant id.
    """

    def __init__(self, field: str | None, reason: str):
        super().__init__(reason)
        self.field = field
        self.reason = reason


class RetryBatch(Exception):
    """Raised by an inserter: roll the batch's transaction back and run it once more (the
    inserter keeps the state that makes the second attempt differ). A second RetryBatch in the
    same batch propagates."""


@dataclass(slots=True)
class ParsedChunk(Generic[R]):
    """What a chunk parser returns for one run of lines.

    Attributes:
        rows: the good rows, in the form the inserter takes (opaque to the driver).
        num_rows: how many rows ``rows`` holds (the summary's ``rows_read``).
        quarantined: lines set aside, file order (location, 1-based line, reason, field).
        skipped: lines neither stored nor quarantined (blank lines, records without data).
    """

    rows: R
    num_rows: int
    quarantined: list[Quarantined] = field(default_factory=list)
    skipped: int = 0


#: ``parse_chunk(data, first_line)``: see the module docstring.
ChunkParser = Callable[[bytes, int], ParsedChunk[Any]]
#: ``insert(con, rows) -> rows added``, inside the driver's transaction.
Inserter = Callable[[duckdb.DuckDBPyConnection, Any], int]
#: ``map_chunks(parse_chunk, chunks)``: parsed chunks in the order of ``chunks``
#: (``(data, first_line)`` pairs). Default: parse each in this thread, lazily.
ChunkMapper = Callable[[ChunkParser, Iterable[tuple[bytes, int]]], Iterable[ParsedChunk[Any]]]


@dataclass(frozen=True, slots=True)
class TailCounts:
    """Totals of one call, given to the ``note`` callback before the last batch is stored.

    Attributes:
        start: where reading began (offset 0 after truncation or rotation).
        rows_read: good rows parsed. rows_quarantined: lines set aside.
        lines_skipped: blank (or otherwise skipped) lines.
    """

    start: Checkpoint
    rows_read: int
    rows_quarantined: int
    lines_skipped: int


@dataclass(frozen=True, slots=True)
class TailResult:
    """Outcome of :func:`ingest_jsonl_tail`.

    Attributes:
        summary: the :class:`~ingest.bookkeeping.IngestSummary` (also stored in ``ingest_runs``).
        problems: the first ``keep_problems`` quarantined lines of this call, file order.
        start: checkpoint reading began at; end: checkpoint stored (offset bytes, lines).
        lines_skipped: blank/skipped lines. batches: transactions committed.
        ingest_run_id: id of the ``ingest_runs`` row.
    """

    summary: IngestSummary
    problems: list[Quarantined]
    start: Checkpoint
    end: Checkpoint
    lines_skipped: int
    batches: int
    ingest_run_id: str


_BOM = b"\xef\xbb\xbf"


def line_guard(raw: bytes) -> str | None:
    """The reason a JSONL line is refused before any decoder sees it (over-long, a stand-in for
    a skipped over-long line, or nested too deep), or None. Shared by every JSONL reader."""
    if len(raw) > MAX_LINE_BYTES or raw == LONG_LINE:
        return LINE_TOO_LONG
    if json_too_deep(raw):
        return TOO_DEEP
    return None


def line_parser(parse_line: Callable[[bytes, int], Iterable[T]], *, location: str
                ) -> Callable[[bytes, int], ParsedChunk[list[T]]]:
    """A chunk parser from a per-line function.

    Args:
        parse_line: ``(raw line without newline, 1-based line number) -> rows`` (zero or more
            rows per line); raises :class:`BadLine` for a bad line. Other exceptions propagate.
        location: the file as given, for quarantine entries.

    Returns:
        A chunk parser whose ``rows`` is the list of every line's rows, in file order. Blank
        (whitespace-only) lines are counted as skipped and not passed to ``parse_line``; a UTF-8
        byte-order mark at the start of line 1 is dropped; over-long and too deeply nested lines
        are quarantined by :func:`line_guard` before ``parse_line`` sees them.
    """

    def parse(data: bytes, first_line: int) -> ParsedChunk[list[T]]:
        rows: list[T] = []
        bad: list[Quarantined] = []
        skipped = 0
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()  # data ends with a newline (or is empty)
        for i, raw in enumerate(lines):
            if not raw.strip():
                skipped += 1
                continue
            if first_line + i == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            guard = line_guard(raw)
            if guard is not None:
                bad.append(Quarantined(location, first_line + i, guard, None))
                continue
            try:
                rows.extend(parse_line(raw, first_line + i))
            except BadLine as exc:
                bad.append(Quarantined(location, first_line + i, exc.reason, exc.field))
        return ParsedChunk(rows, len(rows), bad, skipped)

    return parse


def commit_batch(con: duckdb.DuckDBPyConnection, *, insert: Inserter, rows: Any,
                 quarantined: Sequence[Quarantined], source_id: str, kind: str, location: str,
                 ingest_run_id: str, checkpoint: Checkpoint | None = None,
                 source_note: str | None = None,
                 run_summary: Callable[[int], IngestSummary] | None = None,
                 started_unix_s: float | None = None,
                 released: list[bool] | None = None) -> int:
    """Store one batch in one transaction: rows, quarantine entries, the source row (rows added,
    ``checkpoint`` and ``source_note``; None keeps the stored ones) and, when ``run_summary`` is
    given, the ``ingest_runs`` record built by ``run_summary(rows added by this batch)``.

    Also used for sources without a file (a ZMQ flush: ``checkpoint=None``). After the commit a
    :class:`~prefixscope.store.db.BatchConnection` is released when another process waits for
    the database file (closed until the next batch opens it), so it gets in between batches;
    ``released`` (if given) gets True or False appended for that.

    Returns:
        Rows added by this batch.

    Raises:
        Whatever the inserter or the store raises, after ROLLBACK (nothing of the batch is kept).
    """
    for attempt in (1, 2):
        try:
            with ingest_transaction(con):
                added = insert(con, rows)
                record_quarantine(con, source_id=source_id, ingest_run_id=ingest_run_id,
                                  entries=list(quarantined))
                upsert_source(con, source_id=source_id, kind=kind, location=location,
                              rows_added=added, checkpoint=checkpoint, note=source_note)
                if run_summary is not None:
                    s = run_summary(added)
                    started = started_unix_s if started_unix_s is not None else time.time()
                    record_run(con, source_id=source_id, kind=kind, started_unix_s=started,
                               summary=s, status=run_status(s.rows_read, s.rows_quarantined),
                               ingest_run_id=ingest_run_id)
            # a batch writer lets a process waiting for the file in now
            con_released = release_between_batches(con, only_if_waited=True)
            if released is not None:
                released.append(con_released)
            return added
        except RetryBatch:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _chunks(fh: BinaryIO, location: str, start: Checkpoint, batch_bytes: int | None,
            accept_tail: Callable[[bytes], bool] | None,
            ends: deque[tuple[int, int]], max_line_bytes: int = MAX_LINE_BYTES
            ) -> Iterator[tuple[bytes, int]]:
    """``(data, first_line)`` of each batch from ``start``; appends each batch's end
    ``(offset, line)`` to ``ends`` as it is yielded. A line longer than
    :data:`~prefixscope.core.bounds.MAX_LINE_BYTES` is never held whole: it is passed on as
    :data:`LONG_LINE` (the parser quarantines it) and its bytes are skipped."""
    try:
        fh.seek(start.offset)
    except OSError as exc:
        raise _unreadable(location, exc) from exc
    offset, line = start.offset, start.line
    want = batch_bytes or READ_BYTES
    parts: list[bytes] = []  # whole-file mode: complete-line pieces gathered until EOF
    gathered = 0  # real bytes of ``parts``
    lines = bounded_line_runs(fh, want, location, max_line_bytes)
    for data, real in lines:
        if batch_bytes is None:
            parts.append(data)
            gathered += real
            continue
        n = data.count(b"\n")
        ends.append((offset + real, line + n))
        yield data, line + 1
        offset += real
        line += n
    tail = lines.tail if lines.tail and accept_tail is not None and accept_tail(lines.tail) \
        else b""
    if batch_bytes is None:
        data = b"".join(parts) + tail
        if data:
            n = data.count(b"\n") + (1 if tail else 0)
            ends.append((offset + gathered + len(tail), line + n))
            yield data, line + 1
    elif tail:
        ends.append((offset + len(tail), line + 1))
        yield tail, line + 1


#: Stands in for a line longer than :data:`~prefixscope.core.bounds.MAX_LINE_BYTES` in the data
#: given to a chunk parser (its bytes are skipped, never held whole).
LONG_LINE = b"\x00\x00prefixscope: line too long\x00\x00"


class bounded_line_runs:  # noqa: N801 - used as an iterator
    """Runs of complete lines read ``want`` bytes at a time: yields ``(data, real bytes)``,
    where ``data`` ends with a newline and holds every line as read, except that a line longer
    than :data:`~prefixscope.core.bounds.MAX_LINE_BYTES` is replaced by :data:`LONG_LINE`
    (``real`` counts its bytes). Memory stays below ``want + MAX_LINE_BYTES`` whatever the
    input. After the loop, :attr:`tail` is the final line without newline (short enough to
    keep; an over-long unfinished tail is left unread for the next run).

    Raises:
        SourceUnavailable: a read fails.
    """

    def __init__(self, fh: BinaryIO, want: int, location: str,
                 max_line_bytes: int = MAX_LINE_BYTES):
        self.fh, self.want, self.location = fh, want, location
        self.max_line = max_line_bytes  # a source whose records are larger (OTLP) raises it
        self.tail = b""

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        pending = b""
        skipping = 0  # > 0: inside an over-long line, this many bytes of it already skipped
        while True:
            try:
                chunk = self.fh.read(self.want)
            except OSError as exc:
                raise _unreadable(self.location, exc) from exc
            if not chunk:
                break
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    skipping += len(chunk)
                    continue
                out, real = LONG_LINE + b"\n", skipping + nl + 1
                skipping, chunk = 0, chunk[nl + 1:]
                cut = chunk.rfind(b"\n")
                if cut >= 0:
                    out, real = out + chunk[:cut + 1], real + cut + 1
                    pending = chunk[cut + 1:]
                else:
                    pending = chunk
                if len(pending) > self.max_line:
                    skipping, pending = len(pending), b""
                yield out, real
                continue
            buf = pending + chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                if len(buf) > self.max_line:
                    skipping, pending = len(buf), b""
                else:
                    pending = buf
                continue
            pending = buf[cut + 1:]
            data = buf[:cut + 1]
            if len(pending) > self.max_line:
                skipping, pending = len(pending), b""
            yield data, len(data)
        self.tail = pending if not skipping else b""


#: Summary note when the file's last line has no newline and is not complete JSON: it is left
#: for the next run (``ingest requests``, ``decisions``, ``litellm``, ``langfuse``).
TAIL_LEFT_NOTE = ("the last line has no newline and is not complete JSON: left for the next "
                  "ingest (a writer may still be writing it)")


def with_tail_note(result: TailResult, location: str) -> TailResult:
    """``result`` with :data:`TAIL_LEFT_NOTE` added to its summary's note when bytes past the
    stored checkpoint (an unfinished last line) were left for the next run."""
    try:
        size = os.stat(location).st_size
    except OSError:
        return result
    if size <= result.end.offset:
        return result
    s = result.summary
    note = TAIL_LEFT_NOTE if not s.note else f"{s.note}; {TAIL_LEFT_NOTE}"
    return dataclasses.replace(result, summary=dataclasses.replace(s, note=note))


def complete_json_tail(tail: bytes) -> bool:
    """Whether a file's final line without a newline is read now: only when it is complete
    JSON (a writer may still be writing it; then it is left for the next run and read whole
    once finished). The one rule of ``ingest requests`` and ``ingest decisions``. A line too
    deeply nested to decode is left too (it cannot be told from a half-written one). A UTF-8
    BOM before it (the file's only line) is skipped, as the line reader skips it."""
    if tail.startswith(_BOM):
        tail = tail[len(_BOM):]
    if not tail.strip():
        return False
    try:
        msgspec.json.decode(tail)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def ingest_jsonl_tail(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                      kind: str, parse_chunk: ChunkParser, insert: Inserter,
                      batch_bytes: int | None = None,
                      accept_tail: Callable[[bytes], bool] | None = None,
                      note: Callable[[TailCounts], str | None] | None = None,
                      note_on_source: bool = False, keep_problems: int | None = None,
                      map_chunks: ChunkMapper | None = None,
                      max_line_bytes: int = MAX_LINE_BYTES) -> TailResult:
    """Ingest what is new in a JSONL file since its checkpoint (contract: module docstring).

    Args:
        con: read-write, migrated connection, not inside a transaction.
        path: the JSONL file; its source id is ``source_id_for(kind, path)``.
        kind: source kind (``ingest_sources.kind``), e.g. ``decisions``.
        parse_chunk: ``(data, first_line) -> ParsedChunk`` (see :func:`line_parser`).
        insert: ``(con, rows) -> rows added``, inside the batch's transaction.
        batch_bytes: about this many bytes of lines per transaction; None = one transaction.
        accept_tail: consume a final line without newline when this returns True for it.
        note: ``counts -> note`` for the summary and the run record (None = no note).
        note_on_source: also store that note on the ``ingest_sources`` row.
        keep_problems: how many quarantined lines :attr:`TailResult.problems` keeps (None =
            all; every one is stored in ``quarantine`` regardless).
        map_chunks: parses the batches, in order (default: lazily, in this thread).
        max_line_bytes: longest line passed to the parser (default the shared bound
            :data:`~prefixscope.core.bounds.MAX_LINE_BYTES`); a source whose records are
            larger by nature (one OTLP export a line) raises it.

    Returns:
        A :class:`TailResult`.

    Raises:
        SourceUnavailable: the file cannot be opened or read.
        Any error of the parser, the inserter or the store (the failing batch is rolled back).
    """
    started = time.time()
    location = str(path)
    source_id = source_id_for(kind, location)
    fh = open_source_file(location)
    ingest_run_id = new_ingest_run_id()
    totals = _Totals(keep_problems)
    with fh:
        try:
            start = resume_from(con, source_id, fh)
        except OSError as exc:
            raise _unreadable(location, exc) from exc
        release_between_batches(con)  # not held while the first batch is read and parsed
        ends: deque[tuple[int, int]] = deque()
        chunks = _chunks(fh, location, start, batch_bytes, accept_tail, ends, max_line_bytes)
        mapper = map_chunks or (lambda f, cs: (f(d, n) for d, n in cs))
        parsed = iter(mapper(parse_chunk, chunks))
        cur = next(parsed, None)
        if cur is None:  # nothing new: one empty batch still records the run
            cur = parse_chunk(b"", start.line + 1)
            ends.append((start.offset, start.line))
        fixed_fp: str | None = None
        end, note_text = start, None
        while cur is not None:
            offset, line = ends.popleft()
            nxt = next(parsed, None)  # parse ahead: the last batch carries the run record
            totals.add(cur)
            if fixed_fp is not None:
                fp: str | None = fixed_fp
            else:
                try:
                    fp = fingerprint_of(fh, offset) if offset else None
                except OSError as exc:
                    raise _unreadable(location, exc) from exc
                if offset >= FINGERPRINT_BYTES:
                    fixed_fp = fp  # the first 4 KiB are read: the fingerprint is final
            end = Checkpoint(offset, line, fp)
            run_summary = None
            if nxt is None:
                note_text = note(totals.counts(start)) if note is not None else None
                run_summary = totals.summary_after(location, kind, note_text)
            totals.added += commit_batch(
                con, insert=insert, rows=cur.rows, quarantined=cur.quarantined,
                source_id=source_id, kind=kind, location=location,
                ingest_run_id=ingest_run_id, checkpoint=end,
                source_note=note_text if note_on_source else None,
                run_summary=run_summary, started_unix_s=started)
            totals.batches += 1
            cur = nxt
    return TailResult(totals.summary_after(location, kind, note_text)(0), totals.problems,
                      start, end, totals.skipped, totals.batches, ingest_run_id)


def open_source_file(location: str) -> BinaryIO:
    """Open a file source for reading, refusing up front what is not a text file: a missing
    path, a FIFO, a device, a socket or a folder (:func:`prefixscope.core.bounds.open_regular`),
    or a file whose first 8 KiB are mostly not text (:func:`~prefixscope.core.bounds.looks_binary`).

    Raises:
        SourceUnavailable: ``cannot read <file>: <why>``.
    """
    try:
        fh = open_regular(location)
    except OSError as exc:
        raise _unreadable(location, exc) from exc
    try:
        head = os.pread(fh.fileno(), BINARY_SAMPLE_BYTES, 0)
    except OSError as exc:
        fh.close()
        raise _unreadable(location, exc) from exc
    if looks_binary(head):
        fh.close()
        raise SourceUnavailable(f"cannot read {location}: {BINARY_REASON}")
    return fh


def _unreadable(location: str, exc: OSError) -> SourceUnavailable:
    why = str(exc) if isinstance(exc, NotReadable) else (exc.strerror or str(exc))
    return SourceUnavailable(f"cannot read {location}: {why}")


class _Totals:
    """Running totals of one :func:`ingest_jsonl_tail` call."""

    def __init__(self, keep_problems: int | None):
        self.read = self.added = self.quarantined = self.skipped = self.batches = 0
        self.keep = keep_problems
        self.problems: list[Quarantined] = []

    def add(self, chunk: ParsedChunk[Any]) -> None:
        self.read += chunk.num_rows
        self.quarantined += len(chunk.quarantined)
        self.skipped += chunk.skipped
        room = len(chunk.quarantined) if self.keep is None else self.keep - len(self.problems)
        if room > 0:
            self.problems.extend(chunk.quarantined[:room])

    def counts(self, start: Checkpoint) -> TailCounts:
        return TailCounts(start, self.read, self.quarantined, self.skipped)

    def summary_after(self, location: str, kind: str, note: str | None
                      ) -> Callable[[int], IngestSummary]:
        """The call's summary once a batch adding ``n`` more rows is stored."""
        def summary(n: int) -> IngestSummary:
            added = self.added + n
            return IngestSummary(location, kind, self.read, added, self.read - added,
                                 self.quarantined, note)
        return summary
