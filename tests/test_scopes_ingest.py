"""Decision-log ingest, the scope queries, and the two CLI commands."""

from __future__ import annotations

import json

import pytest

from prefixscope.ingest.decisions import ingest_decisions_file
from prefixscope.core.errors import InvalidArgument, NothingIngested
from prefixscope.store.queries import scopes as q

NS = "0123456789abcdef"


def line(rid, decision="accept", **kw):
    rec = {"ts_unix_s": 1_795_960_000.0, "request_id": rid, "scope": "TENANT",
           "namespace_digest": NS, "decision": decision, "reasons": [],
           "candidate_cached_tokens": 32, "accepted_cached_tokens": 32}
    if decision == "miss":
        rec.update(candidate_cached_tokens=0, accepted_cached_tokens=0)
    if decision == "reject":
        rec.update(accepted_cached_tokens=0, reasons=["adapter_digest"])
    rec.update(kw)
    return json.dumps(rec)


def test_good_and_bad_lines(con, tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join([
        line("r1"), line("r2", "reject"), line("r3", "miss"),
        line("r4", tenant="acme-corp"),                      # unknown field: could be a raw id
        line("r5", namespace_digest="acme-corp-tenant"),     # not a digest
        line("r6", "reject", reasons=[]),                   # a reject needs a reason
        line("r7", accepted_cached_tokens=64),              # more than the candidate
        line("r8", decision="maybe"),
        "{not json",
        json.dumps({"record": "event", "ts_unix_s": 1.0, "event": "cache_epoch_bump",
                    "new_value": 2}),
    ]) + "\n")
    s = ingest_decisions_file(con, f)
    assert (s.rows_read, s.rows_added, s.rows_quarantined) == (4, 4, 6)
    rows = con.execute("SELECT line, field, reason FROM quarantine ORDER BY line").fetchall()
    # an unknown key is not named (a key is input too): the reason says it is unknown
    assert [r[1] for r in rows] == [None, "namespace_digest", "reasons",
                                    "accepted_cached_tokens", "decision", None]
    assert rows[0][2].startswith("unknown key")
    text = " ".join(str(r) for r in rows)
    assert "acme" not in text and "maybe" not in text
    again = ingest_decisions_file(con, f)
    assert again.rows_added == 0
    assert con.execute("SELECT count(*) FROM gateway_decisions").fetchone()[0] == 3
    # a later append is read from the checkpoint
    with open(f, "a") as fh:
        fh.write(line("r9") + "\n")
    assert ingest_decisions_file(con, f).rows_added == 1


