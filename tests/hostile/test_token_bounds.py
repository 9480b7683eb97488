"""A request's token counts are bounded at 2^32 - 1 (prefixscope.core.bounds.MAX_TOKENS), so
that every SUM the rollups take over up to 2^31 rows fits DuckDB's BIGINT.

The new user's repro: three requests of 4e18 prompt tokens each (each below the old per-row
bound of 2^62) made the minute rollup's ``CAST(sum(prompt_tokens) AS BIGINT)`` overflow, a
traceback, exit 1 and the whole file rolled back.
"""

from __future__ import annotations

import json

import duckdb

from prefixscope.core.bounds import MAX_TOKENS
from tests.hostile.support import fresh_db, run_cli


def _line(rid: str, prompt: int, cached: int, completion: int = 1, ts: int = 1796000000) -> str:
    return json.dumps({"id": rid, "model": "coder-7b", "created": ts, "usage": {
        "prompt_tokens": prompt, "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached}}})


def test_overflow_repro_ingests_good_rows_and_quarantines_the_huge_ones(tmp_path):
    f = tmp_path / "overflow.jsonl"
    f.write_text("\n".join([_line(f"b{i}", 4 * 10 ** 18, 4 * 10 ** 18, ts=1796000000 + i)
                            for i in range(3)] + [_line("e1", 100, 50, ts=1796000010)]) + "\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "requests", f, "--db", db, "--json"])
    assert code == 0, err
    res = json.loads(out)
    q = res["quarantined"]
    assert [(p["line"], p["field"], p["reason"]) for p in q] == [
        (n, "$.usage.prompt_tokens", "over 4,294,967,295 tokens (2^32 - 1)") for n in (1, 2, 3)]
    assert "4000000000000000000" not in out + err
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT request_id, prompt_tokens, cached_tokens FROM requests"
                           ).fetchall() == [("e1", 100, 50)]
        assert con.execute("SELECT sum(prompt_tokens) FROM request_rollup_1m").fetchone() == (100,)


def test_counts_at_the_bound_are_kept_and_their_sums_fit(tmp_path):
    f = tmp_path / "edge.jsonl"
    lines = [_line(f"m{i}", MAX_TOKENS, MAX_TOKENS, completion=MAX_TOKENS, ts=1796000000 + i)
             for i in range(5)]
    lines.append(_line("over-cached", 10, MAX_TOKENS + 1))
    lines.append(_line("over-completion", 10, 5, completion=MAX_TOKENS + 1))
    # an exclusive (Anthropic) shape: input + reads + writes, each under the bound, sum over it
    lines.append(json.dumps({"id": "anth", "type": "message", "model": "coder-7b",
                             "created": 1796000100, "usage": {
                                 "input_tokens": 2 ** 31, "output_tokens": 1,
                                 "cache_read_input_tokens": 2 ** 31,
                                 "cache_creation_input_tokens": 2 ** 31}}))
    f.write_text("\n".join(lines) + "\n")
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "requests", f, "--db", db, "--json"])
    assert code == 0, err
    got = {p["line"]: (p["field"], p["reason"]) for p in json.loads(out)["quarantined"]}
    assert got[6] == ("$.usage.prompt_tokens_details.cached_tokens",
                      "over 4,294,967,295 tokens (2^32 - 1)")
    assert got[7] == ("$.usage.completion_tokens", "over 4,294,967,295 tokens (2^32 - 1)")
    assert got[8][1] == "prompt tokens with cache reads and writes over 4,294,967,295 tokens (2^32 - 1)"
    assert len(got) == 3
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*), sum(prompt_tokens) FROM requests").fetchone() == (
            5, 5 * MAX_TOKENS)
        assert con.execute("SELECT sum(prompt_tokens), sum(cached_tokens) FROM request_rollup_1m"
                           ).fetchone() == (5 * MAX_TOKENS, 5 * MAX_TOKENS)
    # and the worst case the bound is for: 2^31 rows at the bound still fit a BIGINT
    assert (2 ** 31) * MAX_TOKENS < 2 ** 63 - 1
