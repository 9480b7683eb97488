"""A model name with control characters (newline, tab, CR, NUL, ESC, RLO) is shown escaped in
a CLI table cell, on one line: a newline of the data never splits a table row."""

from __future__ import annotations

import json

from tests.hostile.support import fresh_db, run_cli, run_cli_subprocess

MODEL = "ev\u202eil\u001b[31mRED\u0000\nline2\tT\rR\u0085C1"


def test_control_characters_of_a_model_name_stay_in_one_table_row(tmp_path):
    log = tmp_path / "u.jsonl"
    log.write_text(json.dumps({"id": "e1", "model": MODEL, "created": 1796000010, "usage": {
        "prompt_tokens": 100, "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 50}}}) + "\n")
    db = fresh_db(tmp_path)
    assert run_cli(["ingest", "requests", log, "--db", db])[0] == 0
    code, out, err = run_cli_subprocess(["hitrate", "--db", db])
    assert code == 0, err
    rows = [line for line in out.splitlines() if "2026-11-30" in line]
    assert len(rows) == 1, out
    assert r"ev\u202eil\x1b[31mRED\x00\x0aline2\x09T\x0dR\x85C1" in rows[0]
    assert not any(c in out for c in "\x1b\x00\r\t\u202e\x85")
    assert "line2" not in out.replace(rows[0], "")  # nothing of the name on another line
    # --json keeps the name as stored
    code, out, err = run_cli(["hitrate", "--db", db, "--json"])
    assert code == 0, err
    assert [r["model"] for r in json.loads(out)] == [MODEL]
