"""``diagnose --help`` and docs/diagnose.md say what is true of suggested-layout.yaml: its
patterns hold the matched line's start as literal text (session 5, new-user walk, bug 6: the
help said prompt text was "never stored" while the file held ``"^SECRETTS "``)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _chat(i):
    return {"request_id": f"r{i}", "ts_unix_s": 1_795_960_920 + i, "model": "m", "messages": [
        {"role": "system", "content": "You are a careful assistant. " * 40
         + f"\nSECRETTS 2026-11-{10 + i:02d}T10:00:00Z\n" + "Answer briefly. " * 40},
        {"role": "user", "content": f"question {i}"}]}


def test_help_and_docs_name_the_layout_file_and_what_it_holds(cli, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(_chat(i)) + "\n" for i in range(6)))
    out = tmp_path / "diag"
    code, _, err = cli(["diagnose", trace, "--format", "chat", "--out", out])
    assert code == 0, err
    layout = (out / "suggested-layout.yaml").read_text()
    assert "SECRETTS" in layout  # the line's start is the pattern: the help must say so
    code, help_text, _ = cli(["diagnose", "--help"])
    assert code == 0
    flat = " ".join(help_text.replace("│", " ").split()).replace("suggested- layout", "suggested-layout")
    assert "never stored" not in flat
    assert "written only to suggested-layout.yaml" in flat
    assert "start of each matched line" in flat
    doc = " ".join((ROOT / "docs" / "diagnose.md").read_text().split())
    assert "One file on disk holds prompt text: `suggested-layout.yaml`" in doc
