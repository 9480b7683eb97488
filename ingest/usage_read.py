"""Usage-log reading: JSONL bytes from a checkpoint -> Arrow batches of ``requests`` rows.

Reads only (no DuckDB): lines are decoded and normalised by :mod:`prefixscope.ingest.usage_shapes`, the
rows built column by column into Arrow tables with the ``requests`` types, and bad lines
collected as quarantine entries. Large files are parsed by forked processes, one region of
complete lines each (:func:`fetch_usage_parallel`); the writer is ``ingest/usage.py``.
"""

from __future__ import annotations

import gc
import hashlib
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prefixscope.ingest.bookkeeping import Checkpoint, Quarantined
from prefixscope.ingest.jsonl_driver import (
    _BOM,
    LONG_LINE,
    bounded_line_runs,
    complete_json_tail,
    open_source_file,
)
from prefixscope.ingest.usage_shapes import (_DECODER, _Bad, _normalise, _Skip, _split_error,
                                             not_utf8_reason)
from prefixscope.core.bounds import (LINE_TOO_LONG, MAX_DEPTH, MAX_LINE_BYTES, TOO_DEEP,
                                     json_too_deep)
from prefixscope.core.errors import SourceUnavailable

#: Rows per transaction (and per Arrow batch) when parsing in this process.
BATCH_ROWS = 50_000
#: Bytes read from the file at a time.
READ_BYTES = 8 << 20

_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("run_id", pa.string()), ("request_id", pa.string()), ("source_id", pa.string()),
    ("line", pa.int64()), ("ts_unix_s", pa.float64()), ("ts_estimated", pa.bool_()),
    ("model", pa.string()), ("instance", pa.string()), ("endpoint", pa.string()),
    ("usage_shape", pa.string()), ("prompt_tokens", pa.int64()), ("cached_tokens", pa.int64()),
    ("cache_write_tokens", pa.int64()), ("cache_write_1h_tokens", pa.int64()),
    ("completion_tokens", pa.int64()), ("ttft_ms", pa.float64()), ("latency_ms", pa.float64()),
    ("scope", pa.string()), ("tenant_digest", pa.string()), ("flags", pa.string()),
)
_SCHEMA = pa.schema([pa.field(n, t) for n, t in _COLUMNS])
_COLUMN_LIST = ", ".join(n for n, _ in _COLUMNS)
#: A parsed batch: the ``requests`` columns and each row's ``request_key`` (:func:`_keys`).
_KEYED_SCHEMA = _SCHEMA.append(pa.field("request_key", pa.uuid()))


@dataclass(slots=True)
class UsageBatch:
    """Rows parsed from a run of lines, with the checkpoint after them.

    Attributes:
        rows: the rows as an Arrow table in ``requests`` column order (:data:`_COLUMNS`),
            then ``request_key`` (:func:`_keys`) when parsed from lines.
        quarantined: lines set aside, with file:line:field:reason.
        skipped: lines that are not requests (blank lines, stream chunks without usage).
        checkpoint: byte offset and line count after the last consumed line (None: no line
            consumed, the stored checkpoint stays).
        last: whether the reader knows this is its last batch (True) or that another
            follows (False); None: not known until the next one is asked for. The writer
            commits a batch whose answer is known without waiting for the next to be parsed.
    """

    rows: pa.Table
    quarantined: list[Quarantined]
    skipped: int
    checkpoint: Checkpoint | None
    last: bool | None = None


@dataclass(frozen=True, slots=True)
class _LineContext:
    """What every row of one file shares (picklable: sent to parser processes)."""

    location: str
    source_id: str
    run_id: str
    instance: str | None
    default_model: str | None
    mtime: float
    fallback_prefix: str  # "<absolute path>:" for request ids of lines without one


def record_digest_id(raw: bytes) -> str:
    """The request id of a record that carries none: ``sha256:`` and the first 32 hex digits
    (128 bits) of the SHA-256 of the line without surrounding whitespace. It depends on the
    record alone, not on the file or line, so a copytruncate rotation (new records at lines
    already seen) adds them and a renamed or copied file adds nothing; two byte-identical
    records without an id count as one request (``docs/ingest.md``)."""
    return "sha256:" + hashlib.sha256(raw.strip()).hexdigest()[:32]


