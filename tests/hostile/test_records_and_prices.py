"""Hostile input found by the second new-user check of session 11: ``ingest prices`` with a
price past the store's DECIMAL(18, 6) (``1e400``, ``1e30``, a GPU-hour price that gives one)
was a DuckDB ``ConversionException`` or ``decimal.InvalidOperation`` traceback; ``ingest
litellm`` / ``langfuse`` on a document whose first line is nested 100,000 deep was a
``RecursionError`` traceback; their unfinished last line was left for the next run without a
word, and a complete last line without newline was never read. Real CLI, real store."""

from __future__ import annotations

import json

import pytest

from prefixscope.ingest.jsonl_driver import TAIL_LEFT_NOTE
from tests.hostile.support import run_cli

PRICE = '[models."m"]\ncurrency = "USD"\ncached_input = 0\nsource = "x"\n'


@pytest.mark.parametrize("body,field,words", [
    ("input = 1e400\noutput = 1\n", "input", "Input should be less than or equal to 1000000"),
    ("input = 1e30\noutput = 1\n", "input", "Input should be less than or equal to 1000000"),
    ("input = 1\noutput = 1" + "0" * 400 + "\n", "output",
     "Input should be less than or equal to 1000000"),
    ("gpu_hour_price = 1e300\nprefill_tokens_per_s = 1\noutput = 1\n", "gpu_hour_price",
     "gives a price over 1,000,000 USD per million tokens at this throughput"),
    ("gpu_hour_price = 2\nprefill_tokens_per_s = 1e-300\noutput = 1\n", "gpu_hour_price",
     "gives a price over 1,000,000 USD per million tokens at this throughput"),
], ids=["1e400", "1e30", "400-digit", "gpu-hour-huge", "rate-tiny"])
def test_a_price_past_the_bound_is_a_named_error(tmp_path, body, field, words):
    f = tmp_path / "p.toml"
    f.write_text(PRICE + body)
    code, out, err = run_cli(["ingest", "prices", str(f), "--db", str(tmp_path / "s.duckdb")])
    assert code == 2, (out, err)
    assert f'error: {f}: models."m".{field}: {words}' in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["litellm", "langfuse"])
def test_a_document_nested_too_deep_on_its_first_line_is_quarantined(tmp_path, command):
    f = tmp_path / "deep.json"
    f.write_text('{"data":' + "[" * 100_000 + "\n")
    code, out, err = run_cli(["ingest", command, str(f), "--db", str(tmp_path / "s.duckdb")])
    assert code == 4, (out, err)
    assert f"quarantined {f}:1: JSON nested deeper than 64 levels" in err
    assert "Traceback" not in err


LITELLM = {"request_id": "a", "status": "success", "model": "m", "prompt_tokens": 10,
           "completion_tokens": 1, "startTime": "2026-12-01T00:00:00Z",
           "call_type": "completion"}


def test_litellm_notes_an_unfinished_last_line_and_reads_a_complete_one(tmp_path):
    f = tmp_path / "spend.jsonl"
    db = str(tmp_path / "s.duckdb")
    f.write_text(json.dumps(LITELLM) + "\n" + '{"request_id": "b", "status": "succ')
    code, out, err = run_cli(["ingest", "litellm", str(f), "--db", db, "--json"])
    assert code == 0, err
    (s,) = json.loads(out)["files"]
    assert (s["rows_added"], s["note"]) == (1, TAIL_LEFT_NOTE)
    # the writer finishes the line, without a newline: complete JSON is read now
    f.write_text(json.dumps(LITELLM) + "\n" + json.dumps({**LITELLM, "request_id": "b"}))
    code, out, err = run_cli(["ingest", "litellm", str(f), "--db", db, "--json"])
    (s,) = json.loads(out)["files"]
    assert (code, s["rows_added"], s["note"]) == (0, 1, None)
