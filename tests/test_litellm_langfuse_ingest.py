"""``prefixscope ingest litellm | langfuse`` on the bundled samples taken from LiteLLM's and
Langfuse's own docs and tests (data/litellm/ORIGIN.md, data/langfuse/ORIGIN.md): real DuckDB
files, the real CLI."""

from __future__ import annotations

import json

from prefixscope.ingest.privacy import digest_namespace
from prefixscope.store import db as store_db

COLS = ("request_id, model, instance, endpoint, usage_shape, prompt_tokens, cached_tokens, "
        "cache_write_tokens, completion_tokens, ttft_ms, latency_ms, scope, tenant_digest, "
        "flags, provider")


def _rows(db):
    with store_db.reader(db) as con:
        return {r[0]: r[1:] for r in con.execute(
            f"SELECT {COLS} FROM requests ORDER BY request_id").fetchall()}


def test_litellm_spendlogs_jsonl_and_postgres_csv_give_the_same_rows(cli, tmp_path, data_dir):
    db_j, db_c = tmp_path / "j.duckdb", tmp_path / "c.duckdb"
    code, out, _ = cli(["ingest", "litellm", data_dir / "litellm/spendlogs.jsonl", "--db", db_j,
                        "--json"])
    assert code == 0
    (summary,) = json.loads(out)["files"]
    assert (summary["rows_read"], summary["rows_added"], summary["rows_quarantined"]) == (4, 4, 0)
    # the failed call (5th line) is counted, not dropped silently (new-user check, session 11)
    assert summary["note"] == ("1 record skipped (blank lines, or failed requests: status "
                               "failure, no usage)")
    code, _, _ = cli(["ingest", "litellm", data_dir / "litellm/spendlogs_postgres.csv", "--db",
                      db_c])
    assert code == 0
    rows = _rows(db_j)
    assert rows == _rows(db_c)
    assert "failed-call" not in rows  # status failure: no usage
    # Anthropic via LiteLLM: prompt_tokens already inclusive (100 = uncached 20 + read 80).
    assert rows["msg_cache_savings_anthropic"][:10] == (
        "claude-sonnet-4-5", "api.anthropic.com", "chat", "litellm-spendlogs", 100, 80, 0, 20,
        400.0, 2000.0)
    assert rows["chatcmpl-cache-savings-openai"][4:8] == (22583, 22016, None, 100)
    assert rows["chatcmpl-cache-write-kimi"][4:8] == (1000, None, 200, 10)  # read not reported
    assert rows["chatcmpl-9f2a1c7e-docs-row"][4:6] == (20, None)  # no cache fields: NULL
    assert rows["chatcmpl-9f2a1c7e-docs-row"][13] == "groq"
    # no HMAC key configured: team / key / end user dropped, flagged
    assert {r[12] for r in rows.values()} == {"tenant-dropped-no-key"}
    assert all(r[10] is None and r[11] is None for r in rows.values())
    again = cli(["ingest", "litellm", data_dir / "litellm/spendlogs.jsonl", "--db", db_j,
                 "--json"])
    assert json.loads(again[1])["files"][0]["rows_added"] == 0


def test_litellm_team_key_and_end_user_become_namespace_digests(cli, tmp_path, data_dir,
                                                                 monkeypatch):
    key = b"s" * 32
    monkeypatch.setenv("PREFIXSCOPE_HMAC_KEY", key.hex())
    db = tmp_path / "k.duckdb"
    assert cli(["ingest", "litellm", data_dir / "litellm/spendlogs.jsonl", "--db", db])[0] == 0
    rows = _rows(db)
    team = "e8d1460f-846c-45d7-9b43-55f3cc52ac32"
    assert rows["chatcmpl-9f2a1c7e-docs-row"][10:12] == digest_namespace(
        key, tenant_id=team, principal_id="palantir")  # team + end user: PRINCIPAL
    assert rows["msg_cache_savings_anthropic"][10:12] == digest_namespace(key, tenant_id=team)
    assert rows["chatcmpl-cache-savings-openai"][10:12] == digest_namespace(
        key, tenant_id="key:151e85e46ab8c9c7fad090793e3fe87940213f6ae665b543ca633b0b85ba6dc6")
    assert rows["chatcmpl-9f2a1c7e-docs-row"][10] == "PRINCIPAL"
    raw = db.read_bytes()
    assert b"palantir" not in raw and team.encode() not in raw


def test_litellm_response_cache_hit_is_flagged_never_a_prefix_hit(cli, tmp_path):
    f = tmp_path / "hit.jsonl"
    f.write_text(json.dumps({
        "request_id": "r1", "call_type": "acompletion", "startTime": "2024-05-13 10:00:00.000",
        "prompt_tokens": 50, "completion_tokens": 5, "cache_hit": "True", "model": "gpt-4o",
        "metadata": json.dumps({"usage_object": {"prompt_tokens": 50, "completion_tokens": 5}})})
        + "\n")
    db = tmp_path / "h.duckdb"
    assert cli(["ingest", "litellm", f, "--db", db])[0] == 0
    row = _rows(db)["r1"]
    assert row[4:6] == (50, None) and row[12] == "litellm-response-cache-hit"


def test_litellm_bad_count_is_quarantined_by_field(cli, tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"request_id": "r1", "startTime": "2024-05-13T10:00:00Z",
                             "prompt_tokens": -4}) + "\n")
    code, out, err = cli(["ingest", "litellm", f, "--db", tmp_path / "b.duckdb", "--json"])
    assert code == 4
    (q,) = json.loads(out)["quarantined"]
    assert (q["line"], q["field"], q["reason"]) == (1, "prompt_tokens",
                                                   "token count is negative")