def _context(path: str | os.PathLike[str], source_id: str, run_id: str, instance: str | None,
             default_model: str | None, mtime: float) -> _LineContext:
    return _LineContext(str(path), source_id, run_id, instance, default_model, mtime,
                        str(Path(path).resolve()) + ":")


def _parse_lines_arrow(lines: list[bytes], line_no: int, ctx: _LineContext, *,
                       file_start: bool | None = None, bracketed: frozenset[int] | None = None
                       ) -> tuple[pa.Table, list[Quarantined], int]:
    """Parse complete lines (no newline) numbered ``line_no + 1``...

    ``file_start``: whether the first line is the file's first (a UTF-8 byte-order mark is
    dropped from it); default ``line_no == 0``. A parser process numbers a region's lines from
    0 before the lines ahead of it are counted, so it passes False for a later region.
    ``bracketed``: the positions in ``lines`` (from 0) of the lines with more than
    :data:`~prefixscope.core.bounds.MAX_DEPTH` opening brackets (:func:`_bracketed_lines`,
    counted over a whole region at once); None: each line's brackets are counted here.

    Returns:
        (the ``requests`` rows as an Arrow table (:data:`_COLUMNS`), quarantined lines,
        skipped lines: blank or stream chunks without usage). The table is built column by
        column, the file's defaults filled in by Arrow compute rather than per row.
    """
    decode = _DECODER.decode
    normalise = _normalise
    max_bytes, long_line, max_depth = MAX_LINE_BYTES, LONG_LINE, MAX_DEPTH
    parsed: list[tuple] = []
    append = parsed.append
    dropped: list[int] = []  # lines without a row (quarantined or skipped), rare
    drop = dropped.append
    quarantined: list[Quarantined] = []
    skipped = 0
    start = line_no
    first = line_no + 1 if (line_no == 0 if file_start is None else file_start) else -1
    counting = bracketed is None
    many = frozenset(line_no + 1 + i for i in bracketed) if bracketed else frozenset()
    for raw in lines:
        line_no += 1
        if line_no == first and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        # line_guard(raw), inlined (about 0.3 us a line less): the bracket count is its fast
        # path, json_too_deep runs only on a line with more opening brackets than the limit
        # (counted here, or for a whole region by _bracketed_lines: 0.26 us a line less)
        if len(raw) > max_bytes or raw == long_line:
            quarantined.append(Quarantined(ctx.location, line_no, LINE_TOO_LONG, None))
            drop(line_no)
            continue
        if (raw.count(b"[") + raw.count(b"{") > max_depth if counting else line_no in many) \
                and json_too_deep(raw):
            quarantined.append(Quarantined(ctx.location, line_no, TOO_DEEP, None))
            drop(line_no)
            continue
        try:
            t = normalise(decode(raw))
            if t[0] is None:
                t = (record_digest_id(raw), *t[1:])
        except _Skip:
            skipped += 1
            drop(line_no)
            continue
        except _Bad as exc:
            # (not UTF-8 first: the fault of the whole line, checked on bad lines only)
            bad_text = not_utf8_reason(raw)
            quarantined.append(Quarantined(ctx.location, line_no, bad_text or exc.reason,
                                           None if bad_text else exc.field))
            drop(line_no)
            continue
        except msgspec.MsgspecError as exc:
            drop(line_no)
            if not raw.strip():
                skipped += 1  # a blank line
                continue
            # a line that decoded (a wrong type) or failed on UTF-8: say where the bad byte
            # is; a malformed line keeps its first fault (a bad UTF-8 byte before the
            # decoder's fault is the first)
            bad_text = not_utf8_reason(raw) if isinstance(exc, msgspec.ValidationError) \
                or "UTF-8" in str(exc) else None
            field, reason = (None, bad_text) if bad_text else _split_error(exc, raw)
            quarantined.append(Quarantined(ctx.location, line_no, reason, field))
            continue
        append(t)
    # the rows' line numbers: every line's but the dropped ones' (no list built per row)
    line_nos = np.arange(start + 1, line_no + 1, dtype=np.int64)
    if dropped:
        line_nos = np.delete(line_nos, np.asarray(dropped, dtype=np.int64) - (start + 1))
    return _columns_to_arrow(parsed, line_nos, ctx), quarantined, skipped


_NULL_STRING = pa.scalar(None, pa.string())


