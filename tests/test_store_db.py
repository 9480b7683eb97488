"""Schema migrations and the locking protocol of the store."""

from __future__ import annotations

import multiprocessing as mp
import time

import duckdb
import pytest

from prefixscope.core.errors import SchemaMismatch, SourceUnavailable, StoreLocked
from prefixscope.store import db as store_db
from prefixscope.store.schema import MIGRATIONS


def test_migrate_is_idempotent(db_path):
    with store_db.writer(db_path) as con:
        first = store_db.schema_version(con)
    with store_db.writer(db_path) as con:
        assert store_db.migrate(con) == []
        assert store_db.schema_version(con) == first == sorted(m.number for m in MIGRATIONS)


def test_unknown_migration_is_refused(db_path):
    with store_db.writer(db_path) as con:
        con.execute("INSERT INTO schema_migrations VALUES (9999, 'future', 0)")
    with pytest.raises(SchemaMismatch, match="9999"):
        with store_db.writer(db_path):
            pass


def test_reader_needs_an_existing_file(tmp_path):
    with pytest.raises(SourceUnavailable, match="no database"):
        with store_db.reader(tmp_path / "missing.duckdb"):
            pass


def _hold_write_lock(path, seconds, ready):
    con = duckdb.connect(path)
    ready.set()
    time.sleep(seconds)
    con.close()


def test_reader_waits_for_a_writer_then_reads(db_path):
    with store_db.writer(db_path):
        pass
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_write_lock, args=(db_path, 1.0, ready))
    p.start()
    ready.wait(10)
    t0 = time.monotonic()
    with store_db.reader(db_path, lock_timeout_s=20) as con:
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 0
    assert time.monotonic() - t0 > 0.3
    p.join()


def test_lock_timeout_raises_store_locked(db_path):
    with store_db.writer(db_path):
        pass
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_write_lock, args=(db_path, 3.0, ready))
    p.start()
    ready.wait(10)
    with pytest.raises(StoreLocked, match="locked"):
        store_db.connect(db_path, read_only=True, lock_timeout_s=0.5)
    p.join()
