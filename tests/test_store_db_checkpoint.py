"""prefixscope.store.db.checkpoint: after it the database file alone holds every committed row (no .wal),
so it can be moved with os.replace and read at its new name."""

from __future__ import annotations

import os

import duckdb
import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries.ingest import table_row_counts


def test_checkpoint_leaves_no_wal_and_the_moved_file_holds_every_row(tmp_path):
    built = tmp_path / "x.duckdb.building"
    with store_db.writer(built) as con:
        con.execute("CREATE TABLE t (a INTEGER)")
        con.execute("INSERT INTO t SELECT range FROM range(1000)")
        assert os.path.exists(str(built) + ".wal")
        store_db.checkpoint(con)
        assert not os.path.exists(str(built) + ".wal")
        dest = tmp_path / "x.duckdb"
        os.replace(built, dest)  # before close, whose own checkpoint would hide a missing one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.duckdb"]
    with store_db.reader(dest) as con:
        assert table_row_counts(con)["t"] == 1000


def test_checkpoint_inside_a_transaction_with_changes_raises(tmp_path):
    with store_db.writer(tmp_path / "y.duckdb") as con:
        con.execute("CREATE TABLE t (a INTEGER)")
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(duckdb.TransactionException):
            store_db.checkpoint(con)
        con.execute("ROLLBACK")