def _or_default(values: pa.Array, default: str | None) -> pa.Array:
    """``value or default`` for a string column (empty text counts as missing, like Python's
    ``or``)."""
    empty = pc.equal(values, "")
    if default is None:
        return pc.if_else(empty, _NULL_STRING, values)
    return pc.if_else(pc.or_kleene(pc.is_null(values), empty), default, values)


def _columns_to_arrow(parsed: list[tuple], line_nos: Sequence[int], ctx: _LineContext
                      ) -> pa.Table:
    """:func:`_normalise` tuples of the lines numbered ``line_nos`` -> the ``requests`` Arrow
    table, the file's defaults filled in: ``ctx.run_id`` where a line names no run (lines
    without a request id already carry :func:`record_digest_id`), the file mtime (``ts_estimated`` true) where
    it gives no time, ``ctx.default_model``/``ctx.instance`` where it names none (or "")."""
    n = len(parsed)
    if n == 0:
        return _KEYED_SCHEMA.empty_table()
    # The tuples converted as one struct array and split into its fields: Arrow's converter
    # walks the tuples once (0.34 us a row, against 0.76 us for zip(*parsed) and an array
    # per column; the same arrays).
    (rid, ts_arr, est_arr, run_arr, model, instance, *tail) = \
        pa.array(parsed, type=_PARSED).flatten()
    if ts_arr.null_count:
        est_arr = pc.if_else(pc.is_null(ts_arr), True, est_arr)
        ts_arr = pc.fill_null(ts_arr, ctx.mtime)
    if run_arr.null_count:
        run_arr = pc.fill_null(run_arr, ctx.run_id)
    head = [run_arr, rid, pa.repeat(ctx.source_id, n),
            pa.array(line_nos, pa.int64()), ts_arr, est_arr,
            _or_default(model, ctx.default_model), _or_default(instance, ctx.instance)]
    return pa.Table.from_arrays(head + tail + [_keys(run_arr, rid)], schema=_KEYED_SCHEMA)


def _keys(run_ids: pa.Array, request_ids: pa.Array) -> pa.Array:
    """Each row's ``request_key`` (a UUID array), as :data:`prefixscope.store.schema.REQUEST_KEY_SQL`
    computes it: the MD5 of ``<characters of run_id>:<run_id><request_id>`` (UTF-8), its 16
    bytes read as DuckDB's ``md5_number`` reads them (little-endian, so the UUID's bytes are
    the digest's reversed). Computed here, in the parser processes, so that the writer does
    not stage the batch to compute them; the table's CHECK recomputes each key at the
    insert, so a row whose key were wrong is refused, never stored (the writer then falls
    back to computing the keys itself). Both arrays without nulls."""
    text = pc.binary_join_element_wise(
        pc.cast(pc.utf8_length(run_ids), pa.string()),
        pc.binary_join_element_wise(run_ids, request_ids, ""), ":")
    md5 = hashlib.md5
    digests = b"".join([md5(b).digest() for b in pc.cast(text, pa.binary()).to_pylist()])
    flipped = np.frombuffer(digests, np.uint8).reshape(-1, 16)[:, ::-1].tobytes()
    return pa.ExtensionArray.from_storage(pa.uuid(), pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), len(run_ids), [None, pa.py_buffer(flipped)]))


#: The Arrow type of a :func:`_normalise` tuple (its field order, the ``requests`` types).
_PARSED = pa.struct(
    [pa.field(n, t) for n, t in (("request_id", pa.string()), ("ts_unix_s", pa.float64()),
                                 ("ts_estimated", pa.bool_()), ("run_id", pa.string()),
                                 ("model", pa.string()), ("instance", pa.string()))]
    + [pa.field(n, t) for n, t in _COLUMNS[8:]])


def _open(path: str | os.PathLike[str]):
    """Open a usage log (refusing FIFOs, devices, folders and binary files up front)."""
    fh = open_source_file(str(path))
    try:
        return fh, os.fstat(fh.fileno()).st_mtime
    except OSError as exc:
        fh.close()
        raise SourceUnavailable(f"cannot read {path}: {exc.strerror or exc}") from exc


