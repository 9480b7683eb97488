"""Opening the DuckDB file, applying migrations, and the locking protocol.

DuckDB lets one process write a database file, or several processes read it, never both at
once. prefixscope therefore never holds a connection open between units of work:

1. Writers (ingesters) open the file read-write for one batch inside :func:`writer`, commit, and
   close; a long-running scraper does this once per scrape.
2. Readers (dashboard, reports) open it read-only inside :func:`reader` for one set of queries
   and close it; the dashboard caches the results (TTL) rather than the connection.
3. Both retry a lock conflict with backoff (10 ms doubling to 0.5 s) for ``lock_timeout_s``
   (default 30 s), then raise :class:`~prefixscope.core.errors.StoreLocked`.

See ``docs/architecture.md#concurrency``.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb

from prefixscope.core.errors import SchemaMismatch, SourceUnavailable, StoreLocked
from prefixscope.store.schema import MIGRATIONS

DEFAULT_LOCK_TIMEOUT_S = 30.0


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text and ("conflicting" in text or "could not set lock" in text)


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
        SourceUnavailable: ``read_only`` and the file does not exist.
        StoreLocked: still locked after ``lock_timeout_s``.
    """
    p = str(path)
    if p != ":memory:":
        if read_only and not Path(p).exists():
            raise SourceUnavailable(
                f"no database at {p}: ingest something first (prefixscope ingest ...) or run make demo"
            )
        if not read_only:
            Path(p).parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + lock_timeout_s
    delay = 0.01
    while True:
        try:
            return duckdb.connect(p, read_only=read_only)
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise SourceUnavailable(f"cannot open database {p}: {exc}") from exc
            if time.monotonic() >= deadline:
                raise StoreLocked(
                    f"database {p} stayed locked by another process for {lock_timeout_s:.0f} s"
                ) from exc
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.5)


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


@contextlib.contextmanager
def writer(path: str | os.PathLike[str], *,
           lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-write connection for one unit of work, migrated, closed on exit.

    Raises:
        StoreLocked, SchemaMismatch, SourceUnavailable: see :func:`connect`, :func:`migrate`.
    """
    con = connect(path, read_only=False, lock_timeout_s=lock_timeout_s)
    try:
        migrate(con)
        yield con
    finally:
        con.close()


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
