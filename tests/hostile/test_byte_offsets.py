"""Where a line stops being JSON: every JSONL ingester and trace reader names the byte, in one
wording, ``not valid JSON: <what> (byte N)``, N the 0-based offset within the line (session 8:
``ingest requests`` said ``Invalid UTF-8 encoded string`` without an offset, or read a line
whose unread key held invalid UTF-8 as "no usage object"; the replay trace readers said
``not UTF-8 text`` without one; a kv-cache-tester document with invalid UTF-8 was read with
U+FFFD in its place). Each through the real CLI on a file on disk: the reason stored (quarantine
table or run.json) and printed, the good lines of the same file kept, no traceback, no value of
the bad line on the terminal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostile.support import count, expected_line, fresh_db, quarantine_rows, run_cli
from tests.hostile.targets import TARGETS


def _chat(i: int) -> bytes:
    return json.dumps({"id": f"c-{i}", "object": "chat.completion", "created": 1764590000 + i,
                       "model": "m", "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
                      ).encode()


#: (case, line 2 of a usage log, reason): offsets counted from the line's first byte.
REQUEST_LINES = [
    # the bad byte inside a field the reader reads (model): msgspec named no offset
    ("read-field", b'{"id":"x","model":"m\xc3\x28","usage":{"prompt_tokens":1}}',
     "not valid JSON: not UTF-8 text (byte 20)"),
    # inside a key it never reads: was "$.usage: no usage object (null or missing)"
    ("unread-key", b'{"note":"\xff\xfe"}', "not valid JSON: not UTF-8 text (byte 9)"),
    # not JSON before any bad byte: the decoder's first fault stays
    ("malformed-first", b'x{"note":"\xff"}',
     "not valid JSON: JSON is malformed: invalid character (byte 0)"),
]


@pytest.mark.parametrize("case,line,reason", REQUEST_LINES, ids=[c[0] for c in REQUEST_LINES])
def test_ingest_requests_invalid_utf8_names_its_byte_in_the_line(tmp_path: Path, case, line,
                                                                  reason):
    f = tmp_path / "usage.jsonl"
    f.write_bytes(b"\n".join([_chat(0), line, _chat(1)]) + b"\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "requests", str(f), "--db", db])
    assert code == 0, (code, out, err)
    assert quarantine_rows(db) == [(2, None, reason)]
    assert "quarantined " + expected_line(str(f), 2, None, reason) in err, err
    assert count(db, "SELECT count(*) FROM requests") == 2


def test_ingest_requests_json_document_of_a_bad_line(tmp_path: Path):
    f = tmp_path / "usage.jsonl"
    f.write_bytes(b'{"note":"\xff"}\n')
    code, out, err = run_cli(["ingest", "requests", str(f), "--db", fresh_db(tmp_path), "--json"])
    assert code == 4, (code, out, err)
    [q] = json.loads(out)["quarantined"]
    assert (q["line"], q["field"], q["reason"]) == (1, None,
                                                    "not valid JSON: not UTF-8 text (byte 9)")


def test_ingest_kv_events_not_json_gets_the_house_wording(tmp_path: Path):
    """Item 1 of session 8's brief: not the stdlib's ``Expecting value: line 1 column 1
    (char 0)``, but the other ingesters' ``not valid JSON: <message> (byte N)``."""
    target = TARGETS["kv-events"]
    good = [json.dumps(target.record(i)).encode() for i in range(2)]
    f = tmp_path / "kv.jsonl"
    f.write_bytes(b"\n".join([good[0], b"not json", b'{"seq": 1 "x": 2}', good[1]]) + b"\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "kv-events", str(f), "--db", db])
    assert code == 0, (code, out, err)
    expected = [(2, None, "not valid JSON: Expecting value (byte 0)"),
                (3, None, "not valid JSON: Expecting ',' delimiter (byte 10)")]
    assert quarantine_rows(db) == expected
    for line, fld, reason in expected:
        assert "quarantined " + expected_line(str(f), line, fld, reason) in err, err
    assert "column" not in err and "char " not in err
    assert count(db, "SELECT count(*) FROM kv_events") == 2 * target.rows_per_record


@pytest.mark.parametrize("fmt", ["sim-token-ids", "sim-mooncake", "sim-chat"])
def test_replay_sim_jsonl_trace_invalid_utf8_names_its_byte(tmp_path: Path, fmt):
    target = TARGETS[fmt]
    good = [json.dumps(target.record(i)).encode() for i in range(2)]
    bad = b'{"pad": "ab\xc3\x28"}'  # the bad byte at 11 of its line
    f = tmp_path / "trace.jsonl"
    f.write_bytes(b"\n".join([good[0], bad, good[1]]) + b"\n")
    code, out, err, n_good, problems = target.run(f, tmp_path)
    reason = "not valid JSON: not UTF-8 text (byte 11)"
    assert code == 0, (code, out, err)
    assert (n_good, problems) == (2, [(2, None, reason)])
    assert f"skipped {f}:2: {reason}" in err, err


def test_kv_cache_tester_document_invalid_utf8_names_line_and_byte(tmp_path: Path):
    """A kv-cache-tester conversation document with invalid UTF-8 (in a string no request
    needs) is skipped naming its line and the byte within that line; it was read with U+FFFD
    in place of the bytes. The other conversation of the folder is replayed."""
    good = {"id": "conv-a", "block_size": 64, "requests": [
        {"t": 0.0, "in": 128, "out": 2, "hash_ids": [1, 2]},
        {"t": 1.0, "in": 192, "out": 2, "hash_ids": [1, 2, 3]}]}
    folder = tmp_path / "kvct"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps(good))
    bad = folder / "b.json"
    bad.write_bytes(b'{"id": "conv-b", "block_size": 64,\n "note": "ab\xc3\x28",\n'
                    b' "requests": [{"t": 0.0, "in": 128, "out": 2, "hash_ids": [7, 8]}]}\n')
    out_dir = tmp_path / "out"
    code, out, err = run_cli(["replay", "sim", str(folder), "--format", "kv-cache-tester",
                              "--out", str(out_dir)])
    reason = "not valid JSON: not UTF-8 text (byte 12)"
    assert code == 0, (code, out, err)
    doc = json.loads((out_dir / "run.json").read_text())
    assert doc["summary"]["requests"] == 2
    assert [(p["line"], p["field"], p["reason"]) for p in doc["skipped_records"]] == [
        (2, None, reason)]
    assert f"skipped {bad}:2: {reason}" in err, err