def fetch_usage(path: str | os.PathLike[str], *, start: Checkpoint, source_id: str,
                run_id: str = "", instance: str | None = None, default_model: str | None = None,
                batch_rows: int = BATCH_ROWS) -> Iterator[UsageBatch]:
    """Read a usage JSONL file from ``start`` and yield parsed batches (reads only; one thread).

    A final line without a newline is consumed only if it is complete JSON (a writer may still
    be writing it); otherwise it is left for the next run.

    Args:
        path: the JSONL file.
        start: where to begin (byte offset, lines already read).
        source_id: stored with each row.
        run_id, instance, default_model: used when a line carries none.
        batch_rows: lines per batch.

    Yields:
        :class:`UsageBatch` objects, file order; checkpoints without fingerprint.

    Raises:
        SourceUnavailable: the file cannot be opened.
    """
    fh, mtime = _open(path)
    ctx = _context(path, source_id, run_id, instance, default_model, mtime)
    with fh:
        fh.seek(start.offset)
        offset, line_no = start.offset, start.line
        lines: list[bytes] = []
        runs = bounded_line_runs(fh, READ_BYTES, str(path))
        for data, nbytes in runs:
            parts = data[:-1].split(b"\n")
            if nbytes != len(data):  # the run starts with the stand-in of an over-long line
                parts[0] = _Long(parts[0], nbytes - len(data) + len(LONG_LINE))
            lines.extend(parts)
            while len(lines) >= batch_rows:
                part, lines = lines[:batch_rows], lines[batch_rows:]
                rows, quarantined, skipped = _parse_lines_arrow(part, line_no, ctx)
                offset += _file_bytes(part)
                line_no += len(part)
                yield UsageBatch(rows, quarantined, skipped, Checkpoint(offset, line_no, None))
        tail = runs.tail
        chunk_end = bool(tail) and complete_json_tail(tail)
        if lines or chunk_end:
            n_bytes = _file_bytes(lines)
            if chunk_end:
                lines.append(tail)
                n_bytes += len(tail)
            rows, quarantined, skipped = _parse_lines_arrow(lines, line_no, ctx)
            offset += n_bytes
            line_no += len(lines)
            yield UsageBatch(rows, quarantined, skipped, Checkpoint(offset, line_no, None))


class _Long(bytes):
    """The stand-in of an over-long line (:data:`~ingest.jsonl_driver.LONG_LINE`) with the
    byte length of the line it stands for (newline excluded)."""

    nbytes: int

    def __new__(cls, value: bytes, nbytes: int) -> _Long:
        obj = super().__new__(cls, value)
        obj.nbytes = nbytes
        return obj


def _file_bytes(lines: list[bytes]) -> int:
    """Bytes the complete ``lines`` take in the file, newlines included."""
    return sum(x.nbytes if type(x) is _Long else len(x) for x in lines) + len(lines)


#: Files (from their checkpoint) at least this large are parsed by a pool of processes.
PARALLEL_MIN_BYTES = 64 << 20
#: Regions submitted to the parser processes ahead of the one being consumed: enough to keep
#: them busy while the caller inserts a merged batch of :data:`INSERT_ROWS` rows.
AHEAD_REGIONS = 8
#: Bytes of complete lines per parallel batch (about 45,000 lines of 550 bytes).
REGION_BYTES = 24 << 20


def _parse_region(path: str, offset: int, nbytes: int, file_start: bool, ctx: _LineContext
                  ) -> tuple[pa.Table, list[Quarantined], int, int]:
    """Parse the complete lines in ``[offset, offset + nbytes)`` (runs in a parser process),
    numbered from 1 within the region (the caller adds the lines before it, which it learns
    only from the earlier regions' results: counting them in the caller cost it 0.25 s of CPU
    per 550 MB). ``file_start``: the region starts at the file's first line.

    Returns:
        (rows, quarantined, skipped, lines in the region).
    """
    with open(path, "rb") as fh:
        fh.seek(offset)
        buf = fh.read(nbytes)
    lines = buf.split(b"\n")
    lines.pop()  # the region ends with a newline
    return (*_parse_lines_arrow(lines, 0, ctx, file_start=file_start,
                                bracketed=_bracketed_lines(buf)), len(lines))


