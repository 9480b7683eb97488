"""Issue 27 #7: values that were stored although they must not be. Each case runs the real CLI
on a real DuckDB file and reads the tables back."""

from __future__ import annotations

import json

from prefixscope.store import db as store_db


def _rows(db: str, sql: str) -> list[tuple]:
    with store_db.reader(db) as con:
        return con.execute(sql).fetchall()


def _usage(rid, i: int, **extra) -> dict:
    rec = {"created": 1764590000 + i, "model": "m",
           "usage": {"prompt_tokens": 100 + i, "completion_tokens": 5,
                     "prompt_tokens_details": {"cached_tokens": 50}}, **extra}
    if rid is not None:
        rec["request_id"] = rid
    return rec


def test_an_empty_request_id_is_a_missing_one(cli, tmp_path, db_path):
    # three distinct requests with request_id "": each is its own request (the record's digest,
    # as for a record without an id), none dropped as "already stored"
    f = tmp_path / "usage.jsonl"
    f.write_text("".join(json.dumps(_usage("", i)) + "\n" for i in range(3)))
    code, out, err = cli(["ingest", "requests", str(f), "--db", db_path])
    assert code == 0, err
    ids = [r[0] for r in _rows(db_path, "SELECT request_id FROM requests ORDER BY prompt_tokens")]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert all(i.startswith("sha256:") for i in ids), ids


def test_an_empty_request_id_falls_back_to_the_response_id(cli, tmp_path, db_path):
    f = tmp_path / "usage.jsonl"
    f.write_text(json.dumps(_usage("", 0, id="chatcmpl-1")) + "\n")
    code, _, err = cli(["ingest", "requests", str(f), "--db", db_path])
    assert code == 0, err
    assert _rows(db_path, "SELECT request_id FROM requests") == [("chatcmpl-1",)]


def test_a_blank_request_id_is_a_missing_one(cli, tmp_path, db_path):
    # "   " and "\n" are blank: missing, as "" (each its own request, none "already stored")
    f = tmp_path / "usage.jsonl"
    f.write_text("".join(json.dumps(_usage(rid, i)) + "\n"
                         for i, rid in enumerate(["   ", "   ", "\n", "\t "])))
    code, out, err = cli(["ingest", "requests", str(f), "--db", db_path])
    assert code == 0, err
    ids = [r[0] for r in _rows(db_path, "SELECT request_id FROM requests")]
    assert len(ids) == 4 and len(set(ids)) == 4 and all(i.startswith("sha256:") for i in ids)


ID_NOT_TEXT = ("not an identifier: control, invisible (format) or line-break characters, or "
               "spaces before or after it")


def test_ids_of_a_usage_log_are_printable_text_without_spaces_around(cli, tmp_path, db_path):
    bad = ["id1\n", "id1 ", " id1", "id2\r", "id\x00x", "\u200b", "a\u2028b", "x\x1b[31m"]
    good = ["chatcmpl-1", "req 7", "请求-1"]
    recs = [_usage(rid, i) for i, rid in enumerate(bad + good)]
    recs += [_usage(f"r-{i}", 20 + i, run_id=run) for i, run in enumerate(["run\n", "\trun"])]
    recs += [_usage("r-blank-run", 30, run_id="   ")]
    f = tmp_path / "usage.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    code, out, err = cli(["ingest", "requests", str(f), "--db", db_path])
    assert code == 0, err
    assert sorted(_rows(db_path, "SELECT request_id, run_id FROM requests")) == sorted(
        [(g, "") for g in good] + [("r-blank-run", "")])
    q = _rows(db_path, "SELECT line, field, reason FROM quarantine ORDER BY line")
    assert q == [(i + 1, "$.request_id", ID_NOT_TEXT) for i in range(len(bad))] + [
        (len(bad) + len(good) + 1, "$.run_id", ID_NOT_TEXT),
        (len(bad) + len(good) + 2, "$.run_id", ID_NOT_TEXT)], q
    assert "id1" not in err and "run\\n" not in err  # the reason names the field, never the value


