"""Usage-log ingest: JSONL of per-request usage objects into the ``requests`` table.

The accepted shapes and their normalisation (inclusive ``prompt_tokens``, NULL vs 0
``cached_tokens``, the cache read/write split, privacy) are in :mod:`prefixscope.ingest.usage_shapes`;
reading a file from its checkpoint into Arrow batches (in forked parser processes for large
files) is :mod:`prefixscope.ingest.usage_read`. This module writes: each batch goes to DuckDB with
``INSERT`` once its keys are checked (only the new keys once one repeats), committed together with its
quarantine entries and the file checkpoint (``ingest/bookkeeping.py``), so a crash repeats
nothing and a second run adds nothing.
"""

from __future__ import annotations

import gc
import os
import time

import duckdb
import pyarrow as pa

from prefixscope.ingest.bookkeeping import (
    Checkpoint,
    IngestSummary,
    Quarantined,
    fingerprint_upto,
    new_ingest_run_id,
    resume_offset,
    source_id_for,
)
from prefixscope.ingest.jsonl_driver import TAIL_LEFT_NOTE, RetryBatch, commit_batch
from prefixscope.ingest.usage_read import (
    _COLUMN_LIST,
    BATCH_ROWS,
    INSERT_ROWS,
    PARALLEL_MIN_BYTES,
    READ_BYTES,
    REGION_BYTES,
    UsageBatch,
    fetch_usage,
    fetch_usage_parallel,
    rows_to_arrow,
)
from prefixscope.ingest.usage_shapes import MS_THRESHOLD, UsageRecord, normalise_usage
from prefixscope.core.bounds import check_regular
from prefixscope.core.errors import SourceUnavailable
from prefixscope.store.db import BatchConnection, no_progress_bar, release_between_batches
# imported with this module, not at the first batch: it brings core.config (pydantic), which
# the CLI has loaded before any ingest, but which cost an ingest timed on its own 0.1-0.2 s
from prefixscope.store.queries.requests import insert_new_request_rows, insert_request_rows

__all__ = [
    "BATCH_ROWS", "INSERT_ROWS", "KIND", "MS_THRESHOLD", "PARALLEL_MIN_BYTES", "PROBLEMS_RETURNED",
    "READ_BYTES", "REGION_BYTES", "UsageBatch", "UsageRecord", "fetch_usage",
    "fetch_usage_parallel", "ingest_usage_file", "ingest_usage_file_detailed", "normalise_usage",
    "rows_to_arrow", "save_usage_rows",
]

KIND = "requests"


def save_usage_rows(con: duckdb.DuckDBPyConnection, rows: list[tuple] | pa.Table, *,
                    assume_new: bool = False) -> int:
    """Insert rows (tuples in ``requests`` column order, or their Arrow table) into
    ``requests``; rows whose (run_id, request_id) exists are skipped. Runs inside the caller's
    transaction. Returns the number of rows added.

    With ``assume_new`` the keys are checked and the rows inserted as they are (faster); it
    raises ``duckdb.ConstraintException`` on any stored or repeated key, after which the caller rolls back and
    calls again without ``assume_new``."""
    table = rows if isinstance(rows, pa.Table) else rows_to_arrow(rows)
    if table.num_rows == 0:
        return 0
    insert = insert_new_request_rows if assume_new else insert_request_rows
    return insert(con, table, _COLUMN_LIST)


class _Inserter:
    """The ``requests`` inserter for :func:`prefixscope.ingest.jsonl_driver.commit_batch`: rows from new
    lines are nearly always new keys, so the checked plain ``INSERT`` is tried first; on a
    stored or repeated key the batch is rolled back (:class:`~ingest.jsonl_driver.RetryBatch`)
    and this and every later batch insert only the keys not stored."""

    def __init__(self) -> None:
        self.assume_new = True

    def __call__(self, con: duckdb.DuckDBPyConnection, table: pa.Table) -> int:
        if not self.assume_new:
            return save_usage_rows(con, table)
        try:
            return save_usage_rows(con, table, assume_new=True)
        except duckdb.ConstraintException:
            self.assume_new = False
            raise RetryBatch from None