#: Every byte but the opening brackets and the newline (deleted by :func:`_bracketed_lines`).
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[{\n")


def _bracketed_lines(buf: bytes) -> frozenset[int]:
    """The positions (from 0) of the lines of ``buf`` (split at each newline) holding more
    than :data:`~prefixscope.core.bounds.MAX_DEPTH` opening brackets (``[`` or ``{``), the
    only lines that can nest deeper than it: all bytes but the brackets and newlines are
    deleted in one pass (C), so each remaining piece's length is its line's bracket count.
    The same count as ``line.count(b"[") + line.count(b"{")`` per line, at half its cost."""
    pieces = buf.translate(None, _NOT_BRACKETS).split(b"\n")
    if max(map(len, pieces)) <= MAX_DEPTH:
        return frozenset()
    return frozenset(i for i, p in enumerate(pieces) if len(p) > MAX_DEPTH)


def _renumbered(table: pa.Table, quarantined: list[Quarantined], base: int
                ) -> tuple[pa.Table, list[Quarantined]]:
    """A region's rows and quarantine entries with ``base`` (the lines before the region) added
    to their line numbers."""
    if base == 0:
        return table, quarantined
    if table.num_rows:
        i = table.schema.get_field_index("line")
        table = table.set_column(i, "line", pc.add(table.column(i), pa.scalar(base, pa.int64())))
    return table, [Quarantined(q.location, q.line + base, q.reason, q.field) for q in quarantined]


def _worker_init(parent_pid: int | None = None) -> None:
    """Set up a parser process: no cyclic GC, Ctrl-C ignored, and die with the parent.

    A terminal's Ctrl-C sends SIGINT to the whole process group: the parent (the CLI) turns it
    into one line and exit 130 and rolls back its open batch, so a parser ignores it (else each
    idle parser would print a KeyboardInterrupt traceback from its queue wait). On Linux,
    ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` has the kernel kill this process when the process
    that forked it ends, however it ends (a SIGKILL of the ingest included), so a parser never
    outlives it holding memory and the caller's stdout; if the parent is already gone when
    this runs, exit at once."""
    import signal

    gc.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)


def die_with_parent(parent_pid: int | None) -> None:
    """Ask the kernel to SIGKILL this process when its parent ends (Linux ``prctl``; elsewhere
    a no-op), and exit now if the parent ``parent_pid`` has already gone."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def fetch_usage_parallel(path: str | os.PathLike[str], *, start: Checkpoint, source_id: str,
                         run_id: str = "", instance: str | None = None,
                         default_model: str | None = None, workers: int = 1,
                         region_bytes: int | None = None, ahead: int | None = None
                         ) -> Iterator[UsageBatch]:
    """As :func:`fetch_usage`, but the lines are parsed by ``workers`` processes (forked: they
    run only the pure parsing code, never DuckDB), one region of about ``region_bytes`` of
    complete lines each, while the caller inserts earlier ones; batches are still yielded in
    file order, so checkpoints advance in order. Up to ``ahead`` regions (default the larger of
    :data:`AHEAD_REGIONS` and ``2 * workers``) are parsed ahead of the consumer, each held as
    an Arrow table of about 8 MB per 45,000 rows until consumed. A line longer than
    :data:`~prefixscope.core.bounds.MAX_LINE_BYTES` that does not fit in a region is never read:
    its end is found by scanning the memory map in bounded steps and the line is quarantined
    (``line longer than ...``); an unfinished last line longer than the bound is left unread.

    Raises:
        SourceUnavailable: the file cannot be opened.
    """
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    region_bytes = region_bytes or REGION_BYTES
    ahead = max(1, ahead if ahead is not None else max(AHEAD_REGIONS, 2 * workers))
    fh, mtime = _open(path)
    ctx = _context(path, source_id, run_id, instance, default_model, mtime)
    location = str(path)
    with fh, ProcessPoolExecutor(max_workers=workers, initializer=_worker_init,
                                 initargs=(os.getpid(),),
                                 mp_context=multiprocessing.get_context("fork")) as pool:
        size = os.fstat(fh.fileno()).st_size
        offset = start.offset
        line_no = start.line  # lines before the next region to drain (counted as drained)
        inflight: deque = deque()  # (future or None for an over-long line, end offset)

        def drain(limit: int, tail_follows: bool = True) -> Iterator[UsageBatch]:
            # ``last``: with limit >= 1 another region is always in flight after this one;
            # at the end (limit 0) the last one is the last batch unless a tail follows
            nonlocal line_no
            while len(inflight) > limit:
                fut, end = inflight.popleft()
                last = not inflight and not tail_follows
                if fut is None:  # an over-long line, skipped unread
                    line_no += 1
                    yield UsageBatch(_KEYED_SCHEMA.empty_table(),
                                     [Quarantined(location, line_no, LINE_TOO_LONG, None)], 0,
                                     Checkpoint(end, line_no, None), last)
                    continue
                table, quarantined, skipped, n = fut.result()
                table, quarantined = _renumbered(table, quarantined, line_no)
                line_no += n
                yield UsageBatch(table, quarantined, skipped, Checkpoint(end, line_no, None),
                                 last)

        # Region boundaries from a memory map: the parser processes read the bytes themselves,
        # this process only finds the last newline of each region (they count its lines).
        with (mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else
              _NoMap()) as mm:
            while offset < size:
                cut = mm.rfind(b"\n", offset, min(offset + region_bytes, size))
                if cut < 0:  # the region holds no line end: a line of more than a region?
                    cut = mm.find(b"\n", offset, min(offset + MAX_LINE_BYTES + 1, size))
                if cut < 0:  # a line longer than the bound: skipped, never read whole
                    end = _find_newline(mm, offset + MAX_LINE_BYTES + 1, size)
                    if end < 0:
                        break  # no newline to the end: an unfinished line, left for later
                    offset = end + 1
                    inflight.append((None, offset))
                    yield from drain(ahead)
                    continue
                _release(mm, offset, cut + 1)
                fut = pool.submit(_parse_region, location, offset, cut + 1 - offset,
                                  offset == start.offset and start.line == 0, ctx)
                offset = cut + 1
                inflight.append((fut, offset))
                yield from drain(ahead)
            # an unfinished last line is read only when short enough to be a record
            pending = mm[offset:size] if 0 < size - offset <= MAX_LINE_BYTES else b""
        tail = bool(pending) and complete_json_tail(pending)
        yield from drain(0, tail_follows=tail)
    if tail:
        rows, quarantined, skipped = _parse_lines_arrow([pending], line_no, ctx)
        yield UsageBatch(rows, quarantined, skipped,
                         Checkpoint(offset + len(pending), line_no + 1, None), True)


#: Bytes scanned at a time for the end of an over-long line (pages dropped after each step).
_SCAN_BYTES = 8 << 20


def _find_newline(mm: mmap.mmap, start: int, size: int) -> int:
    """The offset of the first newline at or after ``start``, or -1: scanned in steps of
    :data:`_SCAN_BYTES`, each step's pages dropped from this process, so a line of any length
    (or a file of zeros) is skipped in bounded memory."""
    pos = start
    while pos < size:
        end = min(pos + _SCAN_BYTES, size)
        nl = mm.find(b"\n", pos, end)
        _release(mm, pos, end)
        if nl >= 0:
            return nl
        pos = end
    return -1


def _release(mm: mmap.mmap, start: int, end: int) -> None:
    """Drop the mapped pages of ``[start, end)`` from this process (they stay in the page
    cache): counting a region's lines must not leave the whole file in our resident memory."""
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        first = start - start % mmap.PAGESIZE
        mm.madvise(mmap.MADV_DONTNEED, first, end - first)


class _NoMap:
    """Stands in for the memory map of an empty file (which cannot be mapped)."""

    def __enter__(self) -> _NoMap:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


#: Rows per transaction when parsing in processes: parsed regions are merged up to this many
#: rows before their insert (each transaction pays a key check, its rollup updates and a
#: commit; see docs/benchmarks.md "Usage-log ingest").
INSERT_ROWS = 200_000


def _merged(batches: Iterator[UsageBatch], min_rows: int) -> Iterator[UsageBatch]:
    """Consecutive batches (rows as Arrow tables) merged until at least ``min_rows`` rows; each
    merged batch carries the checkpoint of its last part, so it still commits as one unit."""
    parts: list[UsageBatch] = []
    n = 0

    def merge() -> UsageBatch:
        tables = [b.rows for b in parts]
        return UsageBatch(pa.concat_tables(tables) if len(tables) > 1 else tables[0],
                          [q for b in parts for q in b.quarantined],
                          sum(b.skipped for b in parts), parts[-1].checkpoint)

    for batch in batches:
        parts.append(batch)
        n += batch.rows.num_rows
        if n >= min_rows:
            yield merge()
            parts, n = [], 0
    if parts:
        yield merge()


def rows_to_arrow(rows: list[tuple]) -> pa.Table:
    """Row tuples (``requests`` column order) -> an Arrow table with the ``requests`` types."""
    cols = list(zip(*rows)) if rows else [()] * len(_COLUMNS)
    return pa.Table.from_arrays(
        [pa.array(c, type=t) for c, (_, t) in zip(cols, _COLUMNS)], schema=_SCHEMA)
