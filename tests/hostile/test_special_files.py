"""Files that are not files through every file-reading command: a FIFO, ``/dev/zero``, a unix
socket, a 1 MB binary file, a folder, a missing path, a corrupt ``.gz`` trace, a file without
any newline. Each is refused up front with words naming what it is (never "no such file" for
something that exists), with no traceback, no hang and no memory blow-up (``/dev/zero`` runs in
a subprocess with its address space capped at 2 GiB)."""

from __future__ import annotations

import gzip
import json
import os
import socket
from pathlib import Path

import pytest

from prefixscope.core.bounds import BINARY_REASON, LINE_TOO_LONG
from tests.hostile.support import run_cli, run_cli_subprocess

COMMANDS = {
    "requests": ["ingest", "requests"],
    "decisions": ["ingest", "decisions"],
    "kv-events": ["ingest", "kv-events"],
    "metrics": ["ingest", "metrics"],
    "sim-token-ids": ["replay", "sim", "--format", "token-ids"],
    "sim-auto": ["replay", "sim"],
}
#: What each kind of path must be called on stderr.
WORDS = {
    "fifo": "not a regular file: it is a FIFO (named pipe)",
    "dev-zero": "not a regular file: it is a character device",
    "socket": "not a regular file: it is a socket",
    "binary": BINARY_REASON,
    "missing": "no such file",
}
FOLDER_WORDS = {
    "requests": "is a folder: give its .jsonl files",
    "decisions": "a folder without decisions*.jsonl files",
    "kv-events": "is a folder: give its .jsonl files",
    "metrics": "not a regular file: it is a folder",
    "sim-token-ids": "is a directory: only kv-cache-tester traces can be directories",
    "sim-auto": "no *.json or *.json.gz conversation files",
}


def _make(kind: str, tmp_path: Path) -> tuple[str, object]:
    """(path, something to close) for a kind of path."""
    if kind == "fifo":
        p = tmp_path / "pipe.jsonl"
        os.mkfifo(p)
        return str(p), None
    if kind == "dev-zero":
        return "/dev/zero", None
    if kind == "socket":
        p = tmp_path / "s.jsonl"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(p))
        return str(p), s
    if kind == "binary":
        p = tmp_path / "blob.jsonl"
        p.write_bytes(os.urandom(1 << 20))
        return str(p), None
    if kind == "folder":
        p = tmp_path / "empty-folder"
        p.mkdir()
        return str(p), None
    return str(tmp_path / "missing.jsonl"), None


def _args(command: str, path: str, tmp_path: Path) -> list[str]:
    args = [*COMMANDS[command], path]
    if command.startswith("sim"):
        return [*args, "--out", str(tmp_path / "out")]
    return [*args, "--db", str(tmp_path / "x.duckdb")]


CASES = [(c, k) for c in COMMANDS for k in (*WORDS, "folder")]


@pytest.mark.parametrize("command,kind", CASES, ids=[f"{c}:{k}" for c, k in CASES])
def test_not_a_file_is_refused_with_the_right_words(command, kind, tmp_path):
    path, handle = _make(kind, tmp_path)
    try:
        args = _args(command, path, tmp_path)
        if kind == "dev-zero":
            code, out, err = run_cli_subprocess(args, timeout_s=60)
        else:
            code, out, err = run_cli(args, timeout_s=60)
    finally:
        if handle is not None:
            handle.close()
    words = FOLDER_WORDS[command] if kind == "folder" else WORDS[kind]
    assert words in err
    if kind != "missing":
        assert "no such file" not in err
    if not command.startswith("sim"):
        assert code == 4, err  # nothing could be read
    else:  # a usage error (a folder is not a JSONL trace) or an unreadable source
        assert code == (2 if (command, kind) == ("sim-token-ids", "folder") else 3), err


