"""``ingest langfuse`` on a file holding lines of other sources: every line is ingested or
quarantined (``file:line: id: not a Langfuse observation ...``) and counted; none is dropped in
silence. Langfuse's own observations without usage (SPAN, EVENT) are still skipped."""

from __future__ import annotations

import json

import duckdb

from prefixscope.ingest.langfuse import NOT_OBSERVATION
from tests.hostile.support import fresh_db, run_cli

FOREIGN = [
    {"id": "c1", "model": "coder-7b", "created": 1796000000,  # an OpenAI usage log line
     "usage": {"prompt_tokens": 10, "completion_tokens": 1}},
    {"model": "coder-7b", "messages": [{"role": "system", "content": "PROMPT-SECRET"}]},
    {},
    {"request_id": "r1", "startTime": "2026-11-30T10:00:00Z", "prompt_tokens": 5},  # LiteLLM
    {"resourceSpans": []},  # OTLP
    {"ts": 1796000000, "tenant": "tenant-SECRET", "decision": "accept"},
]
GENERATION = {"id": "g1", "traceId": "t1", "type": "GENERATION", "model": "coder-7b",
              "startTime": "2026-11-30T10:00:00Z", "usageDetails": {"input": 100, "output": 2}}
SPAN = {"id": "s1", "traceId": "t1", "type": "SPAN", "startTime": "2026-11-30T10:00:00Z"}


def test_every_foreign_line_is_quarantined_and_counted(tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in [*FOREIGN, GENERATION, SPAN]))
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "langfuse", f, "--db", db, "--json"])
    assert code == 0, err
    res = json.loads(out)
    (file_res,) = res["files"]
    assert (file_res["rows_added"], file_res["rows_quarantined"]) == (1, 6)
    assert [(q["line"], q["field"], q["reason"]) for q in res["quarantined"]] == [
        (n, "id", NOT_OBSERVATION) for n in range(1, 7)]
    assert "SECRET" not in out + err
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT request_id, prompt_tokens, completion_tokens FROM requests"
                           ).fetchall() == [("g1", 100, 2)]


def test_a_file_of_only_foreign_lines_reads_nothing_and_says_so(tmp_path):
    f = tmp_path / "usage.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in FOREIGN))
    code, out, err = run_cli(["ingest", "langfuse", f, "--db", fresh_db(tmp_path)])
    assert code == 4
    assert f"{f}: 0 requests added, 0 already stored, 6 lines quarantined" in out + err
    assert f"quarantined {f}:1: id: {NOT_OBSERVATION}" in err
