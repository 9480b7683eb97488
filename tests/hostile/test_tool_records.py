"""Hostile records for the LiteLLM and Langfuse readers (`ingest litellm`, `ingest langfuse`):
values of the wrong JSON type where a name or a time belongs, CSV cells past the csv module's
field limit or nested past 64 levels, canaries in keys. Each case: no traceback, the exact
quarantine entry, the good record of the same file kept, no canary in any table or output.

Found by a review of issue 16 (before it, each of these was a traceback and lost the file).
"""

from __future__ import annotations

import csv
import json

import pytest

from prefixscope.store import db as store_db
from tests.hostile.support import fresh_db, quarantine_rows, run_cli

TENANT = "TENANT-CANARY-xyz"
PROMPT = "PROMPT-CANARY-abc"
NOT_TEXT = "not text (a list, object, number or boolean where a name belongs)"
TIME_RANGE = "time is outside 1970-01-01 to 2100-01-01 UTC"
MS_RANGE = "not a finite number of milliseconds from 0 to 10^9"

_SPEND = {"request_id": "good", "startTime": "2026-11-29 10:00:00.000",
          "endTime": "2026-11-29 10:00:01.000", "model": "m", "team_id": TENANT,
          "end_user": TENANT, "api_key": TENANT, "messages": PROMPT,
          "metadata": {"usage_object": {"prompt_tokens": 100, "completion_tokens": 5,
                                        "cache_read_input_tokens": 50}}}
_OBS = {"id": "good", "type": "GENERATION", "startTime": "2026-11-29T10:00:00Z",
        "endTime": "2026-11-29T10:00:01Z", "model": "m", "userId": TENANT, "input": PROMPT,
        "usageDetails": {"input": 10, "output": 2, "input_cached_tokens": 5}}

# (id, changes to the good record, expected (field, reason) or None = row kept)
LITELLM = [
    ("model-list", {"model": [PROMPT]}, ("model", NOT_TEXT)),
    ("model-object", {"model": {"k": PROMPT}}, ("model", NOT_TEXT)),
    ("model-number", {"model": 5}, ("model", NOT_TEXT)),
    ("provider-list", {"custom_llm_provider": [PROMPT]}, ("provider", NOT_TEXT)),
    ("request-id-list", {"request_id": [PROMPT]}, ("request_id", NOT_TEXT)),
    ("status-list", {"status": [PROMPT]}, ("status", NOT_TEXT)),
    ("api-base-number", {"api_base": 5}, None),
    ("api-base-open-ipv6", {"api_base": "http://[::1" + PROMPT}, None),
    ("call-type-list", {"call_type": [PROMPT]}, None),
    ("duration-inf-like", {"request_duration_ms": 1e308}, ("latency_ms", MS_RANGE)),
    ("duration-huge-int", {"request_duration_ms": 10 ** 400}, ("request_duration_ms", MS_RANGE)),
    ("start-huge-int", {"startTime": 10 ** 400}, ("startTime", TIME_RANGE)),
    ("start-year-1-plus-offset", {"startTime": "0001-01-01T00:00:00+01:00"},
     ("ts_unix_s", TIME_RANGE)),
    ("exclusive-sum-past-2^32", {"metadata": {"usage_object": {
        "prompt_tokens": 1, "completion_tokens": 1, "cache_read_input_tokens": 2 ** 31,
        "cache_creation_input_tokens": 2 ** 31}}},
     ("prompt_tokens", "prompt tokens with cache reads and writes over 4,294,967,295 tokens (2^32 - 1)")),
    ("ttft-negative-huge", {"completionStartTime": "2099-12-31T00:00:00Z"},
     ("ttft_ms", MS_RANGE)),
]
LANGFUSE = [
    ("usage-key-canary", {"usageDetails": {"input": 10, f"input_{TENANT}": "x" + PROMPT}},
     ("usageDetails", "token count is not a whole number")),
    ("model-list", {"model": [PROMPT]}, ("model", NOT_TEXT)),
    ("usage-sum-past-2^32", {"usageDetails": {"input": 2 ** 31, "input_x": 2 ** 31,
                                              "input_y": 2 ** 31}},
     ("usageDetails", "token counts summed over usage types over 4,294,967,295 tokens (2^32 - 1)")),
    ("id-list", {"id": [PROMPT]}, ("id", NOT_TEXT)),
    ("type-list", {"type": [PROMPT]}, "skipped"),
    ("user-list", {"userId": [TENANT]}, None),
    ("end-9999-minus-offset", {"endTime": "9999-12-31T23:59:59-23:59"},
     ("latency_ms", MS_RANGE)),
]


