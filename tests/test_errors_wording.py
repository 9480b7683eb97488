"""One wording for a bad record across readers (``prefixscope.core.errors``): file:line: field: reason,
and ``not valid JSON: <decoder message> (byte N)`` whichever decoder failed."""

from __future__ import annotations

import json

import msgspec
import pytest

from prefixscope.core.errors import ParseError, invalid_json_reason, problem_text


def _stdlib_error(text: str) -> json.JSONDecodeError:
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads(text)
    return info.value


def _msgspec_error(text: str) -> msgspec.DecodeError:
    with pytest.raises(msgspec.DecodeError) as info:
        msgspec.json.decode(text)
    return info.value


def test_problem_text():
    assert problem_text("a.jsonl", 3, "missing", "$.usage") == "a.jsonl:3: $.usage: missing"
    assert problem_text("a.jsonl", 3, "missing") == "a.jsonl:3: missing"
    assert problem_text("a.jsonl", 3, "missing", "") == "a.jsonl:3: missing"
    assert problem_text("run.json", None, "bad") == "run.json: bad"
    assert str(ParseError("a.jsonl", 2, "bad", "$.x")) == "a.jsonl:2: $.x: bad"


def test_both_decoders_give_the_same_shape_and_offset():
    assert invalid_json_reason(_stdlib_error("{not json")) == (
        "not valid JSON: Expecting property name enclosed in double quotes (byte 1)")
    assert invalid_json_reason(_msgspec_error("{not json")) == (
        "not valid JSON: JSON is malformed: object keys must be strings (byte 1)")


def test_stdlib_offset_is_bytes_within_the_line():
    # "é" is 2 bytes: the error after it is at byte 8 of the line, character 7
    text = '{"a": "é"} x'
    assert invalid_json_reason(_stdlib_error(text)).endswith(f"(byte {len(text[:11].encode())})")
    multi = '{"a": 1,\n "b": }'
    assert invalid_json_reason(_stdlib_error(multi)).endswith("(byte 6)")


def test_replay_sim_and_ingest_requests_word_a_bad_line_alike(cli, tmp_path, db_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                     "{not json\n")
    usage = tmp_path / "usage.jsonl"
    usage.write_text('{"model": "m", "usage": {"prompt_tokens": 5}}\n{not json\n')
    code, _, sim_err = cli(["replay", "sim", trace, "--format", "mooncake",
                            "--out", tmp_path / "run"])
    assert code == 0
    code, _, ingest_err = cli(["ingest", "requests", usage, "--db", db_path])
    assert code == 0
    assert f"skipped {trace}:2: not valid JSON: " in sim_err.replace("\n", "")
    assert f"quarantined {usage}:2: not valid JSON: " in ingest_err.replace("\n", "")
    assert sim_err.replace("\n", "").split(f"{trace}:2: ")[1].endswith("(byte 1)")


def test_live_run_manifest_errors_use_the_same_wording(cli, tmp_path, db_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text('{"run_id":\n')
    code, _, err = cli(["ingest", "live-run", run, "--db", db_path])
    assert code == 4 and f"error: {run / 'run.json'}:2: not valid JSON: Expecting value (byte 0)" in err
    (run / "run.json").write_bytes(b"\xff\xfe{")
    code, _, err = cli(["ingest", "live-run", run, "--db", db_path])
    assert code == 4 and "run.json:1: not UTF-8 text (byte 0)" in err and "Traceback" not in err


def test_a_bad_utf8_byte_before_the_json_fault_is_the_reason(cli, tmp_path, db_path):
    """The new-user check of session 11: a line starting with the invalid sequence C3 28 was
    `JSON is malformed: invalid character (byte 0)`; its first fault is the UTF-8 one. A line
    whose JSON fault comes first keeps it (NUL, then an invalid byte later)."""
    usage = tmp_path / "u.jsonl"
    usage.write_bytes(b'{"request_id":"a","model":"m","usage":{"prompt_tokens":10}}\n'
                      b'\xc3\x28{"x":1}\n'
                      b'\x00 \xff\n')
    code, out, err = cli(["ingest", "requests", usage, "--db", db_path, "--json"])
    assert code == 0
    reasons = [(q["line"], q["reason"]) for q in json.loads(out)["quarantined"]]
    assert reasons == [(2, "not valid JSON: not UTF-8 text (byte 0)"),
                       (3, "not valid JSON: JSON is malformed: invalid character (byte 0)")]


def test_a_trace_line_cut_short_is_at_fault_at_its_end(cli, tmp_path):
    """`replay sim` on a record cut short (with its newline) said `(byte 0)`: json.loads saw
    the newline as a second line. The byte is now the line's end."""
    trace = tmp_path / "t.jsonl"
    cut = b'{"prompt_token_ids":[1,2'
    trace.write_bytes(b'{"prompt_token_ids":[1,2,3],"output_tokens":1}\n' + cut + b"\n")
    code, _, err = cli(["replay", "sim", trace, "--out", tmp_path / "out"])
    assert code == 0, err
    assert (f"{trace}:2: not valid JSON: Expecting ',' delimiter (byte {len(cut)})"
            in err.replace("\n", ""))
