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
    ("ttft-negative-huge", {"completionStartTime": "2099-12-31T00:00:00Z"},
     ("ttft_ms", MS_RANGE)),
]
LANGFUSE = [
    ("usage-key-canary", {"usageDetails": {"input": 10, f"input_{TENANT}": "x" + PROMPT}},
     ("usageDetails", "token count is not a whole number")),
    ("model-list", {"model": [PROMPT]}, ("model", NOT_TEXT)),
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
