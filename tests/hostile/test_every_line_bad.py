"""A file whose every line is bad, through each ingester that reads lines (``ingest metrics``,
``ingest kv-events``, ``ingest decisions``, and ``ingest requests`` as the reference).

The rule: the command fails (exit 4) but first prints each quarantined line on stderr as
``quarantined file:line: field: reason``; the final error names how many lines and the first
reason; with ``--json`` it still prints its JSON document on stdout, holding the quarantined
count and the reasons. No value of the input (a tenant label, prompt text) is printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixscope.core.bounds import LINE_TOO_LONG, MAX_LINE_BYTES, TOO_DEEP
from tests.hostile.support import expected_line, fresh_db, quarantine_rows, run_cli

_SERIES = '{engine="0",model_name="m"}'
EXPO_BAD = (
    "# TYPE vllm:prefix_cache_queries_total counter\n"
    f"vllm:prefix_cache_queries_total{_SERIES} NaN\n"
    f"vllm:prefix_cache_hits_total{_SERIES} +Inf\n"
    f"vllm:prompt_tokens_total{_SERIES} 1e400\n"
    f"vllm:num_preemptions_total{_SERIES} -5\n"
    f"vllm:kv_cache_usage_perc{_SERIES} 7\n"
    'vllm:prefix_cache_queries_total{engine="0",model_name="m",tenant="acme-corp"} 5\n')
NOT_FINITE = "counter value is not a finite number"
TENANT = ("a label that is not a vLLM label may hold a tenant id; configure an HMAC key "
          "(PREFIXSCOPE_HMAC_KEY_FILE) to keep such labels as digests")
EXPO_BAD_PROBLEMS = [
    (2, "vllm:prefix_cache_queries_total", NOT_FINITE),
    (3, "vllm:prefix_cache_hits_total", NOT_FINITE),
    (4, "vllm:prompt_tokens_total", NOT_FINITE),
    (5, "vllm:num_preemptions_total", "counter value is negative"),
    (6, "vllm:kv_cache_usage_perc", "a fraction outside 0 to 1"),
    (7, "vllm:prefix_cache_queries_total", TENANT),
]
BIG = b'vllm:prefix_cache_queries_total{model_name="' + b"x" * (5 * MAX_LINE_BYTES) + b'"} 1\n'
DEEP = b"[" * 100_000 + b"\n"
NOT_JSON_KV = b"not json at all\n"

# (id, command, file name, bytes, [(line, field, reason)] in order)
CASES = [
    ("metrics-all-bad", "metrics", "expo_bad.txt", EXPO_BAD.encode(), EXPO_BAD_PROBLEMS),
    ("metrics-5mb-line", "metrics", "expo_big.txt", BIG, [(1, None, LINE_TOO_LONG)]),
    ("kv-events-deep", "kv-events", "deep.jsonl", DEEP, [(1, None, TOO_DEEP)]),
    ("kv-events-two-bad", "kv-events", "bad.jsonl", DEEP + NOT_JSON_KV,
     [(1, None, TOO_DEEP),
      (2, None, "not valid JSON: Expecting value (byte 0)")]),
    ("requests-deep", "requests", "deep.jsonl", DEEP, [(1, None, TOO_DEEP)]),
    ("decisions-two-bad", "decisions", "decisions.jsonl", DEEP + b'{"id": "a"}\n',
     [(1, None, TOO_DEEP),
      (2, None, "unknown key (not part of the decision-log format, docs/scopes.md)")]),
]


def _final_error(command: str, f: Path, problems: list[tuple]) -> str:
    """The error line naming the count and the first reason (ingest requests: its own)."""
    first = expected_line(str(f), *problems[0])
    return {
        "metrics": f"error: nothing could be read: {f}: every line quarantined "
                   f"({len(problems)}; the first: {first})",
        "kv-events": f"error: nothing could be read: {f}: every line quarantined "
                     f"({len(problems)}; the first: {first})",
        "decisions": f"error: {f}: all {len(problems)} lines quarantined; the first: {first}",
        "requests": "error: no request could be read: every line was quarantined",
    }[command]


def _json_problems(doc) -> tuple[int, list[tuple]]:
    """(quarantined count, [(line, field, reason)]) of either --json shape: the list of
    outcomes (metrics, kv-events) or the files document (requests)."""
    if isinstance(doc, dict):
        n = sum(f["rows_quarantined"] for f in doc["files"])
        qs = doc["quarantined"]
    else:
        n = sum(o["rows_quarantined"] for o in doc)
        qs = [q for o in doc for q in o["quarantined"]]
    return n, [(q["line"], q["field"], q["reason"]) for q in qs]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("case_id,command,name,data,problems", CASES, ids=[c[0] for c in CASES])
def test_every_line_bad_fails_with_the_reasons(tmp_path: Path, case_id, command, name, data,
                                               problems, as_json):
    f = tmp_path / name
    f.write_bytes(data)
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", command, str(f), "--db", db, "--at", "1795960920"]
                             if command == "metrics" else ["ingest", command, str(f), "--db", db]
                             ) if not as_json else run_cli(
        ["ingest", command, str(f), "--db", db, "--json"])
    assert code == 4, (code, out, err)
    for line, fld, reason in problems:
        if as_json and command == "requests":
            break  # ingest requests --json keeps its reasons in the document
        assert "quarantined " + expected_line(str(f), line, fld, reason) in err, err
    assert _final_error(command, f, problems) in err, err
    assert err.strip().splitlines()[-1].startswith("error: "), err
    assert [(r[0], r[1], r[2]) for r in quarantine_rows(db)] == problems
    if as_json:
        n, got = _json_problems(json.loads(out))
        assert n == len(problems)
        assert got == problems
    else:
        assert f"{len(problems)} " in out and "quarantined" in out
    assert "acme-corp" not in out + err
    assert "xxxxxxxx" not in out + err
