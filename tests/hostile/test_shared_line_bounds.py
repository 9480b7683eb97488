"""The shared line bounds and JSON reasons of ``prefixscope.core.bounds``, through ``ingest
otlp FILE`` beside ``ingest requests`` (the reference): a 5 MB line that is no OTLP export, a
line nested too deep, NaN/Infinity (not JSON), invalid UTF-8. Each file holds one hostile line
between two good ones (an OTLP export / a chat completion): the hostile line is quarantined
with the same reason in both ingesters and printed as ``quarantined file:line: reason``, the
good lines are stored. A 5 MB OTLP export line (``{"resourceSpans": ...``) is still read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixscope.core.bounds import LINE_TOO_LONG, MAX_LINE_BYTES, TOO_DEEP
from tests.hostile.support import count, expected_line, fresh_db, quarantine_rows, run_cli


def _span(i: int, pad: int = 0) -> dict:
    attrs = [{"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
             {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "100"}},
             {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "5"}}]
    if pad:
        attrs.append({"key": "pad", "value": {"stringValue": "p" * pad}})
    return {"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "chat m",
            "startTimeUnixNano": str(1764590000_000000000 + i * 10**9),
            "endTimeUnixNano": str(1764590001_000000000 + i * 10**9), "attributes": attrs}


def _otlp(i: int, pad: int = 0) -> bytes:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [
        {"scope": {"name": "t"}, "spans": [_span(i, pad)]}]}]}).encode()


def _chat(i: int) -> bytes:
    return json.dumps({"id": f"c-{i}", "object": "chat.completion", "created": 1764590000 + i,
                       "model": "m", "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
                      ).encode()


BIG = b'{"id":"x","pad":"' + b"a" * (5 * MAX_LINE_BYTES) + b'"}'
NAN = b'{"id":"n1","created":1764590000,"model":"m","usage":{"prompt_tokens":NaN}}'
INF = b'{"id":"n2","created":1764590000,"model":"m","usage":{"prompt_tokens":Infinity}}'
BAD_UTF8 = b'{"id":"a\xff\xfe","model":"m","usage":{"prompt_tokens":10}}'
DEEP = b"[" * 100_000
NAN_REASON = "not valid JSON: JSON is malformed: invalid character (byte 69)"
INF_REASON = "not valid JSON: JSON is malformed: invalid character (byte 69)"
UTF8 = "not valid JSON: not UTF-8 text (byte 8)"

# (case, hostile line, {ingester: reason}); the byte of bad UTF-8: 0-based, within its line
CASES = [
    ("5mb-line", BIG, {"otlp": LINE_TOO_LONG, "requests": LINE_TOO_LONG}),
    ("deep", DEEP, {"otlp": TOO_DEEP, "requests": TOO_DEEP}),
    ("nan", NAN, {"otlp": NAN_REASON, "requests": NAN_REASON}),
    ("infinity", INF, {"otlp": INF_REASON, "requests": INF_REASON}),
    ("invalid-utf8", BAD_UTF8, {"otlp": UTF8, "requests": UTF8}),
]
GOOD = {"otlp": _otlp, "requests": _chat}


@pytest.mark.parametrize("ingester", ["otlp", "requests"])
@pytest.mark.parametrize("case,line,reasons", CASES, ids=[c[0] for c in CASES])
def test_hostile_line_same_bound_and_reason(tmp_path: Path, ingester, case, line, reasons):
    f = tmp_path / "hostile.jsonl"
    f.write_bytes(b"\n".join([GOOD[ingester](0), line, GOOD[ingester](1)]) + b"\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", ingester, str(f), "--db", db])
    reason = reasons[ingester]
    assert code == 0, (code, out, err)
    assert quarantine_rows(db) == [(2, None, reason)]
    assert "quarantined " + expected_line(str(f), 2, None, reason) in err, err
    assert count(db, "SELECT count(*) FROM requests") == 2
    assert "aaaaaaaa" not in out + err


def test_a_5mb_otlp_export_line_is_still_read(tmp_path: Path):
    f = tmp_path / "big-export.jsonl"
    f.write_bytes(b"\n".join([_otlp(0, pad=5 * MAX_LINE_BYTES), _otlp(1)]) + b"\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "otlp", str(f), "--db", db])
    assert code == 0, (code, out, err)
    assert quarantine_rows(db) == []
    assert count(db, "SELECT count(*) FROM requests") == 2


@pytest.mark.parametrize("case,line,reasons", CASES, ids=[c[0] for c in CASES])
def test_every_line_bad_otlp_json_still_prints_the_document(tmp_path: Path, case, line,
                                                            reasons):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(line + b"\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "otlp", str(f), "--db", db, "--json"])
    assert code == 4, (code, out, err)
    doc = json.loads(out)
    assert doc["files"][0]["rows_quarantined"] == 1
    assert [(q["line"], q["field"], q["reason"]) for q in doc["quarantined"]] == [
        (1, None, reasons["otlp"])]