def ingest_usage_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                      run_id: str | None = None, instance: str | None = None,
                      default_model: str | None = None, batch_rows: int = BATCH_ROWS,
                      workers: int | None = None) -> IngestSummary:
    """Ingest one usage JSONL file into ``requests``; see :func:`ingest_usage_file_detailed`
    (this returns only its summary)."""
    return ingest_usage_file_detailed(con, path, run_id=run_id, instance=instance,
                                      default_model=default_model, batch_rows=batch_rows,
                                      workers=workers)[0]


#: How many quarantine entries :func:`ingest_usage_file_detailed` returns (all are stored).
PROBLEMS_RETURNED = 100


def ingest_usage_file_detailed(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                               run_id: str | None = None, instance: str | None = None,
                               default_model: str | None = None, batch_rows: int = BATCH_ROWS,
                               workers: int | None = None
                               ) -> tuple[IngestSummary, list[Quarantined]]:
    """Ingest one usage JSONL file into ``requests``, from its checkpoint on.

    Each batch is committed in one transaction with its quarantine entries and the new
    checkpoint (offset, line, fingerprint), the last one also with the ``ingest_runs`` record
    (:func:`prefixscope.ingest.jsonl_driver.commit_batch`; this module keeps its own file reading, which
    parses regions in processes straight from the file). Safe to run twice: the key check on
    ``request_key`` (a 128-bit digest of ``(run_id, request_id)``, migrations 9 and 79) and
    the checkpoint make a second run add nothing.

    Args:
        con: a read-write, migrated connection, not inside a transaction; a
            :class:`~prefixscope.store.db.BatchConnection` is released between batches (the
            file is held only while a batch is written).
        path: the JSONL file.
        run_id: for lines without ``run_id`` (default ``''``, production traffic).
        instance: for lines without ``instance``.
        default_model: for lines whose record and response name no model.
        batch_rows: lines per batch when parsed in this process.
        workers: parser processes; 0 = parse in this process. Default: 0 when less than
            :data:`PARALLEL_MIN_BYTES` remain to be read, else one per CPU (at most 4): the
            parse costs about 1.7 times the CPU of the insert, so on 2 CPUs two parser
            processes sharing with the insert beat one parser alone. With workers, the file is
            cut into regions of about :data:`REGION_BYTES` of complete lines, parsed while
            earlier ones are inserted; consecutive regions are merged into transactions of up
            to :data:`INSERT_ROWS` rows, committed in file order. Either way the transactions
            are paced (:func:`_paced`): when one held the file longer than
            :data:`TARGET_HOLD_S`, the next ones take fewer rows (at least
            :data:`MIN_TX_ROWS`).

    Returns:
        (:class:`IngestSummary`, the first :data:`PROBLEMS_RETURNED` lines quarantined by this
        call, file order). The summary counts rows read/added/duplicate/quarantined; its
        ``note`` counts skipped lines and says when the file had nothing new.

    Raises:
        SourceUnavailable: the file does not exist or cannot be read.
    """
    location = str(path)
    try:
        check_regular(location)  # a FIFO or a device is refused before it is opened
    except OSError as exc:
        raise SourceUnavailable(f"cannot read {location}: {exc}") from None
    started = time.time()
    source_id = source_id_for(KIND, location)
    start = resume_offset(con, source_id, path)
    ingest_run_id = new_ingest_run_id()
    read = added = n_quarantined = skipped = reinterpreted = 0
    end_offset = start.offset  # the byte after the last line consumed so far
    problems: list[Quarantined] = []
    insert = _Inserter()
    no_progress_bar(con)  # never draw on the caller's terminal
    release_between_batches(con)  # a batch writer: not held while the first batch is parsed
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of small acyclic objects: collection passes only cost time
    try:
        kwargs = dict(start=start, source_id=source_id, run_id=run_id or "",
                      instance=instance, default_model=default_model)
        if workers is None:
            big = os.path.getsize(path) - start.offset >= PARALLEL_MIN_BYTES
            workers = max(1, min(os.cpu_count() or 1, 4)) if big else 0
        pacer = _Pacer(INSERT_ROWS if workers > 0 else batch_rows)
        batches = iter(_paced(fetch_usage_parallel(path, workers=workers, **kwargs)
                              if workers > 0 else fetch_usage(path, batch_rows=batch_rows,
                                                              **kwargs), pacer))
        cur = next(batches, None)
        if cur is None:  # nothing new: the run is still recorded (checkpoint kept as stored)
            cur = UsageBatch(rows_to_arrow([]), [], 0, None, True)
        while cur is not None:
            # the last batch carries the run record: when the reader cannot tell whether this
            # is its last, look one batch ahead (the commit then waits for its parse)
            if cur.last is None:
                nxt = next(batches, None)
                last = nxt is None
            else:
                nxt, last = _NOT_ASKED, cur.last
            read += cur.rows.num_rows
            reinterpreted += _reinterpreted(cur.rows)
            n_quarantined += len(cur.quarantined)
            skipped += cur.skipped
            if len(problems) < PROBLEMS_RETURNED:
                problems.extend(cur.quarantined[:PROBLEMS_RETURNED - len(problems)])
            cp = cur.checkpoint
            if cp is not None:
                cp = Checkpoint(cp.offset, cp.line, fingerprint_upto(path, cp.offset))
                end_offset = cp.offset
            run_summary = None
            if last:
                run_summary = summary_of = _summary(location, start, read, added, n_quarantined,
                                                    skipped, reinterpreted, end_offset)
            t_commit = time.monotonic()
            waited = con.wait_s if isinstance(con, BatchConnection) else 0.0
            released: list[bool] = []
            n = commit_batch(
                con, insert=insert, rows=cur.rows, quarantined=cur.quarantined,
                source_id=source_id, kind=KIND, location=location,
                ingest_run_id=ingest_run_id, checkpoint=cp, run_summary=run_summary,
                started_unix_s=started, released=released)
            # the time the transaction took, without waiting for the lock
            held = time.monotonic() - t_commit - \
                ((con.wait_s - waited) if isinstance(con, BatchConnection) else 0.0)
            pacer.update(cur.rows.num_rows + len(cur.quarantined), held, any(released))
            added += n
            if nxt is _NOT_ASKED:
                nxt = next(batches, None)
                if nxt is None and not last:  # (never expected) the run record on its own
                    nxt = UsageBatch(rows_to_arrow([]), [], 0, None, True)
            cur = nxt
    finally:
        if gc_was_enabled:
            gc.enable()
    return summary_of(n), problems  # the last batch's n


