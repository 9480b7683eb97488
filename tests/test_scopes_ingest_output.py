"""``ingest decisions`` output: the documented wording of a line that is not JSON, the
``quarantined`` list of ``--json`` (docs/ingest.md) and an empty file being tailed. Real DuckDB
files, real CLI."""

from __future__ import annotations

import json

from prefixscope.ingest.decisions import parse_line
from prefixscope.core.errors import NOT_JSON


def _good(request_id: str = "mt-0001") -> dict:
    return {"v": 1, "record": "decision", "ts_unix_s": 1795960007.415, "request_id": request_id,
            "scope": "PUBLIC", "namespace_digest": "4bad35c5471a012d", "decision": "miss",
            "reasons": [], "candidate_cached_tokens": 0, "accepted_cached_tokens": 0}


def _reason(raw: bytes) -> str:
    try:
        parse_line(raw)
    except Exception as exc:  # noqa: BLE001 - the _Bad line error
        return exc.args[0] if len(exc.args) == 1 else exc.args[1]
    raise AssertionError("line accepted")


def test_truncated_or_malformed_line_is_not_valid_json_and_array_is_not_an_object():
    assert _reason(b'{"ts_unix_s": 1').startswith(f"{NOT_JSON}: ")
    trailing = _reason(b'{"a": 1,}')
    assert trailing.startswith(f"{NOT_JSON}: ") and trailing.endswith("(byte 8)")
    assert _reason(b"[1, 2]") == "not a JSON object"
    assert _reason(b'"text"') == "not a JSON object"


def test_json_lists_quarantined_lines_per_source(cli, db_path, tmp_path):
    f = tmp_path / "decisions.jsonl"
    f.write_text(json.dumps(_good()) + "\n" + '{"v": 1, "record": "deci\n' + "[1]\n")
    code, out, err = cli(["ingest", "decisions", f, "--db", db_path, "--json"])
    assert code == 0, err
    (summary,) = json.loads(out)
    assert summary["rows_added"] == 1 and summary["rows_quarantined"] == 2
    q = summary["quarantined"]
    assert [(x["location"], x["line"], x["field"]) for x in q] == [(str(f), 2, None),
                                                                  (str(f), 3, None)]
    assert q[0]["reason"].startswith(f"{NOT_JSON}: ")
    assert q[1]["reason"] == "not a JSON object"


def test_empty_file_is_a_tail_with_nothing_yet_and_counts_are_singular(cli, db_path, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, out, _ = cli(["ingest", "decisions", empty, "--db", db_path])
    assert code == 0 and "note: empty file" in out
    code, out, _ = cli(["ingest", "decisions", empty, "--db", db_path, "--json"])
    assert code == 0 and json.loads(out)[0]["quarantined"] == []
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(_good()) + "\n")
    code, out, _ = cli(["ingest", "decisions", one, "--db", db_path])
    assert code == 0 and "1 record, 1 added" in out
    code, out, _ = cli(["ingest", "decisions", one, "--db", db_path])
    assert code == 0 and "note: no new lines since the last ingest" in out
