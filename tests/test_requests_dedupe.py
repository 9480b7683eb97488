"""Migration 79: ``requests`` has no primary-key index; its writers (store/queries/requests.py)
skip a stored or repeated ``request_key`` with an anti-join in the batch's transaction. Nothing
ingested is lost or counted twice: re-ingest, the same request in two files, repeats inside one
batch (the first kept), after archiving, an old database migrated with its rows, and two write
transactions open at the same time."""

from __future__ import annotations

import json
import shutil

import duckdb
import pytest

from prefixscope.ingest.usage import ingest_usage_file, save_usage_rows
from prefixscope.ingest.usage_read import _COLUMN_LIST, rows_to_arrow
from prefixscope.store import db as store_db
from prefixscope.store.queries import archive as arc
from prefixscope.store.queries.requests import (insert_new_request_rows, insert_request_rows,
                                                rebuild_request_rollup,
                                                request_hit_rate_totals)
from prefixscope.store.schema import MIGRATIONS, REQUEST_KEY_SQL
from tests.requests_support import write_jsonl
from tests.store_support import older_schema

DAY = 86400.0
T0 = 1_790_000_000.0 - 1_790_000_000.0 % DAY  # a UTC day start, 2026


def _rec(i: int, *, day: int = 0, rid: str | None = None, prompt: int = 100,
         cached: int = 50) -> dict:
    return {"id": rid or f"chatcmpl-{i:016x}", "created": T0 + day * DAY + i,
            "model": "m", "usage": {"prompt_tokens": prompt,
                                    "prompt_tokens_details": {"cached_tokens": cached}}}


def _row(run_id: str, request_id: str, line: int, prompt: int = 10) -> tuple:
    names = _COLUMN_LIST.split(", ")
    values = dict.fromkeys(names)
    values.update(run_id=run_id, request_id=request_id, source_id="t", line=line,
                  ts_unix_s=T0 + line, ts_estimated=False, prompt_tokens=prompt)
    return tuple(values[n] for n in names)


def _pairs_unique(con) -> bool:
    return con.execute("SELECT count(DISTINCT (run_id, request_id)) = count(*) FROM requests"
                       ).fetchone()[0]


def _rollup_counts_rows(con) -> bool:
    return con.execute("SELECT (SELECT sum(requests) FROM request_rollup_1m) = "
                       "(SELECT count(*) FROM requests)").fetchone()[0]


def test_the_table_has_no_index_and_keeps_the_key_check(db_path):
    with store_db.writer(db_path) as con:
        described = con.execute("DESCRIBE requests").fetchall()
        assert [r[0] for r in described if r[3] == "PRI"] == []
        assert con.execute("SELECT count(*) FROM duckdb_indexes() WHERE table_name = 'requests'"
                           ).fetchone()[0] == 0
        with pytest.raises(duckdb.ConstraintException, match="CHECK"):
            con.execute("INSERT INTO requests (run_id, request_id, source_id, request_key) "
                        "VALUES ('a', 'bc', 'x', uuid())")
        with pytest.raises(duckdb.ConstraintException):  # NOT NULL
            con.execute("INSERT INTO requests (run_id, request_id, source_id) VALUES ('a', 'b', 'x')")


