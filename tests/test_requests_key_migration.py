"""Migration 9: ``requests`` keyed by ``request_key`` (MD5 of (run_id, request_id) as a UUID)
instead of the (run_id, request_id) primary key. A database created at migration 8 keeps every
row and column; afterwards no (run_id, request_id) can be stored twice, by any writer."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from prefixscope.ingest.usage import save_usage_rows
from prefixscope.ingest.usage_read import _COLUMN_LIST, rows_to_arrow
from prefixscope.store import db as store_db
from prefixscope.store.schema import MIGRATIONS, REQUEST_KEY_SQL
from tests.store_support import older_schema

# Pairs that share the concatenation run_id || request_id: the key's length prefix keeps them apart.
OLD_ROWS = [
    ("", "chatcmpl-8e0e3b17bd6accf5", "s", 1, 1795961000.0, 600, 576, None),
    ("a", "bc", "s", 2, 1795961001.0, 100, None, 5),
    ("ab", "c", "s", 3, 1795961002.0, 200, 0, None),
    ("run-1", "chatcmpl-8e0e3b17bd6accf5", "s", 4, None, 300, 16, None),
]
COLS = "run_id, request_id, source_id, line, ts_unix_s, prompt_tokens, cached_tokens, " \
       "cache_write_1h_tokens"


def _row(run_id: str, request_id: str, line: int) -> tuple:
    """One ``requests`` row tuple (column order of ``rows_to_arrow``)."""
    names = _COLUMN_LIST.split(", ")
    values = dict.fromkeys(names)
    values.update(run_id=run_id, request_id=request_id, source_id="t", line=line,
                  ts_estimated=False, prompt_tokens=10)
    return tuple(values[n] for n in names)


@pytest.fixture
def db_at_8(db_path, monkeypatch):
    """A database file created by the code of migration 8, holding OLD_ROWS."""
    with older_schema(db_path, monkeypatch, before=9) as con:
        assert store_db.migrate(con) == [1, 2, 3, 5, 6, 7, 8]
        con.executemany(f"INSERT INTO requests ({COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        OLD_ROWS)
    return db_path


def test_migration_9_keeps_rows_and_columns(db_at_8, monkeypatch):
    # Migration 9 on its own (later migrations add their own columns after request_key).
    monkeypatch.setattr(store_db, "MIGRATIONS", tuple(m for m in MIGRATIONS if m.number <= 9))
    con = store_db.connect(db_at_8)
    try:
        before_cols = [r[0] for r in con.execute("DESCRIBE requests").fetchall()]
        before = con.execute(f"SELECT {', '.join(before_cols)} FROM requests ORDER BY line"
                             ).fetchall()
        assert store_db.migrate(con)[:1] == [9]  # and any later ones
    finally:
        con.close()
    con = store_db.connect(db_at_8)  # the rebuilt table and its index read back from the file
    try:
        described = con.execute("DESCRIBE requests").fetchall()
        assert [r[0] for r in described] == [*before_cols, "request_key"]
        assert [(r[0], r[3]) for r in described if r[3] == "PRI"] == [("request_key", "PRI")]
        after = con.execute(f"SELECT {', '.join(before_cols)} FROM requests ORDER BY line"
                            ).fetchall()
        assert after == before
        keys = con.execute(f"SELECT request_key = {REQUEST_KEY_SQL}, request_key FROM requests"
                           ).fetchall()
        assert all(ok for ok, _ in keys) and len({k for _, k in keys}) == len(OLD_ROWS)
        assert store_db.migrate(con) == []
    finally:
        con.close()


def test_after_migration_a_pair_is_never_stored_twice(db_at_8):
    with store_db.writer(db_at_8) as con:
        n0 = con.execute("SELECT count(*) FROM requests").fetchone()[0]
        old = rows_to_arrow([_row("a", "bc", 10), _row("", "chatcmpl-8e0e3b17bd6accf5", 11)])
        # the plain INSERT of the ingest's fast path refuses a stored pair ...
        con.execute("BEGIN")
        with pytest.raises(duckdb.ConstraintException):
            save_usage_rows(con, old, assume_new=True)
        con.execute("ROLLBACK")
        # ... and the ON CONFLICT path skips it, and repeats inside one batch (first kept)
        batch = pa.concat_tables([old, rows_to_arrow([_row("new", "x", 12),
                                                      _row("new", "x", 13)])])
        assert save_usage_rows(con, batch) == 1
        assert con.execute("SELECT line FROM requests WHERE run_id = 'new'").fetchall() == [(12,)]
        # a writer that bypasses store.queries cannot give a pair a different key
        with pytest.raises(duckdb.ConstraintException, match="CHECK"):
            con.execute("INSERT INTO requests (run_id, request_id, source_id, request_key) "
                        "VALUES ('a', 'bc', 'x', uuid())")
        with pytest.raises(duckdb.ConstraintException):  # nor leave it out
            con.execute("INSERT INTO requests (run_id, request_id, source_id) "
                        "VALUES ('z', 'y', 'x')")
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == n0 + 1
        assert con.execute("SELECT count(DISTINCT (run_id, request_id)) = count(*) "
                           "FROM requests").fetchone()[0]