def _record(base: dict, i: int, change: dict, key: str) -> dict:
    rec = json.loads(json.dumps(base))
    rec[key] = f"rec-{i}"
    rec.update(change)
    return rec


def _check(db: str, code: int, out: str, err: str, path: str, expected) -> None:
    assert code == 0, (out, err)
    q = quarantine_rows(db)
    with store_db.reader(db) as con:
        ids = {r[0] for r in con.execute("SELECT request_id FROM requests").fetchall()}
        dump = json.dumps([con.execute(f"SELECT * FROM {t}").fetchall() for t in
                           ("requests", "quarantine", "ingest_sources")], default=str)
    assert "good" in ids  # the good record of the same file is kept
    if expected is None:
        assert q == [] and len(ids) == 2, (q, ids)
    elif expected == "skipped":
        assert q == [] and ids == {"good"}, (q, ids)
    else:
        assert q == [(1, expected[0], expected[1])], q
        assert ids == {"good"}
        assert f"{path}:1: {expected[0]}: {expected[1]}" in out + err
    for text in (dump, out, err):
        assert TENANT not in text and PROMPT not in text


def _jsonl(tmp_path, base, key, change) -> str:
    p = tmp_path / "x.jsonl"
    good = dict(base)
    # CRLF line ends, as a Windows export writes them
    p.write_bytes((json.dumps(_record(base, 1, change, key)) + "\r\n"
                   + json.dumps(good) + "\r\n").encode())
    return str(p)


@pytest.mark.parametrize("cid,change,expected", LITELLM, ids=[c[0] for c in LITELLM])
def test_litellm_hostile_record(cid, change, expected, tmp_path):
    db = fresh_db(tmp_path)
    path = _jsonl(tmp_path, _SPEND, "request_id", change)
    code, out, err = run_cli(["ingest", "litellm", path, "--db", db])
    _check(db, code, out, err, path, expected)


@pytest.mark.parametrize("cid,change,expected", LANGFUSE, ids=[c[0] for c in LANGFUSE])
def test_langfuse_hostile_record(cid, change, expected, tmp_path):
    db = fresh_db(tmp_path)
    path = _jsonl(tmp_path, _OBS, "id", change)
    code, out, err = run_cli(["ingest", "langfuse", path, "--db", db])
    _check(db, code, out, err, path, expected)


def _csv(tmp_path, cell: str) -> str:
    p = tmp_path / "spend.csv"
    head = ["request_id", "startTime", "prompt_tokens", "completion_tokens", "metadata"]
    with open(p, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(head)
        w.writerow(["rec-1", "2026-11-29 10:00:00.000", "10", "1", cell])
        w.writerow(["good", "2026-11-29 10:00:00.000", "10", "1", "{}"])
    return str(p)


@pytest.mark.parametrize("cid,cell,expected", [
    ("cell-past-csv-field-limit", "x" * 2_000_000,
     (None, "CSV field longer than 1,048,576 bytes (1 MiB)")),
    ("cell-nested-100000", "[" * 100_000, ("metadata", "JSON nested deeper than 64 levels")),
    ("cell-200-kib-kept-limit-raised", json.dumps({"pad": "y" * 200_000}), None),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
def test_litellm_hostile_csv_cell(cid, cell, expected, tmp_path):
    db = fresh_db(tmp_path)
    path = _csv(tmp_path, cell)
    code, out, err = run_cli(["ingest", "litellm", path, "--db", db])
    assert code == 0, (out, err)
    q = quarantine_rows(db)
    with store_db.reader(db) as con:
        ids = {r[0] for r in con.execute("SELECT request_id FROM requests").fetchall()}
    if expected is None:
        assert q == [] and ids == {"rec-1", "good"}
    else:
        assert q == [(1, expected[0], expected[1])], q
        assert ids == {"good"}


def _span_line(i: int, attrs: list, end: str = "1764410401000000000") -> str:
    base = [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "10"}},
            {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "1"}}]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "%032x" % i, "spanId": "%016x" % i, "startTimeUnixNano": "1764410400000000000",
        "endTimeUnixNano": end, "attributes": base + attrs}]}]}]})


