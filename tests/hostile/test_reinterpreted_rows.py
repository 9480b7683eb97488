"""``ingest requests`` says when it reinterpreted rows: cached tokens above prompt tokens are
read as exclusive input (prompt = input + reads + writes, flag ``exclusive-input-suspected``,
docs/ingest.md); the CLI prints a note with the count and ``--json`` carries
``rows_reinterpreted`` (additive), so a user learns the stored numbers are not the file's."""

from __future__ import annotations

import json

import duckdb

from prefixscope.ingest.usage import ingest_usage_file_detailed
from tests.hostile.support import fresh_db, run_cli

NOTE = ("2 requests had cached tokens above prompt tokens: read as exclusive input (prompt = "
        "input + cache reads + writes, flag exclusive-input-suspected; docs/ingest.md)")


def _lines(n_ok: int):
    rows = [{"ts_unix_s": 1795960925.0 + i, "request_id": f"ok-{i}", "model": "m",
             "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 50}}}
            for i in range(n_ok)]
    rows += [{"ts_unix_s": 1795961925.0 + i, "request_id": f"gt-{i}", "model": "m",
              "usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 500}}}
             for i in range(2)]
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_cli_prints_and_json_counts_the_reinterpreted_rows(tmp_path):
    f = tmp_path / "u.jsonl"
    f.write_text(_lines(3))
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "requests", f, "--db", db])
    assert code == 0, err
    assert out.splitlines() == [f"{f}: 5 requests added, 0 already stored, 0 lines quarantined",
                                f"  note: {NOTE}"]
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT request_id, prompt_tokens, cached_tokens, flags FROM requests "
                           "WHERE request_id LIKE 'gt-%' ORDER BY 1").fetchall() == [
            ("gt-0", 510, 500, "exclusive-input-suspected"),
            ("gt-1", 510, 500, "exclusive-input-suspected")]
    g = tmp_path / "v.jsonl"
    g.write_text(_lines(1).replace('"gt-', '"gt2-'))
    code, out, err = run_cli(["ingest", "requests", g, "--db", db, "--json"])
    assert code == 0, err
    [doc] = json.loads(out)["files"]
    assert (doc["rows_added"], doc["rows_duplicate"], doc["rows_reinterpreted"], doc["note"]) \
        == (2, 1, 2, NOTE)  # ok-0 is already stored


def test_none_reinterpreted_has_no_note_and_zero(tmp_path):
    f = tmp_path / "u.jsonl"
    f.write_text(_lines(3).split('{"ts_unix_s": 1795961925.0')[0])
    code, out, err = run_cli(["ingest", "requests", f, "--db", fresh_db(tmp_path), "--json"])
    assert code == 0, err
    [doc] = json.loads(out)["files"]
    assert (doc["rows_added"], doc["rows_reinterpreted"], doc["note"]) == (3, 0, None)


def test_the_parallel_reader_counts_them_too(tmp_path):
    f = tmp_path / "u.jsonl"
    f.write_text(_lines(2000))
    db = fresh_db(tmp_path)
    with duckdb.connect(db) as con:
        summary, _ = ingest_usage_file_detailed(con, f, workers=2)
    assert (summary.rows_added, summary.rows_reinterpreted) == (2002, 2)
    assert summary.note == NOTE