def test_corrupt_gzip_trace_keeps_the_requests_before_it(tmp_path):
    good = b"".join(json.dumps({"prompt_token_ids": list(range(i, i + 20)), "t": i * 0.1})
                    .encode() + b"\n" for i in range(3000))
    data = gzip.compress(good)
    f = tmp_path / "trace.jsonl.gz"
    f.write_bytes(data[: len(data) // 2])  # cut short
    code, out, err = run_cli(["replay", "sim", str(f), "--format", "token-ids", "--out",
                              str(tmp_path / "out")])
    assert code == 0, err
    doc = json.loads((tmp_path / "out" / "run.json").read_text())
    assert 0 < doc["summary"]["requests"] < 3000
    [problem] = doc["skipped_records"]
    assert problem["reason"] == "gzip data is corrupt or cut short: reading stopped at this line"
    assert problem["line"] == doc["summary"]["requests"] + 1
    assert f"skipped {f}:{problem['line']}: {problem['reason']}" in err


@pytest.mark.parametrize("command", ["requests", "decisions", "kv-events"])
def test_a_file_without_newline_is_read_no_further_than_a_line(command, tmp_path):
    """8 MiB of text without a newline, after one good line: memory stays bounded, the long
    tail is left unread (a writer may still be writing it), the good line is kept."""
    from tests.hostile.targets import TARGETS

    target = TARGETS[command]
    f = tmp_path / "endless.jsonl"
    f.write_bytes(json.dumps(target.record(0)).encode() + b"\n" + b"x" * (8 << 20))
    code, out, err, good, problems = target.run(f, tmp_path)
    assert (code, good, problems) == (0, target.rows_per_record, []), err


@pytest.mark.parametrize("command", ["requests", "decisions", "kv-events"])
def test_an_over_long_line_between_good_lines_is_quarantined_without_being_held(command,
                                                                              tmp_path):
    from tests.hostile.targets import TARGETS

    target = TARGETS[command]
    rec = [json.dumps(target.record(i)).encode() for i in range(2)]
    f = tmp_path / "long.jsonl"
    f.write_bytes(rec[0] + b"\n" + b"y" * (20 << 20) + b"\n" + rec[1] + b"\n")
    code, out, err, good, problems = target.run(f, tmp_path)
    assert code == 0, err
    assert (good, problems) == (2 * target.rows_per_record, [(2, None, LINE_TOO_LONG)])


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
@pytest.mark.parametrize("args", [["hitrate"], ["db", "info"], ["ingest", "prices", "data/prices.toml"]],
                         ids=["reader", "db-info", "writer"])
def test_db_that_is_not_a_regular_file_is_refused(kind, args, tmp_path):
    """``--db`` naming a FIFO blocked DuckDB's open forever (reader and writer alike); a device
    or a folder got DuckDB's own wording. Each is refused before DuckDB sees it, exit 3."""
    if kind == "fifo":
        db = tmp_path / "pipe.duckdb"
        os.mkfifo(db)
    elif kind == "folder":
        db = tmp_path / "folder.duckdb"
        db.mkdir()
    else:
        db = Path("/dev/zero")
    repo = Path(__file__).resolve().parents[2]
    argv = [str(repo / a) if a.startswith("data/") else a for a in args]
    code, _, err = run_cli([*argv, "--db", str(db)])
    what = {"fifo": "a FIFO (named pipe)", "dev-zero": "a character device", "folder": "a folder"}[kind]
    assert code == 3, err
    assert f"error: cannot open database {db}: not a regular file: it is {what}" in err


@pytest.mark.parametrize("args", [["hitrate"], ["ingest", "prices", "data/prices.toml"]],
                         ids=["reader", "writer"])
def test_db_of_random_bytes_says_to_move_it_aside(args, tmp_path):
    """``--db`` naming a file of random bytes: DuckDB's words, then what to do (the new-user
    check of session 11 was told to create it with ``make demo``)."""
    db = tmp_path / "garbage.duckdb"
    db.write_bytes(os.urandom(1 << 16))
    repo = Path(__file__).resolve().parents[2]
    argv = [str(repo / a) if a.startswith("data/") else a for a in args]
    code, _, err = run_cli([*argv, "--db", str(db)])
    assert code == 3, err
    assert f"error: cannot open database {db}: " in err and "not a valid DuckDB database" in err
    assert "move it aside, or pass another --db, to start a new one" in err
    assert "Traceback" not in err


def test_dashboard_on_a_db_of_random_bytes_does_not_offer_to_create_it(tmp_path, use_db):
    from tests import dashboard_support as ds

    db = tmp_path / "garbage.duckdb"
    db.write_bytes(os.urandom(1 << 16))
    at = ds.first_run(use_db(str(db)))
    assert not at.exception, [e.value for e in at.exception]
    shown = ds.texts(at, "error") + ds.texts(at, "info")
    assert any("move it aside" in t for t in shown), shown
    assert not any("make demo" in t for t in shown), shown