def test_a_tenant_digest_with_a_trailing_newline_is_not_stored(cli, tmp_path, db_path):
    f = tmp_path / "usage.jsonl"
    f.write_text(json.dumps(_usage("r-1", 0, tenant_digest="deadbeef\n")) + "\n"
                 + json.dumps(_usage("r-2", 1, tenant_digest="deadbeef")) + "\n")
    code, _, err = cli(["ingest", "requests", str(f), "--db", db_path])
    assert code == 0, err
    rows = _rows(db_path, "SELECT request_id, tenant_digest, flags FROM requests ORDER BY 1")
    assert rows[0][:2] == ("r-1", None) and "tenant-digest-invalid" in rows[0][2]
    assert rows[1][:2] == ("r-2", "deadbeef")


def _decision(i: int, **extra) -> dict:
    return {"ts_unix_s": 1764590000.0 + i, "request_id": f"d-{i}", "scope": "PUBLIC",
            "namespace_digest": "0123456789abcdef", "decision": "accept",
            "candidate_cached_tokens": 600, "accepted_cached_tokens": 576, **extra}


def test_decision_log_patterns_refuse_a_trailing_newline(cli, tmp_path, db_path):
    f = tmp_path / "decisions.jsonl"
    f.write_text(json.dumps(_decision(0, request_id="d-0\n")) + "\n"
                 + json.dumps(_decision(1, namespace_digest="0123456789abcdef\n")) + "\n"
                 + json.dumps(_decision(2)) + "\n")
    code, _, err = cli(["ingest", "decisions", str(f), "--db", db_path])
    assert code == 0, err
    assert _rows(db_path, "SELECT request_id FROM gateway_decisions") == [("d-2",)]
    assert _rows(db_path, "SELECT line, field, reason FROM quarantine ORDER BY line") == [
        (1, "request_id", "Expected `str` matching regex '^[A-Za-z0-9._:-]{1,200}$'"),
        (2, "namespace_digest", "Expected `str` matching regex '^[0-9a-f]{16}$'")]


def test_a_bypassed_decision_with_accepted_tokens_is_quarantined(cli, tmp_path, db_path):
    f = tmp_path / "decisions.jsonl"
    f.write_text(json.dumps(_decision(0, bypass=True)) + "\n"
                 + json.dumps(_decision(1, bypass=True, decision="miss",
                                        candidate_cached_tokens=0, accepted_cached_tokens=0))
                 + "\n" + json.dumps(_decision(2, bypass=False)) + "\n")
    code, _, err = cli(["ingest", "decisions", str(f), "--db", db_path])
    assert code == 0, err
    assert _rows(db_path, "SELECT request_id FROM gateway_decisions ORDER BY 1") == [
        ("d-1",), ("d-2",)]
    assert _rows(db_path, "SELECT line, field, reason FROM quarantine") == [
        (1, "accepted_cached_tokens", "must be 0 when bypass is true")]


def test_closed_vocabulary_labels_never_store_other_values(cli, tmp_path, db_path):
    f = tmp_path / "metrics.prom"
    f.write_text(
        "# TYPE vllm:request_success counter\n"
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3\n'
        'vllm:request_success_total{engine="0",finished_reason="acme-corp-tenant",model_name="m"} 4\n'
        "# TYPE vllm:prompt_tokens_by_source counter\n"
        'vllm:prompt_tokens_by_source_total{engine="tenant-7",model_name="m",source="local_cache_hit"} 5\n'
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="globex-inc"} 6\n')
    code, _, err = cli(["ingest", "metrics", str(f), "--db", db_path])
    assert code == 0, err
    labels = sorted(json.loads(r[0]).get("finished_reason") or json.loads(r[0]).get("source")
                    + "/" + json.loads(r[0])["engine"]
                    for r in _rows(db_path, "SELECT labels FROM metric_samples"))
    assert labels == ["local_cache_hit/other", "other", "other/0", "stop"]
    text = json.dumps(_rows(db_path, "SELECT * FROM metric_samples"), default=str)
    assert "acme" not in text and "globex" not in text and "tenant-7" not in text