def test_reingest_and_a_copy_of_the_file_add_nothing(db_path, tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl", [_rec(i) for i in range(300)])
    with store_db.writer(db_path) as con:
        assert ingest_usage_file(con, f).rows_added == 300
        again = ingest_usage_file(con, f)  # checkpoint at the end: nothing read
        assert (again.rows_read, again.rows_added) == (0, 0)
        copy = tmp_path / "copy.jsonl"  # another source: every line read, every key stored
        shutil.copy(f, copy)
        s = ingest_usage_file(con, copy)
        assert (s.rows_read, s.rows_added, s.rows_duplicate) == (300, 0, 300)
        # the checkpoint forgotten: the file is read from the start again, adds nothing
        con.execute("DELETE FROM ingest_sources")
        s = ingest_usage_file(con, f, batch_rows=70)
        assert (s.rows_read, s.rows_added, s.rows_duplicate) == (300, 0, 300)
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 300
        assert _pairs_unique(con) and _rollup_counts_rows(con)
        t = request_hit_rate_totals(con, by=())
        assert (int(t.requests[0]), int(t.prompt_tokens[0])) == (300, 30_000)


def test_two_files_with_some_requests_in_common_give_one_row_each(db_path, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [_rec(i) for i in range(0, 200)])
    b = write_jsonl(tmp_path / "b.jsonl", [_rec(i, prompt=999) for i in range(150, 260)])
    with store_db.writer(db_path) as con:
        assert ingest_usage_file(con, a).rows_added == 200
        s = ingest_usage_file(con, b, batch_rows=40)  # batches all-new, mixed and all-stored
        assert (s.rows_read, s.rows_added, s.rows_duplicate) == (110, 60, 50)
        # the first stored row of a pair stays (file a's prompt), the new ones are b's
        got = dict(con.execute("SELECT prompt_tokens, count(*) FROM requests GROUP BY ALL"
                               ).fetchall())
        assert got == {100: 200, 999: 60}
        assert _pairs_unique(con) and _rollup_counts_rows(con)
        # the same ids in another run are other requests
        c = tmp_path / "c.jsonl"
        shutil.copy(a, c)
        assert ingest_usage_file(con, c, run_id="replay-1").rows_added == 200
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 460


def test_repeats_inside_one_batch_keep_the_first(db_path, tmp_path):
    recs = [_rec(1), _rec(2), _rec(1, prompt=7), _rec(3), _rec(2, prompt=8), _rec(1, prompt=9)]
    f = write_jsonl(tmp_path / "r.jsonl", recs)
    with store_db.writer(db_path) as con:
        s = ingest_usage_file(con, f)
        assert (s.rows_read, s.rows_added, s.rows_duplicate) == (6, 3, 3)
        assert con.execute("SELECT line, prompt_tokens FROM requests ORDER BY line").fetchall() \
            == [(1, 100), (2, 100), (4, 100)]
        assert _rollup_counts_rows(con)
        # the same through the store function, many repeats in one Arrow batch
        batch = rows_to_arrow([_row("x", f"id{i % 7}", i, prompt=i) for i in range(1, 50)])
        con.execute("BEGIN")
        assert insert_request_rows(con, batch, _COLUMN_LIST) == 7
        con.execute("COMMIT")
        assert con.execute("SELECT list(prompt_tokens ORDER BY prompt_tokens) FROM requests "
                           "WHERE run_id = 'x'").fetchone()[0] == [1, 2, 3, 4, 5, 6, 7]


def test_the_fast_path_refuses_a_stored_or_repeated_key_and_inserts_nothing(db_path):
    with store_db.writer(db_path) as con:
        con.execute("BEGIN")
        assert insert_new_request_rows(con, rows_to_arrow([_row("", "a", 1), _row("", "b", 2)]),
                                       _COLUMN_LIST) == 2
        con.execute("COMMIT")
        for rows in ([_row("", "c", 3), _row("", "a", 4)],      # a is stored
                     [_row("", "d", 5), _row("", "d", 6)]):     # d repeats in the batch
            con.execute("BEGIN")
            with pytest.raises(duckdb.ConstraintException):
                insert_new_request_rows(con, rows_to_arrow(rows), _COLUMN_LIST)
            assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 2
            con.execute("ROLLBACK")
        assert save_usage_rows(con, rows_to_arrow([_row("", "c", 3), _row("", "a", 4)])) == 1
        assert sorted(r[0] for r in con.execute("SELECT request_id FROM requests").fetchall()) \
            == ["a", "b", "c"]


def test_two_open_write_transactions_cannot_both_insert_a_key(db_path):
    with store_db.writer(db_path) as con:
        one, two = con.cursor(), con.cursor()
        one.execute("BEGIN")
        two.execute("BEGIN")
        assert insert_new_request_rows(one, rows_to_arrow([_row("", "k", 1)]), _COLUMN_LIST) == 1
        with pytest.raises(duckdb.TransactionException):
            insert_new_request_rows(two, rows_to_arrow([_row("", "k", 2)]), _COLUMN_LIST)
        two.execute("ROLLBACK")
        one.execute("COMMIT")
        two.execute("BEGIN")  # after the first committed, the second sees its key
        assert insert_request_rows(two, rows_to_arrow([_row("", "k", 2)]), _COLUMN_LIST) == 0
        two.execute("COMMIT")
        assert con.execute("SELECT line FROM requests").fetchall() == [(1,)]


def test_after_archiving_stored_days_still_skip_their_keys(db_path, tmp_path):
    old = [_rec(i, day=0) for i in range(50)]
    new = [_rec(1000 + i, day=3) for i in range(50)]
    f = write_jsonl(tmp_path / "a.jsonl", old + new)
    root = tmp_path / "archive"
    with store_db.writer(db_path) as con:
        assert ingest_usage_file(con, f).rows_added == 100
    with store_db.writer(db_path) as con:
        plan = [p for p in arc.plan_days(con, T0 + 2 * DAY) if p.table == "requests"]
        assert len(plan) == 1
    with store_db.writer(db_path) as con:
        arc.archive_day(con, "requests", T0, str(root))
    g = write_jsonl(tmp_path / "b.jsonl", new + [_rec(2000 + i, day=3) for i in range(10)])
    with store_db.writer(db_path) as con:
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 50
        again = ingest_usage_file(con, f)
        assert (again.rows_read, again.rows_added) == (0, 0)
        s = ingest_usage_file(con, g)
        assert (s.rows_read, s.rows_added, s.rows_duplicate) == (60, 10, 50)
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 60
        assert _pairs_unique(con)
        t = request_hit_rate_totals(con, by=())  # table and archive together
        assert int(t.requests[0]) == 110


def test_migration_79_keeps_rows_columns_and_uniqueness(db_path, monkeypatch, tmp_path):
    rows = [_row("", f"chatcmpl-{i:04x}", i, prompt=i) for i in range(1, 41)] + \
        [_row("a", "bc", 41), _row("ab", "c", 42)]
    with older_schema(db_path, monkeypatch, before=79) as con:
        assert 78 in store_db.migrate(con)
        assert [r[0] for r in con.execute("DESCRIBE requests").fetchall() if r[3] == "PRI"] \
            == ["request_key"]
        # as the writer of that time: ON CONFLICT on the index, then the rollups
        con.register("_old", rows_to_arrow(rows + [_row("", "chatcmpl-0001", 99)]))
        assert con.execute(f"INSERT INTO requests ({_COLUMN_LIST}, request_key) SELECT "
                           f"{_COLUMN_LIST}, {REQUEST_KEY_SQL} FROM _old ON CONFLICT DO NOTHING"
                           ).fetchone()[0] == 42
        con.unregister("_old")
        rebuild_request_rollup(con)
        before_cols = [r[0] for r in con.execute("DESCRIBE requests").fetchall()]
        before = con.execute("SELECT * FROM requests ORDER BY line").fetchall()
        rollup = con.execute("SELECT * FROM request_rollup_1m ORDER BY ALL").fetchall()
    con = store_db.connect(db_path)
    try:
        assert store_db.migrate(con)[:1] == [79]  # and any later ones
    finally:
        con.close()
    with store_db.writer(db_path) as con:  # read back from the file
        described = con.execute("DESCRIBE requests").fetchall()
        assert [r[0] for r in described] == before_cols
        assert [r[0] for r in described if r[3] == "PRI"] == []
        assert con.execute("SELECT * FROM requests ORDER BY line").fetchall() == before
        assert con.execute("SELECT * FROM request_rollup_1m ORDER BY ALL").fetchall() == rollup
        assert con.execute(f"SELECT bool_and(request_key = {REQUEST_KEY_SQL}) FROM requests"
                           ).fetchone()[0]
        # the migrated rows' keys are checked like new ones
        f = write_jsonl(tmp_path / "m.jsonl",
                        [{"id": "bc", "run_id": "a", "usage": {"prompt_tokens": 5}},
                         {"id": "chatcmpl-0001", "usage": {"prompt_tokens": 5}},
                         {"id": "new", "usage": {"prompt_tokens": 5}}])
        s = ingest_usage_file(con, f)
        assert (s.rows_read, s.rows_added, s.rows_duplicate) == (3, 1, 2)
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 43
        assert _pairs_unique(con)
        assert store_db.migrate(con) == []
        assert 79 in [m.number for m in MIGRATIONS]


def test_parallel_parse_of_a_big_file_with_repeats(db_path, tmp_path, monkeypatch):
    """The forked parsers and the merged transactions: a file whose second half repeats some
    of the first half's ids gives each id once."""
    import prefixscope.ingest.usage_read as ur

    monkeypatch.setattr(ur, "REGION_BYTES", 64 << 10)
    recs = [_rec(i) for i in range(3000)] + [_rec(i, prompt=1) for i in range(0, 3000, 7)] + \
        [_rec(5000 + i) for i in range(500)]
    f = tmp_path / "big.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with store_db.writer(db_path) as con:
        s = ingest_usage_file(con, f, workers=2)
        assert (s.rows_read, s.rows_added) == (len(recs), 3500)
        assert con.execute("SELECT count(*) FILTER (WHERE prompt_tokens = 1) FROM requests"
                           ).fetchone()[0] == 0
        assert _pairs_unique(con) and _rollup_counts_rows(con)
