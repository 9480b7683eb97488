"""``replay chat-trace`` on sources that are not what it reads: an aider history with bytes
that are not UTF-8 (was a ``UnicodeDecodeError`` traceback), a FIFO and a folder (were "no such
file"). Through the real CLI, each in a subprocess-free run with a time bound."""

from __future__ import annotations

import os
from pathlib import Path

from tests.hostile.support import run_cli

HISTORY = ("# aider chat started at 2026-11-30 10:00:00\n\n"
           "#### fix the bug in main.py  \n\nSure, here is the fix.\n\n")


def test_aider_history_not_utf8_names_line_and_byte(tmp_path: Path):
    f = tmp_path / ".aider.chat.history.md"
    f.write_bytes(HISTORY.encode() + b"#### and the caf\xe9 tests\n")
    code, out, err = run_cli(["replay", "chat-trace", str(f), "--out", str(tmp_path / "o.jsonl")])
    assert code == 4, err
    assert f"error: {f}:7: not UTF-8 text (byte 16)" in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_aider_history_utf8_still_read(tmp_path: Path):
    f = tmp_path / ".aider.chat.history.md"
    f.write_text(HISTORY + "#### and the café tests\n", encoding="utf-8")
    code, out, err = run_cli(["replay", "chat-trace", str(f), "--out", str(tmp_path / "o.jsonl")])
    assert code == 0, err
    assert "wrote 2 chat requests" in out


def test_fifo_and_folder_are_named(tmp_path: Path):
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.md"
    folder.mkdir()
    for src, kind, words in ((fifo, "aider", "not a regular file: it is a FIFO (named pipe)"),
                             (fifo, "swe-agent", "not a regular file: it is a FIFO (named pipe)"),
                             (folder, "aider", "not a regular file: it is a folder")):
        code, _, err = run_cli(["replay", "chat-trace", str(src), "--from", kind, "--out",
                                str(tmp_path / "o.jsonl")])
        assert code == 3 and words in err and "no such file" not in err, (kind, err)
