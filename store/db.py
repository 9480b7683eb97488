"""Opening the DuckDB file, applying migrations, and the locking protocol.

DuckDB lets one process write a database file, or several processes read it, never both at
once. prefixscope therefore never holds a connection open between units of work:

1. Writers open the file read-write for one unit of work inside :func:`writer`, commit, and
   close; a long-running scraper does this once per scrape. A file ingester holds a
   :func:`batch_writer`: each batch (rows, quarantine entries and the checkpoint) is one
   transaction, and after its commit the file is closed whenever another process waits for it
   (and opened again for the next batch), so other processes get in between batches however
   long the file.
2. Readers (dashboard, reports) open it read-only inside :func:`reader` for one set of queries
   and close it; the dashboard caches the results (TTL) rather than the connection.
3. Both retry a lock conflict with backoff (10 ms doubling to 0.5 s) for ``lock_timeout_s``
   (default 30 s), then raise :class:`~prefixscope.core.errors.StoreLocked`.
4. Fairness: a process that found the file locked holds a shared ``flock`` on
   ``<file>.waiting`` until it gets in; a writer about to open the file first waits (at most
   :data:`YIELD_MAX_S`) until no one holds that, so a writer committing batch after batch
   cannot starve the readers and scrapers that wait for it (their retries would otherwise
   rarely fall into the milliseconds between two batches).

See ``docs/architecture.md#concurrency``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb

from prefixscope.core.bounds import not_regular_reason
from prefixscope.core.errors import SchemaMismatch, SourceUnavailable, StoreFull, StoreLocked
from prefixscope.store.schema import MIGRATIONS

DEFAULT_LOCK_TIMEOUT_S = 30.0
#: Longest a writer waits, before opening the file, for the processes already waiting for it.
YIELD_MAX_S = 2.0


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text and ("conflicting" in text or "could not set lock" in text)


#: Appended to the error of a file that exists but is not a DuckDB database: what to do.
CORRUPT_HINT = (" (the file is not a database prefixscope can read: move it aside, or pass "
                "another --db, to start a new one)")


def _is_not_duckdb(exc: Exception) -> bool:
    """DuckDB's error for a file that is not a DuckDB database (random bytes, another format)."""
    return "not a valid DuckDB database file" in str(exc)


def connect(path: str | os.PathLike[str], *, read_only: bool = False,
            lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> duckdb.DuckDBPyConnection:
    """Open the DuckDB file, retrying while another process holds its lock.

    Args:
        path: database file, or ``:memory:`` for a private in-memory database.
        read_only: open without write access (required while another process may write).
        lock_timeout_s: seconds to keep retrying a lock conflict.

    Returns:
        An open connection. The caller closes it (prefer :func:`reader` / :func:`writer`).

    Raises:
        SourceUnavailable: ``read_only`` and the file does not exist; the path exists and is
            not a regular file (a FIFO, a device, a folder: DuckDB would block on a FIFO).
        StoreLocked: still locked after ``lock_timeout_s``.
    """
    p = str(path)
    if p != ":memory:":
        # DuckDB would block forever opening a FIFO (reader or writer): refuse any path that
        # exists and is not a regular file before DuckDB sees it.
        try:
            why = not_regular_reason(os.stat(p).st_mode)
        except OSError:
            why = None
        if why is not None:
            raise SourceUnavailable(f"cannot open database {p}: {why}")
        if read_only and not Path(p).exists():
            raise SourceUnavailable(
                f"no database at {p}: ingest something first (prefixscope ingest ...) or run make demo"
            )
        if not read_only:
            Path(p).parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + lock_timeout_s
    delay = 0.01
    waiting: int | None = None  # our shared flock on <file>.waiting while we wait
    try:
        if not read_only and p != ":memory:":
            _yield_to_waiters(p, min(YIELD_MAX_S, lock_timeout_s))
        while True:
            try:
                return duckdb.connect(p, read_only=read_only)
            except duckdb.IOException as exc:
                if not _is_lock_error(exc):
                    raise SourceUnavailable(f"cannot open database {p}: {exc}"
                                            f"{CORRUPT_HINT if _is_not_duckdb(exc) else ''}") from exc
                if time.monotonic() >= deadline:
                    raise StoreLocked(
                        f"database {p} stayed locked by another process for "
                        f"{lock_timeout_s:.0f} s") from exc
                if waiting is None:
                    waiting = _enter_waiting(p)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)
    finally:
        if waiting is not None and waiting >= 0:
            os.close(waiting)  # releases the flock