#: ``nxt`` of :func:`ingest_usage_file_detailed` before the next batch is asked for.
_NOT_ASKED = object()


#: Target time one write transaction holds the database file while other processes wait for
#: it, seconds: batches shrink (down to :data:`MIN_TX_ROWS`) when their insert took longer, and
#: grow back up to the batch size when no one waits (docs/ingest.md#bounds).
TARGET_HOLD_S = 1.0
#: Fewest rows (plus quarantined lines) per transaction when pacing shrinks them: each release
#: also pays a checkpoint when the file is closed (0.1 s to seconds on a loaded machine,
#: growing with the table), so smaller ones would cost more lock time than they save.
MIN_TX_ROWS = 20_000


#: Rows of the first transactions, before a hold time has been measured.
FIRST_TX_ROWS = 50_000


class _Pacer:
    """How many rows (good rows plus quarantined lines) the next transaction takes. While other
    processes wait for the file (the last commit released it to them): the rate of the last
    transaction times :data:`TARGET_HOLD_S`, within [:data:`MIN_TX_ROWS`, ``max_rows``], so
    they wait about that long; while no one waits: twice the last size, up to ``max_rows``
    (large transactions insert fastest). Starts at :data:`FIRST_TX_ROWS` (at most
    ``max_rows``): on a loaded machine a first transaction of 200,000 rows held the file for
    8 to 40 s."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max(1, max_rows)
        self.want = min(self.max_rows, FIRST_TX_ROWS)

    def update(self, cost: int, held_s: float, contended: bool) -> None:
        if cost <= 0:
            return
        if not contended:
            self.want = min(self.max_rows, max(self.want, cost) * 2)
            return
        rate = cost / max(held_s, 1e-3)
        self.want = int(min(self.max_rows, max(min(MIN_TX_ROWS, self.max_rows),
                                               rate * TARGET_HOLD_S)))


def _paced(batches, pacer: _Pacer):
    """Parsed batches regrouped into transactions of about ``pacer.want`` rows plus quarantined
    lines: consecutive batches are merged up to it; a batch with more rows is split, its first
    parts committed without a checkpoint (the stored one stays: a crash re-reads them, and the
    key check drops what was stored), its last part carrying its checkpoint and quarantine
    entries. Checkpoints advance in file order; memory stays at the parsed batches held."""
    tables: list[pa.Table] = []
    quarantined: list[Quarantined] = []
    skipped = 0
    checkpoint = None
    n = 0
    last = None  # the reader's ``last`` of the batch merged last
    for b in batches:
        tables.append(b.rows)
        quarantined.extend(b.quarantined)
        skipped += b.skipped
        checkpoint = b.checkpoint if b.checkpoint is not None else checkpoint
        n += b.rows.num_rows
        last = b.last
        if n + len(quarantined) + skipped < pacer.want:  # lines, for the per-process batches
            continue
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        while table.num_rows >= 2 * max(pacer.want, MIN_TX_ROWS):  # split off transactions
            w = max(1, pacer.want)
            yield UsageBatch(table.slice(0, w), [], 0, None, False)  # its rest follows
            table = table.slice(w)
        # the reader's answer holds: after a batch it knows is not its last, another comes
        # (with a checkpoint), so this generator yields again after this one
        yield UsageBatch(table, quarantined, skipped, checkpoint, last)
        tables, quarantined, skipped, checkpoint, n, last = [], [], 0, None, 0, None
    if tables or quarantined or checkpoint is not None:
        table = pa.concat_tables(tables) if len(tables) > 1 else (tables[0] if tables else
                                                                   rows_to_arrow([]))
        yield UsageBatch(table, quarantined, skipped, checkpoint, last)


#: The flag of a row whose cached tokens exceeded its prompt tokens (read as exclusive input).
REINTERPRETED_FLAG = "exclusive-input-suspected"


def _reinterpreted(rows: pa.Table) -> int:
    """Rows of a batch flagged :data:`REINTERPRETED_FLAG` (one vectorised pass on ``flags``)."""
    import pyarrow.compute as pc

    if rows.num_rows == 0 or "flags" not in rows.column_names:
        return 0
    hit = pc.match_substring(rows.column("flags"), REINTERPRETED_FLAG)
    return int(pc.sum(hit).as_py() or 0)


def reinterpreted_note(n: int) -> str:
    """The note of ``ingest requests`` when ``n`` > 0 rows were reinterpreted."""
    return (f"{n:,} request{'s' if n != 1 else ''} had cached tokens above prompt tokens: "
            "read as exclusive input (prompt = input + cache reads + writes, flag "
            f"{REINTERPRETED_FLAG}; docs/ingest.md)")


def _summary(location: str, start: Checkpoint, read: int, added_before: int, n_quarantined: int,
             skipped: int, reinterpreted: int = 0, end_offset: int | None = None):
    """The call's summary once the last batch adds ``n`` rows (``added_before`` were added by
    the earlier batches): ``n -> IngestSummary``. ``end_offset``: the byte after the last line
    consumed (bytes past it, an unfinished last line, are left for the next run and noted)."""
    notes = []
    try:
        size = os.stat(location).st_size
    except OSError:
        size = start.offset if end_offset is None else end_offset
    if read == 0 and n_quarantined == 0 and skipped == 0:
        notes.append(TAIL_LEFT_NOTE if size > start.offset else
                     "no new lines since the last ingest" if start.offset else "empty file")
    elif end_offset is not None and size > end_offset:  # lines read, an unfinished one left
        notes.append(TAIL_LEFT_NOTE)
    if skipped:
        notes.append(f"{skipped} lines skipped (blank, or stream chunks without usage)")
    if reinterpreted:
        notes.append(reinterpreted_note(reinterpreted))
    note = "; ".join(notes) or None

    def summary(n: int) -> IngestSummary:
        return IngestSummary(source=location, kind=KIND, rows_read=read,
                             rows_added=added_before + n, rows_duplicate=read - added_before - n,
                             rows_quarantined=n_quarantined, note=note,
                             rows_reinterpreted=reinterpreted)

    return summary
