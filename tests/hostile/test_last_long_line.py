"""A last line over the 1 MiB bound with no newline after it is reported, not lost: the replay
trace reader skipped the rest of such a line until EOF and then took EOF for the end of the
file, so the line vanished ("0 trace records skipped", exit 0; new user, session 9). (``ingest
requests`` leaves such a line for its next run on purpose: a log being written may not have
finished its last line; it is quarantined once its newline arrives.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixscope.core.bounds import (
    LINE_TOO_LONG,
    MAX_LINE_BYTES,
    MAX_TRACE_LINE_BYTES,
    TRACE_LINE_TOO_LONG,
)
from prefixscope.ingest.usage import TAIL_LEFT_NOTE
from tests.hostile.support import expected_line, fresh_db, quarantine_rows, run_cli

GOOD_TRACE = json.dumps({"prompt_token_ids": list(range(1, 18))}).encode()
BIG_TRACE = b'{"prompt_token_ids": [' + b"1, " * (MAX_TRACE_LINE_BYTES // 2) + b"1]}"
GOOD_CHAT = json.dumps({"id": "c-0", "object": "chat.completion", "created": 1764590000,
                        "model": "m", "usage": {"prompt_tokens": 10,
                                                "completion_tokens": 1}}).encode()
BIG_CHAT = b'{"id":"x","pad":"' + b"a" * (2 * MAX_LINE_BYTES) + b'"}'


def test_replay_sim_reports_a_last_long_line_without_newline(tmp_path: Path):
    for newline in (b"", b"\n"):
        f = tmp_path / f"trace{len(newline)}.jsonl"
        f.write_bytes(GOOD_TRACE + b"\n" + BIG_TRACE + newline)
        code, out, err = run_cli(["replay", "sim", str(f), "--format", "token-ids",
                                  "--out", str(tmp_path / f"out{len(newline)}")])
        assert code == 0, (code, out, err)
        assert f"{f}:2: {TRACE_LINE_TOO_LONG}" in out + err
        assert "1 trace records skipped" in out + err
        code, out, err = run_cli(["replay", "sim", str(f), "--format", "token-ids", "--json",
                                  "--out", str(tmp_path / f"json{len(newline)}")])
        assert code == 0, (code, out, err)
        doc = json.loads(out)
        assert (doc["requests"], doc["skipped_records"]) == (1, 1)
        assert "1, 1, 1" not in out + err


def test_ingest_requests_leaves_an_unfinished_long_line_then_quarantines_it(tmp_path: Path):
    f = tmp_path / "usage.jsonl"
    f.write_bytes(GOOD_CHAT + b"\n" + BIG_CHAT)
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "requests", str(f), "--db", db])
    assert code == 0, (code, out, err)
    assert quarantine_rows(db) == []  # unfinished: the writer may still be on it
    # and the summary says so, though a line was read (it said nothing; session 9's leftover)
    assert f"{f}: 1 request added" in out and f"  note: {TAIL_LEFT_NOTE}" in out, out
    with f.open("ab") as fh:
        fh.write(b"\n" + GOOD_CHAT.replace(b'"c-0"', b'"c-1"') + b"\n")
    code, out, err = run_cli(["ingest", "requests", str(f), "--db", db])
    assert code == 0, (code, out, err)
    assert quarantine_rows(db) == [(2, None, LINE_TOO_LONG)]
    assert "quarantined " + expected_line(str(f), 2, None, LINE_TOO_LONG) in err, err


def test_a_200k_token_prompt_of_7_digit_ids_is_read(tmp_path: Path):
    # A trace line holds a whole prompt: 1.8 MB here, over the 1 MiB line bound of the logs
    # (it was skipped as too long; new user, session 9); trace lines may be 16 MiB.
    ids = [1_000_000 + (i * 7919) % 8_000_000 for i in range(200_000)]
    line = json.dumps({"prompt_token_ids": ids}).encode()
    assert MAX_LINE_BYTES < len(line) < MAX_TRACE_LINE_BYTES
    f = tmp_path / "long.jsonl"
    f.write_bytes(line + b"\n" + line + b"\n")
    code, out, err = run_cli(["replay", "sim", str(f), "--format", "token-ids", "--json",
                              "--out", str(tmp_path / "out")])
    assert code == 0, (code, out, err)
    doc = json.loads(out)
    assert (doc["requests"], doc["skipped_records"]) == (2, 0)
    assert doc["cached_tokens"] == 200_000 // 16 * 16 - 16  # the second hits all but the last


@pytest.mark.parametrize("workers", [0, 2], ids=["serial", "parallel"])
def test_the_usage_summary_notes_an_unfinished_last_line_after_read_lines(tmp_path: Path,
                                                                         workers: int):
    """Both usage readers (serial, and the parallel one of files over 64 MiB) leave a short
    unfinished last line for the next run and say so in the summary; a file whose last line
    is complete JSON without a newline is read whole and has no note."""
    from prefixscope.ingest.usage import ingest_usage_file_detailed
    from prefixscope.store import db as store_db

    lines = [GOOD_CHAT.replace(b'"c-0"', f'"c-{i}"'.encode()) for i in range(3)]
    cases = {"unfinished.jsonl": b"\n".join(lines) + b'\n{"id": "c-9", "usa',
             "complete.jsonl": b"\n".join(lines)}
    db = fresh_db(tmp_path)
    for name, body in cases.items():
        f = tmp_path / name
        f.write_bytes(body)
        with store_db.writer(db) as con:
            summary, problems = ingest_usage_file_detailed(con, f, workers=workers,
                                                           run_id=name)
        assert (summary.rows_added, problems) == (3, []), name
        assert summary.note == (TAIL_LEFT_NOTE if name == "unfinished.jsonl" else None), name
