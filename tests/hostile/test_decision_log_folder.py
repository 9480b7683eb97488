"""``ingest decisions`` on the gateway's log folder and on unfinished last lines: only the
decision files of a folder are read (the usage log beside them is not quarantined line by
line, run after run), a complete final line without newline is stored as ``ingest requests``
stores it, a half-written or too-deep one is left for the next run and the note says so (not
"no new lines since the last ingest" on a new database). Real DuckDB files."""

from __future__ import annotations

import json

import duckdb


def _decision(rid: str) -> dict:
    return {"v": 1, "record": "decision", "ts_unix_s": 1795960007.415, "request_id": rid,
            "scope": "TENANT", "namespace_digest": "4bad35c5471a012d", "decision": "miss",
            "first_mismatch": None, "reasons": [], "candidate_cached_tokens": 0,
            "accepted_cached_tokens": 0, "salt_applied": True}


def _usage(rid: str) -> dict:
    return {"ts_unix_s": 1795960007.4, "request_id": rid, "run_id": "", "model": "m",
            "instance": "gw", "endpoint": "chat", "ttft_ms": 1.0, "latency_ms": 2.0,
            "scope": "TENANT", "tenant_digest": "4bad35c5471a012d",
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}


def _count(db: str, sql: str) -> int:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute(sql).fetchone()[0]


def test_a_gateway_log_folder_reads_only_the_decision_files(cli, db_path, tmp_path):
    logs = tmp_path / "gateway"  # what gateway/logs.py writes
    logs.mkdir()
    (logs / "decisions.jsonl").write_text(json.dumps(_decision("d-2")) + "\n")
    (logs / "decisions.1.jsonl").write_text(json.dumps(_decision("d-1")) + "\n")
    (logs / "usage.jsonl").write_text("".join(json.dumps(_usage(f"u-{i}")) + "\n"
                                             for i in range(12)))
    (logs / "usage.1.jsonl").write_text("")
    for _ in range(2):  # the compose tailer runs it again and again
        code, out, err = cli(["ingest", "decisions", logs, "--db", db_path])
        assert code == 0, err
        assert "usage" not in out + err
        assert "quarantined" not in err
    assert f"{logs / 'decisions.1.jsonl'}: " in out and f"{logs / 'decisions.jsonl'}: " in out
    assert _count(db_path, "SELECT count(*) FROM gateway_decisions") == 2
    assert _count(db_path, "SELECT count(*) FROM quarantine") == 0
    # usage files only: the folder has no decision file
    only_usage = tmp_path / "usage-only"
    only_usage.mkdir()
    (only_usage / "usage.jsonl").write_text(json.dumps(_usage("u-x")) + "\n")
    code, _, err = cli(["ingest", "decisions", only_usage, "--db", db_path])
    assert code == 4
    assert f"{only_usage}: a folder without decisions*.jsonl files" in err


def test_a_complete_last_line_without_newline_is_stored_like_ingest_requests(cli, db_path,
                                                                            tmp_path):
    dec = tmp_path / "dec_nonl.jsonl"
    dec.write_text(json.dumps(_decision("d-1")) + "\n" + json.dumps(_decision("d-2")))
    use = tmp_path / "usage_nonl.jsonl"
    use.write_text(json.dumps(_usage("u-1")) + "\n" + json.dumps(_usage("u-2")))
    code, out, err = cli(["ingest", "decisions", dec, "--db", db_path])
    assert code == 0, err
    assert "2 records, 2 added" in out
    assert cli(["ingest", "requests", use, "--db", db_path])[0] == 0
    assert _count(db_path, "SELECT count(*) FROM gateway_decisions") == 2
    assert _count(db_path, "SELECT count(*) FROM requests") == 2
    # appending after the unterminated line: the file now continues it, nothing stored twice
    with dec.open("a") as fh:
        fh.write("\n" + json.dumps(_decision("d-3")) + "\n")
    code, out, err = cli(["ingest", "decisions", dec, "--db", db_path])
    assert code == 0, err
    assert "1 record, 1 added" in out
    assert _count(db_path, "SELECT count(*) FROM gateway_decisions") == 3


def test_a_half_written_last_line_is_left_whole_for_the_next_run(cli, db_path, tmp_path):
    dec = tmp_path / "decisions.jsonl"
    line = json.dumps(_decision("d-2"))
    dec.write_text(json.dumps(_decision("d-1")) + "\n" + line[:40])
    code, out, err = cli(["ingest", "decisions", dec, "--db", db_path])
    assert code == 0, err
    assert "1 record, 1 added, 0 already present, 0 quarantined" in out
    assert "note: the last line has no newline and is not complete JSON: left for the next " \
           "ingest" in out
    use = tmp_path / "usage.jsonl"  # ingest requests: the same rule, the same note
    use.write_text(json.dumps(_usage("u-1"))[:40])
    code, out, err = cli(["ingest", "requests", use, "--db", db_path])
    assert code == 0, err
    assert "note: the last line has no newline and is not complete JSON" in out
    assert _count(db_path, "SELECT count(*) FROM requests") == 0
    assert _count(db_path, "SELECT count(*) FROM gateway_decisions") == 1
    with dec.open("a") as fh:  # the writer finishes the line
        fh.write(line[40:] + "\n")
    code, out, err = cli(["ingest", "decisions", dec, "--db", db_path])
    assert code == 0, err
    assert "1 record, 1 added, 0 already present, 0 quarantined" in out
    assert "note:" not in out
    assert _count(db_path, "SELECT count(*) FROM gateway_decisions") == 2
    assert _count(db_path, "SELECT count(*) FROM quarantine") == 0


def test_a_deep_json_file_without_newline_on_a_new_database_says_why(cli, db_path, tmp_path):
    """The new user's deep_in_obj.json: one 200 kB line of nested lists, no newline."""
    deep = tmp_path / "deep_in_obj.json"
    deep.write_text('{"model":"m","x":' + "[" * 100_000 + "]" * 100_000 + "}")
    code, out, err = cli(["ingest", "decisions", deep, "--db", db_path])
    assert code == 0, err
    assert "0 records, 0 added" in out
    assert "no new lines since the last ingest" not in out
    assert "note: the last line has no newline and is not complete JSON" in out
    code, out, err = cli(["ingest", "requests", deep, "--db", db_path])  # was a RecursionError
    assert "Traceback" not in err and "RecursionError" not in err
    assert code == 0, err
    assert "note: the last line has no newline and is not complete JSON" in out  # not "empty"
    assert "empty file" not in out
    # once finished (a newline), the line is quarantined, never stored
    with deep.open("a") as fh:
        fh.write("\n")
    code, out, err = cli(["ingest", "decisions", deep, "--db", db_path])
    assert code == 4
    assert "JSON nested deeper than 64 levels" in err
    assert _count(db_path, "SELECT count(*) FROM gateway_decisions") == 0