def test_langfuse_observations_sum_the_input_buckets(cli, tmp_path, data_dir):
    db = tmp_path / "lf.duckdb"
    code, out, _ = cli(["ingest", "langfuse", data_dir / "langfuse/observations.json", "--db", db,
                        "--json"])
    assert code == 0
    rows = _rows(db)
    assert set(rows) == {"obs-openai-inclusive-example", "obs-js-sdk-example",
                         "obs-openai-schema-normalised"}  # the span and the empty one skipped
    # docs: 17,903 prompt tokens of which 17,817 cache hits, stored as input 86 + cached 17817
    assert rows["obs-openai-inclusive-example"][:10] == (
        "gpt-4o", None, None, "langfuse", 17903, 17817, None, 188, 500.0, 1750.0)
    assert rows["obs-js-sdk-example"][4:8] == (12, 2, None, 5)  # input 10 + cache read 2
    assert rows["obs-openai-schema-normalised"][4:8] == (10, 5, None, 25)
    assert rows["obs-openai-inclusive-example"][12] == "tenant-dropped-no-key"
    # the same observations as JSON lines (one per line) land as the same rows
    lines = tmp_path / "obs.jsonl"
    lines.write_text("".join(json.dumps(o) + "\n" for o in json.loads(
        (data_dir / "langfuse/observations.json").read_text())["data"]))
    db2 = tmp_path / "lf2.duckdb"
    assert cli(["ingest", "langfuse", lines, "--db", db2])[0] == 0
    assert _rows(db2) == rows


def test_ingest_requests_names_the_right_command_for_other_tools_records(cli, tmp_path,
                                                                         data_dir):
    """What a new user tries first: these records through `ingest requests` are quarantined
    with the command that reads them."""
    f = tmp_path / "mixed.jsonl"
    lf = json.loads((data_dir / "langfuse/observations.json").read_text())["data"][0]
    ll = json.loads((data_dir / "litellm/spendlogs.jsonl").read_text().splitlines()[1])
    f.write_text(json.dumps(ll) + "\n" + json.dumps(lf) + "\n"
                 + json.dumps({"resourceSpans": []}) + "\n")
    code, out, _ = cli(["ingest", "requests", f, "--db", tmp_path / "m.duckdb", "--json"])
    assert code == 4
    reasons = [q["reason"] for q in json.loads(out)["quarantined"]]
    assert reasons == [
        "no usage object (null or missing); a LiteLLM SpendLogs row: use prefixscope ingest litellm",
        "no usage object (null or missing); a Langfuse observation: use prefixscope ingest langfuse",
        "no usage object (null or missing); an OTLP trace export: use prefixscope ingest otlp"]


def test_record_files_note_skipped_records_in_every_form(tmp_path):
    """JSON lines, one JSON document and CSV: a record ``to_row`` skips is counted in the note."""
    from prefixscope.ingest.record_files import ingest_record_file

    def to_row(rec):
        if rec.get("skip"):
            return None
        return {"request_id": str(rec["id"]), "ts_unix_s": 1_795_960_000.0, "model": "m",
                "prompt_tokens": 10, "cached_tokens": None, "completion_tokens": 1}

    files = {"r.jsonl": '{"id": 1}\n{"id": 2, "skip": true}\n\n',
             "r.json": '[{"id": 1}, {"id": 2, "skip": true}]',
             "r.csv": "id,skip\n1,\n2,yes\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        with store_db.writer(tmp_path / f"{name}.duckdb") as con:
            res = ingest_record_file(con, tmp_path / name, kind="test-records", to_row=to_row,
                                     skipped_what="what was skipped")
        n = 2 if name == "r.jsonl" else 1  # the blank line too
        assert res.summary.rows_read == 1, name
        assert res.summary.note == f"{n} record{'s' if n > 1 else ''} skipped (what was skipped)", name


def test_ingest_requests_names_replay_and_diagnose_for_trace_records(cli, tmp_path, data_dir):
    """The new-user check of session 11: the bundled aider chat trace through `ingest
    requests` gave "no usage object" 124 times with no pointer to the commands that read it."""
    chat = data_dir / "captures/aider/chat-requests.jsonl"
    code, out, _ = cli(["ingest", "requests", chat, "--db", tmp_path / "c.duckdb", "--json"])
    assert code == 4
    doc = json.loads(out)
    assert doc["quarantined_total"] == 124
    assert {q["reason"] for q in doc["quarantined"]} == {
        "no usage object (null or missing); a chat request without its response's usage: "
        "replay it (prefixscope replay sim FILE) or find what breaks its prefix "
        "(prefixscope diagnose FILE)"}
    f = tmp_path / "traces.jsonl"
    f.write_text(json.dumps({"timestamp": 0, "input_length": 32, "output_length": 1,
                             "hash_ids": [1, 2]}) + "\n"
                 + json.dumps({"prompt_token_ids": [1, 2, 3], "output_tokens": 1}) + "\n")
    code, out, _ = cli(["ingest", "requests", f, "--db", tmp_path / "t.duckdb", "--json"])
    assert [q["reason"].split("; ", 1)[1] for q in json.loads(out)["quarantined"]] == [
        "a Mooncake trace record: replay it (prefixscope replay sim FILE)",
        "a token-ids trace record: replay it (prefixscope replay sim FILE)"]
