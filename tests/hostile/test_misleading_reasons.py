"""Quarantine reasons that named the wrong fault (a new user's walk, session 7): invalid UTF-8
in a decision log read as "unknown key", an OpenAI response given to ``ingest litellm`` read as
a spend-log row without a prompt count, an empty saved Prometheus answer read as a JSON error
at byte 0. Each through the real CLI: the exact reason, stored and printed, exit 4 (nothing
could be read), and no value of the input on the terminal.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefixscope.ingest.litellm import NOT_SPEND_LOG
from prefixscope.ingest.prometheus_api import EMPTY_FILE
from tests.hostile.support import expected_line, fresh_db, quarantine_rows, run_cli

BAD_UTF8 = b'{"id":"a\xff\xfe","model":"m","usage":{"prompt_tokens":10}}\n'


def test_decisions_invalid_utf8_is_named_not_an_unknown_key(tmp_path: Path):
    f = tmp_path / "decisions.jsonl"
    f.write_bytes(BAD_UTF8)
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "decisions", str(f), "--db", db])
    reason = "not valid JSON: not UTF-8 text (byte 8)"
    assert code == 4, (code, out, err)
    assert quarantine_rows(db) == [(1, None, reason)]
    assert reason in err and "unknown key" not in err, err


def test_decisions_unknown_key_in_valid_utf8_is_still_an_unknown_key(tmp_path: Path):
    f = tmp_path / "decisions.jsonl"
    f.write_bytes(b'{"id":"a","model":"m"}\n')
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "decisions", str(f), "--db", db])
    assert code == 4, (code, out, err)
    assert quarantine_rows(db) == [
        (1, None, "unknown key (not part of the decision-log format, docs/scopes.md)")]


def test_litellm_given_a_provider_response_says_it_is_no_spend_log_row(tmp_path: Path):
    f = tmp_path / "hugeint.jsonl"
    f.write_text(json.dumps({"id": "h1", "object": "chat.completion", "created": 1796000000,
                             "model": "m", "usage": {"prompt_tokens": 10**400,
                                                     "completion_tokens": 1}}) + "\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "litellm", str(f), "--db", db])
    assert code == 4, (code, out, err)
    assert quarantine_rows(db) == [(1, "prompt_tokens", NOT_SPEND_LOG)]
    assert "quarantined " + expected_line(str(f), 1, "prompt_tokens", NOT_SPEND_LOG) in err
    assert "1000000000" not in out + err


def test_litellm_row_without_any_prompt_count_keeps_its_reason(tmp_path: Path):
    f = tmp_path / "spend.jsonl"
    f.write_text(json.dumps({"request_id": "r1", "startTime": "2026-11-28 10:00:00",
                             "model": "m", "completion_tokens": 1}) + "\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "litellm", str(f), "--db", db])
    assert code == 4, (code, out, err)
    assert quarantine_rows(db) == [(1, "prompt_tokens", "no prompt token count")]


def test_query_range_empty_file_says_empty_file(tmp_path: Path):
    f = tmp_path / "empty.json"
    f.write_bytes(b"")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "query-range", str(f), "--db", db, "--json"])
    assert code == 4, (code, out, err)
    assert json.loads(out) == []
    assert f"error: {f}: {EMPTY_FILE}" in err, err
    assert err.strip().splitlines()[-1] == f"error: nothing could be read: {f}: {EMPTY_FILE}"
    assert "Expecting value" not in err