def _waiting_path(p: str) -> str:
    return p + ".waiting"


def _enter_waiting(p: str) -> int:
    """Take a shared flock on ``<file>.waiting`` (created if missing): "someone waits for the
    file". Returns the descriptor, or -1 when the folder is not writable (no fairness then)."""
    try:
        fd = os.open(_waiting_path(p), os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return -1
    return fd


def _yield_to_waiters(p: str, max_s: float) -> None:
    """Before a writer opens the file: wait up to ``max_s`` while another process holds a
    shared flock on ``<file>.waiting`` (it found the file locked and retries; it takes the file
    within its next backoff step and then drops the flock). No such file: return at once."""
    try:
        fd = os.open(_waiting_path(p), os.O_RDONLY)
    except OSError:
        return
    try:
        end = time.monotonic() + max_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= end:
                    return
                time.sleep(0.005)
                continue
            except OSError:
                return
            fcntl.flock(fd, fcntl.LOCK_UN)
            return
    finally:
        os.close(fd)


def migrate(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Apply every migration not yet recorded, in number order, each in one transaction.

    Returns:
        The numbers applied by this call (empty when the schema was current).

    Raises:
        SchemaMismatch: the database records a migration number this code does not know
            (it was written by a newer prefixscope).
    """
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " number INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_unix_s DOUBLE NOT NULL)"
    )
    done = {row[0] for row in con.execute("SELECT number FROM schema_migrations").fetchall()}
    known = {m.number for m in MIGRATIONS}
    unknown = sorted(done - known)
    if unknown:
        raise SchemaMismatch(
            f"database has schema migrations {unknown} that this prefixscope does not know: "
            "upgrade prefixscope"
        )
    applied: list[int] = []
    for m in sorted(MIGRATIONS, key=lambda m: m.number):
        if m.number in done:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            for stmt in m.statements:
                con.execute(stmt)
            con.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?)", [m.number, m.name, time.time()]
            )
            con.execute("COMMIT")
        except Exception:
            # a COMMIT that failed (a full disk) has ended the transaction: the first error is
            # the one to raise, never "cannot rollback - no transaction is active"
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        applied.append(m.number)
    return applied


def schema_version(con: duckdb.DuckDBPyConnection) -> list[int]:
    """The applied migration numbers, ascending (empty for a database never migrated)."""
    try:
        return [r[0] for r in con.execute(
            "SELECT number FROM schema_migrations ORDER BY number").fetchall()]
    except duckdb.CatalogException:
        return []


#: The system's words for a full device or quota (``os.strerror``), as DuckDB's I/O errors
#: quote them: an I/O error of DuckDB's type that carries one of them is :class:`StoreFull`.
_FULL_WORDS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
_IO_ERRORS = (duckdb.IOException, duckdb.TransactionException, duckdb.FatalException)


def store_full(path: str | os.PathLike[str], exc: BaseException) -> StoreFull | None:
    """The :class:`StoreFull` error for a write of the store at ``path`` that failed because
    its device or quota is full (DuckDB's I/O error types quoting the system's ``No space left
    on device`` / ``Disk quota exceeded``), else None.

    The one rule for a full disk: :func:`writer` and :func:`batch_writer` apply it to whatever
    their unit of work raises, so every ingester (and the OTLP receiver) says the same."""
    if not isinstance(exc, _IO_ERRORS):
        return None
    text = str(exc)
    if not any(w in text for w in _FULL_WORDS):
        return None
    return StoreFull(f"cannot write the database {path}: no space left on its device (or "
                     "quota); what was committed before is kept and the transaction in progress "
                     "was rolled back: free space and run the same command again (an ingest "
                     "continues from its checkpoint)")


@contextlib.contextmanager
def _full_is_an_error(path: str | os.PathLike[str], close) -> Iterator[None]:
    """Run a unit of work; a full device (:func:`store_full`) becomes :class:`StoreFull`, also
    at the closing checkpoint; a close after a failure never hides the failure."""
    try:
        yield
    except BaseException as exc:
        full = store_full(path, exc)
        with contextlib.suppress(duckdb.Error):
            close()
        if full is not None:
            raise full from None
        raise
    try:
        close()
    except duckdb.Error as exc:
        full = store_full(path, exc)
        if full is None:
            raise
        raise full from None


@contextlib.contextmanager
def writer(path: str | os.PathLike[str], *,
           lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-write connection for one unit of work, migrated, closed on exit.

    Raises:
        StoreLocked, SchemaMismatch, SourceUnavailable: see :func:`connect`, :func:`migrate`.
        StoreFull: the device or quota is full (:func:`store_full`).
    """
    opened: list[duckdb.DuckDBPyConnection] = []

    def close() -> None:
        if opened:
            opened[0].close()

    with _full_is_an_error(path, close):
        opened.append(connect(path, read_only=False, lock_timeout_s=lock_timeout_s))
        migrate(opened[0])
        yield opened[0]


class BatchConnection:
    """A read-write connection that holds the database file only while a batch is written.

    Every attribute is the open connection's (``execute``, ``register``, ...); the first use
    after :meth:`release` opens the file again (:func:`connect`, retrying a lock for
    ``lock_timeout_s``). :func:`prefixscope.ingest.jsonl_driver.commit_batch` releases it after
    a batch's commit whenever another process waits for the file (:func:`someone_waits`), so
    that process gets in before the next batch; with no one waiting the file stays open (a
    reopen costs a checkpoint of what the batch wrote: closing after every batch halved the
    usage ingest's speed). Connection settings given in
    ``settings`` are applied at every open. For ``:memory:`` :meth:`release` does nothing (closing
    would drop the database).

    Attributes:
        opens, releases: how many times the file was opened and released. longest_hold_s,
            last_hold_s: the longest and the last time the file was held open at once, seconds
            (open to release). wait_s: total seconds spent waiting to open it.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
                 settings: tuple[str, ...] = ("SET enable_progress_bar = false",)):
        self._path = str(path)
        self._lock_timeout_s = lock_timeout_s
        self._settings = settings
        self._con: duckdb.DuckDBPyConnection | None = None
        self._opened_at = 0.0
        self.opens = 0
        self.longest_hold_s = 0.0
        self.last_hold_s = 0.0
        self.wait_s = 0.0
        self.releases = 0

    def connection(self) -> duckdb.DuckDBPyConnection:
        """The open connection (opening the file when released)."""
        if self._con is None:
            t = time.monotonic()
            con = connect(self._path, read_only=False, lock_timeout_s=self._lock_timeout_s)
            self.wait_s += time.monotonic() - t
            try:
                if self.opens == 0:
                    migrate(con)
                for stmt in self._settings:
                    con.execute(stmt)
            except BaseException:
                con.close()
                raise
            self._con = con
            self._opened_at = time.monotonic()
            self.opens += 1
        return self._con

    @property
    def path(self) -> str:
        return self._path

    @property
    def is_open(self) -> bool:
        return self._con is not None

    def __getattr__(self, name: str):
        return getattr(self.connection(), name)

    def release(self) -> None:
        """Close the file (after a commit: never inside a transaction) so that other processes
        can open it; the next use opens it again."""
        if self._con is None or self._path == ":memory:":
            return
        try:
            self._con.close()
        finally:
            self._con = None
            self.releases += 1
            self.last_hold_s = time.monotonic() - self._opened_at
            self.longest_hold_s = max(self.longest_hold_s, self.last_hold_s)

    def close(self) -> None:
        """Close for good (also for ``:memory:``)."""
        if self._con is not None:
            con, self._con = self._con, None
            con.close()
            self.longest_hold_s = max(self.longest_hold_s, time.monotonic() - self._opened_at)


@contextlib.contextmanager
def batch_writer(path: str | os.PathLike[str], *,
                 lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[BatchConnection]:
    """A :class:`BatchConnection` for ingesting files: opened (and migrated) now, released
    after each batch's commit, closed on exit.

    Raises:
        StoreLocked, SchemaMismatch, SourceUnavailable: at the first open or any reopen (see
            :func:`connect`, :func:`migrate`).
        StoreFull: the device or quota is full (:func:`store_full`).
    """
    con = BatchConnection(path, lock_timeout_s=lock_timeout_s)
    with _full_is_an_error(path, con.close):
        con.connection()
        yield con


def release_between_batches(con: object, *, only_if_waited: bool = False) -> bool:
    """Let other processes at the file after a committed batch: releases a
    :class:`BatchConnection` (with ``only_if_waited``: only when another process waits for the
    file, :func:`someone_waits`; else it stays open and the next batch pays no reopen and no
    checkpoint); does nothing to a plain connection (whose owner closes it).

    Returns:
        True when the file was released.
    """
    if not isinstance(con, BatchConnection) or not con.is_open:
        return False
    if only_if_waited and not someone_waits(con.path):
        return False
    con.release()
    return con.path != ":memory:"


def someone_waits(path: str | os.PathLike[str]) -> bool:
    """True while another process holds a shared flock on ``<file>.waiting``: it found the
    database locked and is retrying (:func:`connect`)."""
    p = str(path)
    if p == ":memory:":
        return False
    try:
        fd = os.open(_waiting_path(p), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also drops the exclusive lock when it was taken
    return False


@contextlib.contextmanager
def reader(path: str | os.PathLike[str], *,
           lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection for one set of queries, closed on exit.

    Raises:
        SourceUnavailable: no database file at ``path``.
        StoreLocked: a writer kept the lock for longer than ``lock_timeout_s``.
        SchemaMismatch: the file's schema is newer than this code, or missing migrations
            (run any ingest command, which migrates, to upgrade it).
    """
    con = connect(path, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        have = set(schema_version(con))
        want = {m.number for m in MIGRATIONS}
        if have - want:
            raise SchemaMismatch(f"database {path} is newer than this prefixscope: upgrade it")
        if want - have:
            raise SchemaMismatch(
                f"database {path} lacks schema migrations {sorted(want - have)}: run "
                f"'prefixscope db migrate --db {path}'"
            )
        yield con
    finally:
        con.close()


def checkpoint(con: duckdb.DuckDBPyConnection) -> None:
    """Fold the write-ahead log into the database file (DuckDB ``CHECKPOINT``).

    DuckDB first writes committed changes to ``<file>.wal`` beside the database file. After a
    checkpoint the file alone holds every committed row and the ``.wal`` is gone, so the file
    can be moved as one piece: the demo builds its database under a temporary name and
    checkpoints before ``os.replace`` puts it in place, so a reader opening the destination
    never finds a file without its last writes (``os.replace`` moves one file, not its
    ``.wal``).

    Raises:
        duckdb.TransactionException: ``con`` is inside a transaction with uncommitted changes.
    """
    con.execute("CHECKPOINT")


def no_progress_bar(con: duckdb.DuckDBPyConnection) -> None:
    """Turn DuckDB's progress bar off on ``con`` (``SET enable_progress_bar = false``): a long
    statement of an ingester must never draw on the caller's terminal or log."""
    con.execute("SET enable_progress_bar = false")


def memory() -> duckdb.DuckDBPyConnection:
    """A migrated in-memory database (tests and one-off analyses)."""
    con = duckdb.connect(":memory:")
    migrate(con)
    return con
