"""The gateway as a proxy against a minimal loopback upstream (real HTTP both sides): byte-for-byte
pass-through, streaming with the usage chunk added and kept back, salts replaced, bad input and
upstream failures (clear error, one decision record, no stuck permit), graceful shutdown, log
rotation, records that `ingest requests` / `ingest decisions` read unchanged, admin and metrics."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from prefixscope.gateway.logs import JsonlLog
from prefixscope.ingest.decisions import ingest_decisions_file
from prefixscope.ingest.usage import ingest_usage_file
from prefixscope.store.queries.scopes import invariant_counts
from tests.gateway_support import (
    CHAT,
    MODEL,
    RedisServer,
    RunningGateway,
    gateway_config,
    headers_for,
    loopback_upstream,
    read_jsonl,
    write_secrets,
)


@pytest.fixture
def upstream():
    with loopback_upstream() as app_and_control:
        yield app_and_control


def _gateway(tmp_path, upstream_url, **over) -> RunningGateway:
    """A gateway with 1 s upstream timeouts (a hanging upstream fails fast)."""
    return RunningGateway(gateway_config(tmp_path, upstream_url, read_timeout_s=1.0,
                                         connect_timeout_s=1.0, **over))


@pytest.fixture
def gateway(tmp_path, upstream):
    gw = _gateway(tmp_path, upstream[0].url)
    yield gw
    gw.stop()


def _records(tmp_path):
    return read_jsonl(tmp_path / "logs" / "usage.jsonl"), read_jsonl(tmp_path / "logs" / "decisions.jsonl")


def test_non_streaming_answer_is_byte_for_byte_and_salt_replaced(tmp_path, upstream, gateway):
    app, control = upstream
    direct = httpx.post(app.url + "/v1/chat/completions", json=CHAT, timeout=10)
    body = dict(CHAT, cache_salt="client-chosen")
    r = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers_for("acme"),
                   timeout=10)
    assert r.status_code == 200
    assert r.content == direct.content
    sent = control.requests[-1]
    assert sent["cache_salt"].startswith("ps1-") and sent["cache_salt"] != "client-chosen"
    rid = r.headers["x-prefixscope-request-id"]
    gateway.stop()
    usage, decisions = _records(tmp_path)
    assert [u["request_id"] for u in usage] == [rid]
    assert usage[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 64
    assert usage[0]["scope"] == "TENANT" and len(usage[0]["tenant_digest"]) == 16
    assert "acme" not in json.dumps(usage) + json.dumps(decisions)
    assert decisions[0]["request_id"] == rid and decisions[0]["client_salt_replaced"] is True
    assert decisions[0]["decision"] == "miss" and decisions[0]["salt_applied"] is True


def test_stream_gets_usage_added_and_the_extra_chunk_kept_back(tmp_path, upstream, gateway):
    app, control = upstream
    body = dict(CHAT, stream=True)
    direct = httpx.post(app.url + "/v1/chat/completions", json=body, timeout=10).content
    through = httpx.post(gateway.url + "/v1/chat/completions", json=body,
                         headers=headers_for("acme"), timeout=10).content
    assert control.requests[-1]["stream_options"] == {"include_usage": True}
    assert through == direct and b'"usage"' not in through and through.endswith(b"[DONE]\n\n")
    asked = dict(body, stream_options={"include_usage": True})
    direct2 = httpx.post(app.url + "/v1/chat/completions", json=asked, timeout=10).content
    through2 = httpx.post(gateway.url + "/v1/chat/completions", json=asked,
                          headers=headers_for("acme"), timeout=10).content
    assert through2 == direct2 and b'"usage"' in through2
    gateway.stop()
    usage, decisions = _records(tmp_path)
    assert len(usage) == 2 and all(u["usage"]["prompt_tokens"] == 100 for u in usage)
    assert all(u["ttft_ms"] > 0 and u["latency_ms"] >= u["ttft_ms"] for u in usage)
    assert len(decisions) == 2


def test_identity_comes_from_the_key_not_from_headers_or_body(tmp_path, upstream, gateway):
    r = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10,
                   headers={"x-prefixscope-tenant": "acme"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = httpx.post(gateway.url + "/v1/chat/completions", json=dict(CHAT, user="acme"),
                   headers=headers_for("globex"), timeout=10)
    assert r.status_code == 200
    gateway.stop()
    _, decisions = _records(tmp_path)
    assert len(decisions) == 1  # a 401 writes no decision: there is no trusted namespace


def test_repeat_is_accepted_and_a_cache_epoch_bump_rejects_the_old_object(tmp_path, upstream,
                                                                          gateway):
    h = headers_for("acme")
    for _ in range(2):
        assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=h,
                          timeout=10).status_code == 200
    assert gateway.admin("/admin/cache-epoch/bump")["cache_epoch"] == 2
    httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=h, timeout=10)
    httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers_for("globex"),
               timeout=10)
    gateway.stop()
    _, decisions = _records(tmp_path)
    d = [x for x in decisions if x.get("record") == "decision"]
    assert [x["decision"] for x in d] == ["miss", "accept", "reject", "miss"]
    assert d[2]["first_mismatch"] == "cache_epoch" and d[2]["salt_applied"] is False
    events = [x for x in decisions if x.get("record") == "event"]
    assert events[0]["event"] == "cache_epoch_bump" and events[0]["new_value"] == 2


def test_a_large_prompt_gets_the_same_digests_off_the_loop_thread(tmp_path, upstream, gateway):
    """A body of 64 KiB or more has its prefix digests computed on a worker thread: the same
    decisions and the same logged digests as the definitions give."""
    from prefixscope.core.identity import content_digest, load_hmac_key, log_content_digest

    system = {"role": "system", "content": "Policy text, caf\u00e9. " * 4000}  # ~96 KB
    body = dict(CHAT, messages=[system, {"role": "user", "content": "Hello?"}])
    h = headers_for("acme")
    for _ in range(2):
        r = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=h, timeout=10)
        assert r.status_code == 200
    assert len(upstream[1].requests[-1]["messages"][0]["content"]) == len(system["content"])
    gateway.stop()
    _, decisions = _records(tmp_path)
    d = [x for x in decisions if x.get("record") == "decision"]
    assert [x["decision"] for x in d] == ["miss", "accept"]
    key = load_hmac_key(gateway.cfg.hmac_key_file)
    want = log_content_digest(key, content_digest([system]))
    assert d[1]["expected"]["content_digest"] == want == d[1]["candidate"]["content_digest"]


@pytest.mark.parametrize("case, status, code", [
    ("malformed", 400, "bad_request"),
    ("not_object", 400, "bad_request"),
    ("no_messages", 400, "bad_request"),
    ("unknown_model", 404, "unknown_model"),
    ("oversized", 413, "too_large"),
    ("hang", 502, "upstream_timeout"),
])
def test_bad_input_gets_a_clear_error_and_one_decision_record(tmp_path, upstream, case, status,
                                                              code):
    app, control = upstream
    gw = _gateway(tmp_path, app.url, max_body_bytes=4096)
    content = {"malformed": b'{"model": "x", "messages": [', "not_object": b"[1, 2]",
               "no_messages": json.dumps({"model": MODEL}).encode(),
               "unknown_model": json.dumps(dict(CHAT, model="nope")).encode(),
               "oversized": json.dumps(dict(CHAT, pad="x" * 8000)).encode(),
               "hang": json.dumps(CHAT).encode()}[case]
    if case == "hang":
        control.mode = "hang"
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/v1/chat/completions", content=content, timeout=30,
                   headers={**headers_for("acme"), "content-type": "application/json"})
    assert time.monotonic() - t0 < 10
    assert r.status_code == status and r.json()["error"]["code"] == code
    assert r.json()["error"]["message"]
    assert gw.admin("/admin/state")["permits_in_flight"] == 0
    gw.stop()
    usage, decisions = _records(tmp_path)
    assert usage == [] and len(decisions) == 1 and decisions[0]["error"] == code


def test_upstream_dropping_mid_stream_ends_with_an_error_event(tmp_path, upstream, gateway):
    app, control = upstream
    control.mode = "drop"
    r = httpx.post(gateway.url + "/v1/chat/completions", json=dict(CHAT, stream=True),
                   headers=headers_for("acme"), timeout=10)
    assert r.status_code == 200
    assert b'"t0"' in r.content and b'"code": "upstream_dropped"' in r.content
    assert gateway.admin("/admin/state")["permits_in_flight"] == 0
    gateway.stop()
    usage, decisions = _records(tmp_path)
    assert usage == [] and [d["error"] for d in decisions] == ["upstream_dropped"]


def test_upstream_stalling_mid_stream_ends_with_a_timeout_event(tmp_path, upstream, gateway):
    app, control = upstream
    control.mode = "stall"
    t0 = time.monotonic()
    r = httpx.post(gateway.url + "/v1/chat/completions", json=dict(CHAT, stream=True),
                   headers=headers_for("acme"), timeout=30)
    assert time.monotonic() - t0 < 10  # read_timeout_s = 1 s between bytes, never a hang
    assert r.status_code == 200 and b'"code": "upstream_timeout"' in r.content
    assert gateway.admin("/admin/state")["permits_in_flight"] == 0
    gateway.stop()
    usage, decisions = _records(tmp_path)
    assert usage == [] and [d["error"] for d in decisions] == ["upstream_timeout"]


def test_unreachable_upstream_is_a_502_with_a_reason(tmp_path, upstream):
    app, _ = upstream
    gw = _gateway(tmp_path, app.url)
    app.stop()
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                   timeout=10)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
    assert "could not be reached" in r.json()["error"]["message"]
    gw.stop()
    assert [d["error"] for d in _records(tmp_path)[1]] == ["upstream_error"]


def test_graceful_shutdown_finishes_in_flight_streams_and_flushes(tmp_path, upstream):
    app, control = upstream
    control.stream_delay_s = 0.3
    gw = _gateway(tmp_path, app.url, fsync_interval_s=5.0)
    result = {}

    def client():
        result["body"] = httpx.post(gw.url + "/v1/chat/completions",
                                    json=dict(CHAT, stream=True), headers=headers_for("acme"),
                                    timeout=30).content

    t = threading.Thread(target=client)
    t.start()
    time.sleep(0.4)  # the stream is under way
    gw.stop()
    t.join(10)
    assert result["body"].endswith(b"data: [DONE]\n\n")
    usage, decisions = _records(tmp_path)
    assert len(usage) == 1 and len(decisions) == 1 and "error" not in decisions[0]


def test_records_ingest_unchanged_and_invariants_read_zero(tmp_path, upstream, gateway, con):
    h = headers_for("acme")
    for body in (CHAT, dict(CHAT, stream=True), CHAT, {"model": MODEL, "prompt": "x y z"}):
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        assert httpx.post(gateway.url + path, json=body, headers=h, timeout=10).status_code == 200
    httpx.post(gateway.url + "/v1/chat/completions", content=b"{", headers=h, timeout=10)
    gateway.admin("/admin/revoke", {"tenant": "acme"})
    gateway.stop()
    u = ingest_usage_file(con, tmp_path / "logs" / "usage.jsonl")
    d = ingest_decisions_file(con, tmp_path / "logs" / "decisions.jsonl")
    assert (u.rows_added, u.rows_quarantined) == (4, 0)
    assert (d.rows_added, d.rows_quarantined) == (6, 0)  # 5 decisions + 1 event
    inv = invariant_counts(con)
    assert inv["decided_requests"] == 5
    assert [inv[k] for k in ("cross_scope_acceptance", "wrong_version_acceptance",
                             "old_generation_use")] == [0, 0, 0]
    errors = con.execute("SELECT error, count(*) FROM gateway_decisions GROUP BY 1 ORDER BY 1"
                         ).fetchall()
    assert errors == [("bad_request", 1), (None, 4)]


def test_metrics_have_scopes_and_invariants_but_no_tenant(tmp_path, upstream, gateway):
    httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
               timeout=10)
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    assert 'prefixscope_gateway_cached_tokens_total{scope="TENANT"} 64.0' in text
    assert 'prefixscope_gateway_prompt_tokens_total{scope="TENANT"} 100.0' in text
    for inv in ("cross_scope_acceptance", "wrong_version_acceptance", "old_generation_use"):
        assert f'prefixscope_gateway_invariant_violations_total{{invariant="{inv}"}} 0.0' in text
    assert 'prefixscope_gateway_decisions_total{decision="miss",reason="none"} 1.0' in text
    assert "acme" not in text and "tenant=" not in text


def test_admin_needs_the_token(tmp_path, upstream, gateway):
    r = httpx.post(gateway.url + "/admin/cache-epoch/bump", timeout=10)
    assert r.status_code == 401
    r = httpx.post(gateway.url + "/admin/cache-epoch/bump", timeout=10,
                   headers={"authorization": "Bearer wrong-token-wrong-token"})
    assert r.status_code == 401
    assert gateway.admin("/admin/bypass", {"on": True}) == {"bypass": True, "cache_epoch": 1}
    # turning the bypass off never re-enables what was written before it: a new cache epoch
    assert gateway.admin("/admin/bypass", {"on": False}) == {"bypass": False, "cache_epoch": 2}


def test_rotation_keeps_every_line(tmp_path):
    log = JsonlLog(tmp_path / "usage.jsonl", rotate_bytes=4096, keep=50, fsync_interval_s=0.01)
    for i in range(500):
        log.write({"i": i, "pad": "x" * 40})
        if i % 50 == 0:
            log.flush()
    log.close()
    files = sorted(tmp_path.glob("usage*.jsonl"))
    assert log.rotations >= 5 and len(files) == log.rotations + 1
    seen = sorted(r["i"] for f in files for r in read_jsonl(f))
    assert seen == list(range(500))
    assert all(f.stat().st_size <= 4096 for f in files)


def test_client_disconnect_mid_stream_releases_the_permit(tmp_path, upstream, gateway):
    app, control = upstream
    control.stream_delay_s = 0.3
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", gateway.url + "/v1/chat/completions",
                           json=dict(CHAT, stream=True), headers=headers_for("acme")) as r:
            first = next(r.iter_raw())
            assert b'"t0"' in first
        # leaving the block closes the connection before the stream ended
    deadline = time.monotonic() + 10
    while gateway.admin("/admin/state")["requests_in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gateway.admin("/admin/state")["permits_in_flight"] == 0
    gateway.stop()
    _, decisions = _records(tmp_path)
    assert [d["error"] for d in decisions] == ["client_disconnected"]


def test_two_replicas_share_registry_and_gate_in_redis(tmp_path, upstream):
    app, _ = upstream
    with RedisServer(tmp_path / "redis") as redis:
        secrets = write_secrets(tmp_path / "secrets")
        replicas = [RunningGateway(gateway_config(
            tmp_path, app.url, log_dir=str(tmp_path / f"logs{i}"), instance=f"gw-{i}",
            store=redis.url, **secrets)) for i in (1, 2)]
        one, two = replicas
        h = headers_for("acme")
        post = lambda gw: httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=h,  # noqa: E731
                                     timeout=10)
        post(one)                       # replica 1 writes the object
        post(two)                       # replica 2 finds it: accept
        one.admin("/admin/revoke", {"tenant": "acme"})
        post(two)                       # replica 2 sees the new epoch: reject (forgets it)
        post(one)                       # replica 1 finds nothing: a miss, writes anew
        two.admin("/admin/cache-epoch/bump")
        post(one)                       # replica 1 sees the new cache epoch: reject
        for gw in replicas:
            gw.stop()
        d1 = read_jsonl(tmp_path / "logs1" / "decisions.jsonl")
        d2 = read_jsonl(tmp_path / "logs2" / "decisions.jsonl")
        one_dec = [(d["decision"], d["first_mismatch"]) for d in d1 if d["record"] == "decision"]
        two_dec = [(d["decision"], d["first_mismatch"]) for d in d2 if d["record"] == "decision"]
        assert one_dec == [("miss", None), ("miss", None), ("reject", "cache_epoch")]
        assert two_dec == [("accept", None), ("reject", "authorization_epoch")]


def test_a_failed_shared_store_fails_closed(tmp_path, upstream):
    """Redis gone: the request is still answered, forwarded isolated (no cached KV without a
    permit), and its decision says so; the records are written."""
    app, control = upstream
    with RedisServer(tmp_path / "redis") as redis:
        gw = _gateway(tmp_path, app.url, store=redis.url)
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                   timeout=30)
    assert r.status_code == 200
    assert control.requests[-1]["cache_salt"].startswith("ps1-iso-")
    assert 'prefixscope_gateway_upstream_errors_total{kind="store"}' in httpx.get(
        gw.url + "/metrics", timeout=10).text
    gw.stop()
    usage, decisions = _records(tmp_path)
    assert len(usage) == 1
    assert [(d["decision"], d["first_mismatch"], d["salt_applied"]) for d in decisions] == [
        ("reject", "authorization_epoch", False)]


def test_shadow_mode_logs_candidate_hits_but_reuses_nothing(tmp_path, upstream):
    app, control = upstream
    gw = _gateway(tmp_path, app.url, mode="shadow")
    for _ in range(2):
        httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                   timeout=10)
    salts = [b["cache_salt"] for b in control.requests[-2:]]
    gw.stop()
    _, decisions = _records(tmp_path)
    assert all(x.startswith("ps1-iso-") for x in salts) and salts[0] != salts[1]
    assert [(d["decision"], d["salt_applied"]) for d in decisions] == [("miss", False),
                                                                      ("accept", False)]


def test_public_scope_only_for_inventory_prompts_until_stopped(tmp_path, upstream):
    from prefixscope.core.identity import message_digest

    app, control = upstream
    inv = tmp_path / "inventory.txt"
    inv.write_text("".join(f"sha256:{message_digest(m)} approved\n" for m in CHAT["messages"]))
    gw = _gateway(tmp_path, app.url, mode="public", inventory_file=str(inv))
    private = dict(CHAT, messages=CHAT["messages"][:1] + [{"role": "user", "content": "mine"}])
    for tenant, body in (("acme", CHAT), ("globex", CHAT), ("acme", private)):
        httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers_for(tenant),
                   timeout=10)
    gw.admin("/admin/public/stop")
    httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
               timeout=10)
    salts = [b["cache_salt"] for b in control.requests[-4:]]
    gw.stop()
    _, decisions = _records(tmp_path)
    d = [x for x in decisions if x["record"] == "decision"]
    assert [x["scope"] for x in d] == ["PUBLIC", "PUBLIC", "TENANT", "TENANT"]
    assert [x["decision"] for x in d[:2]] == ["miss", "accept"]  # B reuses the public prefix
    assert salts[0] == salts[1] != salts[2] == salts[3]  # one public salt; then acme's own


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_reject_registers_nothing_so_no_accept_without_a_write_under_its_salt(
        tmp_path, upstream, store):
    """After a cache-epoch bump and a revocation, the first request is a reject forwarded
    under its own isolating salt: the engine stored nothing under the new derived salt, so the
    next request is a miss (it writes under that salt), and only the one after it is an accept.
    The rule, in both stores: an accept's salt is the salt of an earlier answered request with
    the same prompt (the engine could have cached it); a reject leaves no entry behind, and a
    presented handle of the rejected entry finds nothing."""
    app, control = upstream
    with RedisServer(tmp_path / "redis") as redis:
        over = {"store": redis.url} if store == "redis" else {}
        gw = _gateway(tmp_path, app.url, **over)
        h = headers_for("acme")
        post = lambda: httpx.post(gw.url + "/v1/chat/completions", json=CHAT,  # noqa: E731
                                  headers=h, timeout=10)
        first = [post() for _ in range(2)]
        old_handle = first[1].headers["x-prefixscope-cache-handle"]
        gw.admin("/admin/cache-epoch/bump")
        gw.admin("/admin/revoke", {"tenant": "acme"})
        after = [post() for _ in range(3)]
        # the rejected request forgot the old entry: its handle now names nothing
        presented = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=10,
                               headers={**h, "x-prefixscope-cache-handle": old_handle})
        assert all(r.status_code == 200 for r in first + after + [presented])
        salts = [b["cache_salt"] for b in control.requests[-6:]]
        gw.stop()
    _, decisions = _records(tmp_path)
    d = [x for x in decisions if x["record"] == "decision"]
    assert [(x["decision"], x["salt_applied"]) for x in d] == [
        ("miss", True), ("accept", True), ("reject", False), ("miss", True), ("accept", True),
        ("accept", True)]
    assert d[2]["reasons"] == ["authorization_epoch", "cache_epoch"]
    assert d[2]["accepted_cached_tokens"] == 0 and d[2]["candidate_cached_tokens"] > 0
    # the miss after the reject has no candidate (the reject's prefix was not registered)
    assert d[3]["candidate"] is None and d[3]["candidate_request_id"] is None
    assert d[3]["candidate_tokens_basis"] == "exact" and d[3]["candidate_cached_tokens"] == 0
    # each accept's candidate is a request sent with the derived salt the accept is sent with
    assert d[4]["candidate_request_id"] == d[3]["request_id"]
    assert salts[0] == salts[1] != salts[3] == salts[4] == salts[5]
    assert salts[2].startswith("ps1-iso-") and salts[2] not in salts[3:]
    # the old handle (the forgotten entry's) found nothing: the registry's own entry decided
    assert d[5]["candidate_request_id"] == d[4]["request_id"]