def _ttft(v) -> list:
    return [{"key": "gen_ai.server.time_to_first_token", "value": {"doubleValue": v}}]


@pytest.mark.parametrize("cid,line,expected", [
    ("ttft-infinity", _span_line(1, _ttft("Infinity")), "ttft_ms"),
    ("ttft-nan", _span_line(1, _ttft("NaN")), "ttft_ms"),
    ("ttft-negative", _span_line(1, _ttft(-5)), "ttft_ms"),
    ("end-max-uint64", _span_line(1, [], end="18446744073709551615"), "latency_ms"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
def test_otlp_file_times_out_of_bounds_are_quarantined(cid, line, expected, tmp_path):
    """Before: inf, NaN or negative TTFT and a 5.8e11 ms latency were stored as they came."""
    db = fresh_db(tmp_path)
    p = tmp_path / "traces.jsonl"
    p.write_text(line + "\n" + _span_line(2, []) + "\n")
    code, out, err = run_cli(["ingest", "otlp", str(p), "--db", db])
    assert code == 0, (out, err)
    assert quarantine_rows(db) == [
        (1, f"resourceSpans[0].scopeSpans[0].spans[0].{expected}", MS_RANGE)]
    with store_db.reader(db) as con:
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 1


def test_otlp_listener_refuses_compression_bombs_and_deep_json(tmp_path):
    """A 64 GiB-when-inflated gzip body was decompressed whole (MemoryError or the OOM killer);
    JSON nested 100,000 deep was a RecursionError in the handler (no answer, a traceback)."""
    import gzip
    import zlib

    import httpx

    from tests.test_otlp_ingest import Listener

    db = fresh_db(tmp_path)
    zeros = b"\0" * (80 << 20)  # 80 MiB inflated, past the 64 MiB bound; ~80 KiB compressed
    good = _span_line(7, []).encode()
    listener = Listener(db, tmp_path)
    try:
        def post(body: bytes, enc: str | None, ctype: str = "application/json"):
            h = {"Content-Type": ctype}
            if enc:
                h["Content-Encoding"] = enc
            return httpx.post(listener.endpoint, content=body, headers=h, timeout=60)

        codes = [post(gzip.compress(zeros), "gzip").status_code,
                 post(zlib.compress(zeros), "deflate", "application/x-protobuf").status_code,
                 post(b"[" * 100_000, None).status_code,
                 post(gzip.compress(good)[:-12], "gzip").status_code,
                 post(gzip.compress(good), "gzip").status_code]
    finally:
        stats = listener.stop()
    assert codes == [413, 413, 400, 400, 200]
    assert stats["spans_added"] == 1
    err = listener.errlog.read_text()
    assert "Traceback" not in err and "MemoryError" not in err


@pytest.mark.parametrize("command", ["requests", "decisions", "kv-events", "litellm", "langfuse",
                                     "otlp"])
def test_symlink_loop_and_dangling_link_are_named(command, tmp_path):
    """Was "no such file" for both (issue 12: never that for something that exists)."""
    db = fresh_db(tmp_path)
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    (tmp_path / "d.jsonl").symlink_to(tmp_path / "nothing.jsonl")
    code, out, err = run_cli(["ingest", command, str(tmp_path / "a.jsonl"),
                              str(tmp_path / "d.jsonl"), "--db", db])
    assert code == 4, (out, err)
    assert f"{tmp_path / 'a.jsonl'}: too many levels of symbolic links" in err
    assert f"{tmp_path / 'd.jsonl'}: a symbolic link to a missing file" in err


def test_a_whole_json_document_past_256_mib_is_refused_before_reading(tmp_path):
    """A 173 MB Langfuse array took 3.6 GB of memory; JSON lines are read in batches."""
    from prefixscope.ingest import record_files

    db = fresh_db(tmp_path)
    p = tmp_path / "obs.json"
    with open(p, "wb") as fh:
        fh.write(b"[")
        fh.truncate(record_files.MAX_DOCUMENT_BYTES + 2)  # sparse: no disk, no time
    code, out, err = run_cli(["ingest", "langfuse", str(p), "--db", db])
    assert code == 4, (out, err)
    assert "a JSON document larger than 256 MiB is not read whole; give it as JSON lines" in err