def test_all_bad_raises(con, tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(line("r1", tenant="x") + "\n")
    with pytest.raises(NothingIngested, match=r"all 1 lines quarantined; the first: .*bad.jsonl:1: "):
        ingest_decisions_file(con, f)


def test_join_with_usage_and_queries(con, tmp_path):
    from prefixscope.ingest.usage import ingest_usage_file

    f = tmp_path / "d.jsonl"
    f.write_text("\n".join([
        line("r1", run_id="x", candidate={"scope": "TENANT", "namespace_digest": NS}),
        line("r2", "reject", run_id="x", candidate={"scope": "TENANT", "namespace_digest": NS}),
        line("r3", "miss", run_id="x", scope="PUBLIC", namespace_digest="f" * 16),
    ]) + "\n")
    ingest_decisions_file(con, f)
    u = tmp_path / "u.jsonl"
    u.write_text("\n".join(json.dumps({
        "ts_unix_s": 1_795_960_000.0 + i, "request_id": f"r{i}", "run_id": "x", "model": "m",
        "usage": {"prompt_tokens": 100, "completion_tokens": 1,
                  "prompt_tokens_details": {"cached_tokens": c}}})
        for i, c in ((1, 32), (2, 0), (3, 0), (4, 50))) + "\n")
    ingest_usage_file(con, str(u))
    tot = q.hit_rate_by_scope_totals(con).set_index("scope")
    assert tot.loc["TENANT", "requests"] == 2 and tot.loc["TENANT", "cached_tokens"] == 32
    assert tot.loc["TENANT", "hit_rate"] == pytest.approx(32 / 200)
    assert tot.loc["UNSCOPED", "requests"] == 1           # r4 has usage but no decision
    assert q.invariant_counts(con)["cross_scope_acceptance"] == 0
    w = q.hit_rate_by_scope_window(con, window_s=3600, by=("scope", "namespace_digest"))
    assert set(w["scope"]) == {"TENANT", "PUBLIC", "UNSCOPED"}
    rej = q.rejections_by_reason_window(con, window_s=3600)
    assert rej["reason"].tolist() == ["adapter_digest"] and rej["reason_class"].iloc[0] == "version"
    mb = q.miss_breakdown_by_window(con, window_s=3600)
    assert mb["ordinary_miss_requests"].sum() == 1 and mb["version_mismatch_requests"].sum() == 1
    assert q.top_rejected_namespaces(con)["namespace_digest"].tolist() == [NS]
    assert len(q.decision_rows(con, decisions=["reject"])) == 1
    assert q.scope_filter_values(con)["scopes"] == ["PUBLIC", "TENANT"]
    with pytest.raises(InvalidArgument, match="unknown invariant 'nope'"):
        q.invariant_violations(con, invariant="nope")


def test_cli_ingest_decisions_and_replay_gateway(cli, tmp_path, db_path, monkeypatch):
    key = tmp_path / "hmac.key"
    key.write_bytes(bytes(range(32)))
    trace = tmp_path / "trace.jsonl"
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps({"t": "You are a careful assistant. " * 20,
                                 "a": "Private file of tenant A. " * 30,
                                 "b": "Private file of tenant B. " * 30, "q": "Summarise it."}))
    reqs = [{"type": "request", "t_s": float(i), "request_id": f"q{i}",
             "auth": {"tenant": "tenant-A" if i % 2 else "tenant-B"},
             "messages": [{"role": "system", "ref": "t"},
                          {"role": "user", "ref": "a" if i % 2 else "b"},
                          {"role": "user", "ref": "q"}], "output_tokens": 4} for i in range(1, 7)]
    trace.write_text("\n".join(json.dumps(x) for x in [
        {"type": "header", "format": "prefixscope-multitenant/v1", "model": "m",
         "block_size": 16, "texts": "texts.json"}, *reqs,
        {"type": "event", "t_s": 3.5, "event": "cache_epoch_bump"}]) + "\n")
    out = tmp_path / "out"
    code, stdout, err = cli(["replay", "gateway", trace, "--hmac-key-file", key, "--out", out,
                             "--db", db_path, "--run-id", "g1", "--json"])
    assert code == 0, err
    rep = json.loads(stdout)
    assert rep["requests"] == 6 and rep["rows_added"]["requests"] == 6
    assert {"decisions.jsonl", "requests.jsonl", "metrics", "summary.json"} <= {
        p.name for p in out.iterdir()}
    code, stdout, err = cli(["ingest", "decisions", out / "decisions.jsonl", "--db", db_path])
    assert code == 0 and "0 added" in stdout
    code, stdout, _ = cli(["hitrate", "--by", "scope", "--source", "requests", "--db", db_path,
                           "--run", "g1", "--json"])
    assert code == 0 and {r["scope"] for r in json.loads(stdout)} == {"TENANT"}
    monkeypatch.delenv("PREFIXSCOPE_HMAC_KEY_FILE", raising=False)
    monkeypatch.delenv("PREFIXSCOPE_HMAC_KEY", raising=False)
    code, _, err = cli(["replay", "gateway", trace, "--out", out, "--no-ingest"])
    assert code == 2 and "no HMAC key" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "header"}\n')
    code, _, err = cli(["replay", "gateway", bad, "--hmac-key-file", key, "--no-ingest",
                        "--out", out])
    assert code == 4 and "bad.jsonl:1" in err
