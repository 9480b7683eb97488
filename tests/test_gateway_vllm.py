"""The gateway in front of the real vLLM CPU server: the design's negative tests, the revocation
race, and Σ cached_tokens of the gateway's usage log = Δ ``vllm:prefix_cache_hits_total``.

Tenants A (acme) and B (globex) send byte-identical public templates, different private
documents and the same question. Before every case the engine's prefix cache is emptied and A
warms it, so any cached token B gets could only come from A's blocks; vLLM's own
``cached_tokens`` must be 0 for B in every case, every rejection must carry its reason, and the
three invariants, computed by the store from the ingested logs, must read 0.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import time

import httpx
import pytest

from prefixscope.gateway.app import Faults
from prefixscope.gateway.config import load_gateway_config
from prefixscope.ingest.decisions import ingest_decisions_file
from prefixscope.ingest.usage import ingest_usage_file
from prefixscope.store import db as store_db
from prefixscope.store.queries.scopes import invariant_counts
from tests.gateway_support import (RedisServer, RunningGateway, headers_for, read_jsonl,
                                   write_secrets)
from tests.vllm_support import SERVED_MODEL_NAME, TEXTS, ServerConfig, vllm_pool  # noqa: F401

pytestmark = pytest.mark.vllm

_TEXTS = json.loads(TEXTS.read_text())
TEMPLATE = _TEXTS["tpl:system"][:2400]
DOCS = {"acme": _TEXTS["doc:acme:issue"][:2400], "globex": _TEXTS["doc:globex:issue"][:2400]}
QUESTION = _TEXTS["q:81:1"]


def chat(tenant: str, **extra) -> dict:
    return {"model": SERVED_MODEL_NAME, "max_tokens": 2, "messages": [
        {"role": "system", "content": TEMPLATE},
        {"role": "user", "content": "Document:\n" + DOCS[tenant]},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": QUESTION}], **extra}


def hits_total(server) -> float:
    return sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$",
                                            server.metrics_text(), re.M))


class Run:
    """One gateway configuration against the server; restartable with the same state."""

    def __init__(self, tmp_path, server, **over):
        self.tmp = tmp_path
        self.server = server
        self.secrets = write_secrets(tmp_path / "secrets", stale_epoch_for="globex")
        self.over = over
        self.faults = Faults()
        self.gw: RunningGateway | None = None
        self.start()

    def start(self, **more):
        cfg = load_gateway_config(None, **{
            "upstreams": [self.server.base_url], "port": 0, "mode": "tenant",
            "log_dir": str(self.tmp / "logs"), "state_file": str(self.tmp / "state.json"),
            "fsync_interval_s": 0.05, "read_timeout_s": 60.0, **self.secrets, **self.over,
            **more})
        self.gw = RunningGateway(cfg, faults=self.faults)

    def restart(self, **more):
        self.gw.stop()
        self.start(**more)

    def send(self, tenant: str, *, headers: dict | None = None, suffix: str = "", **extra):
        r = httpx.post(self.gw.url + "/v1/chat/completions", json=chat(tenant, **extra),
                       headers={**headers_for(tenant, suffix=suffix), **(headers or {})},
                       timeout=120)
        assert r.status_code == 200, r.text
        return r

    @staticmethod
    def cached(r) -> int:
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def server(vllm_pool):  # noqa: F811
    return vllm_pool.get(ServerConfig())


def _warm_a(run: Run) -> httpx.Response:
    """Empty the engine cache, then A three times; the third must hit (A's own reuse works).
    (After a generation change the first is a reject sent isolated, registering nothing; the
    second is a miss that writes the blocks under the new salt.)"""
    run.server.reset_prefix_cache()
    run.send("acme")
    run.send("acme")
    r = run.send("acme")
    assert Run.cached(r) >= 1024, "A's repeat must reuse A's blocks"
    return r


def test_negative_cases_b_never_gets_a_private_blocks(tmp_path, server):
    before = hits_total(server)
    run = Run(tmp_path, server)
    cases: dict[str, tuple[str, httpx.Response]] = {}

    def b_case(name, resp):
        cases[name] = (resp.headers["x-prefixscope-request-id"], resp)
        assert Run.cached(resp) == 0, f"{name}: B read cached blocks"

    # missing salt (the client sends none) and a client salt that must be stripped
    _warm_a(run)
    b_case("missing_salt", run.send("globex"))
    _warm_a(run)
    b_case("client_salt", run.send("globex", cache_salt="salt-acme"))
    # a wrong namespace: B claims A's tenant in the trusted-proxy headers (not trusted from B)
    _warm_a(run)
    b_case("wrong_namespace", run.send("globex", headers={"x-prefixscope-tenant": "acme"}))
    # A's handle given to B
    a = _warm_a(run)
    b_case("a_handle", run.send("globex", headers={
        "x-prefixscope-cache-handle": a.headers["x-prefixscope-cache-handle"]}))
    # an identical short hash: a deliberately weak lookup key makes every prefix collide, so
    # B's lookup finds A's object; the full identity comparison still rejects it
    run.faults.lookup_key = lambda ns, material: b"\0" * 16
    _warm_a(run)
    b_case("short_hash_collision", run.send("globex"))
    run.faults.lookup_key = None
    # a stale authorization epoch: B's namespace revoked, B presents a key issued before
    _warm_a(run)
    run.send("globex")  # B's own object at epoch 1
    run.gw.admin("/admin/revoke", {"tenant": "globex"})
    b_case("stale_epoch", run.send("globex", suffix="-stale"))
    # a policy revocation between lookup and permit (the revocation wins)
    _warm_a(run)

    async def revoke(ns):
        await run.gw.gw.store.revoke(ns)

    run.faults.between_lookup_and_permit = revoke
    b_case("revocation_race", run.send("globex"))
    a_revoked = run.send("acme")
    run.faults.between_lookup_and_permit = None
    assert Run.cached(a_revoked) == 0
    # a cache-epoch bump
    _warm_a(run)
    run.gw.admin("/admin/cache-epoch/bump")
    a_bumped = run.send("acme")
    b_case("epoch_bump", run.send("globex"))
    assert Run.cached(a_bumped) == 0
    # an eviction between warm-up and the question
    _warm_a(run)
    server.reset_prefix_cache()
    a_evicted = run.send("acme")
    b_case("eviction", run.send("globex"))
    assert Run.cached(a_evicted) == 0
    # a gateway restart: state kept, A reuses again, B still reads nothing of A
    _warm_a(run)
    run.restart()
    a_restarted = run.send("acme")
    assert Run.cached(a_restarted) >= 1024
    b_case("restart", run.send("globex"))
    # a tokenizer switch and an adapter switch (declared digests of the new deployment)
    _warm_a(run)
    run.restart(declared={"tokenizer_digest": "ab" * 32})
    a_tok = run.send("acme")
    b_case("tokenizer_switch", run.send("globex"))
    _warm_a(run)
    run.restart(declared={"tokenizer_digest": "ab" * 32,
                          "adapters": {SERVED_MODEL_NAME: "cd" * 32}})
    a_adapter = run.send("acme")
    b_case("adapter_switch", run.send("globex"))
    assert Run.cached(a_tok) == 0 and Run.cached(a_adapter) == 0
    run.gw.stop()

    usage = read_jsonl(tmp_path / "logs" / "usage.jsonl")
    logged = sum(u["usage"]["prompt_tokens_details"]["cached_tokens"] for u in usage)
    deadline = time.monotonic() + 20  # vLLM records its stats after the response is sent
    while hits_total(server) - before != logged and time.monotonic() < deadline:
        time.sleep(0.2)
    delta = hits_total(server) - before

    decisions = {d["request_id"]: d for d in read_jsonl(tmp_path / "logs" / "decisions.jsonl")
                 if d.get("record") == "decision"}
    # Σ cached_tokens in the gateway's usage log = Δ vllm:prefix_cache_hits_total
    assert logged == delta and delta > 0
    reasons = {name: (decisions[rid]["decision"], decisions[rid]["first_mismatch"])
               for name, (rid, _) in cases.items()}
    assert reasons["a_handle"] == ("reject", "namespace")
    assert reasons["short_hash_collision"] == ("reject", "namespace")
    assert "content_digest" in decisions[cases["short_hash_collision"][0]]["reasons"]
    assert reasons["stale_epoch"] == ("reject", "authorization_epoch")
    assert reasons["revocation_race"] == ("reject", "authorization_epoch")
    assert decisions[a_revoked.headers["x-prefixscope-request-id"]]["first_mismatch"] == \
        "authorization_epoch"
    assert decisions[a_bumped.headers["x-prefixscope-request-id"]]["first_mismatch"] == \
        "cache_epoch"
    assert decisions[a_tok.headers["x-prefixscope-request-id"]]["first_mismatch"] == \
        "tokenizer_digest"
    assert decisions[a_adapter.headers["x-prefixscope-request-id"]]["first_mismatch"] == \
        "adapter_digest"
    assert decisions[a_evicted.headers["x-prefixscope-request-id"]]["decision"] == "accept"
    assert decisions[a_restarted.headers["x-prefixscope-request-id"]]["decision"] == "accept"
    assert decisions[cases["client_salt"][0]]["client_salt_replaced"] is True
    # B's namespace is B's in every case, whatever B claimed
    b_ns = {decisions[rid]["namespace_digest"] for rid, _ in cases.values()}
    a_ns = decisions[a_bumped.headers["x-prefixscope-request-id"]]["namespace_digest"]
    assert len(b_ns) == 1 and a_ns not in b_ns
    # the three invariants through ingest, as the Invariants page reads them
    con = store_db.connect(str(tmp_path / "gw.duckdb"))
    try:
        store_db.migrate(con)
        assert ingest_usage_file(con, tmp_path / "logs" / "usage.jsonl").rows_quarantined == 0
        assert ingest_decisions_file(con, tmp_path / "logs" / "decisions.jsonl"
                                     ).rows_quarantined == 0
        inv = invariant_counts(con)
    finally:
        con.close()
    assert inv["decided_requests"] == len(decisions) == len(usage)
    assert [inv["cross_scope_acceptance"], inv["wrong_version_acceptance"],
            inv["old_generation_use"]] == [0, 0, 0]


def test_revocation_race_through_the_gateway_never_both(tmp_path, server):
    """A revocation races each of A's permits (a thread calls the gate's compare-and-set while
    the request is between lookup and permit). Per trial, exactly one wins: an accept's permit
    is linearised before the revocation, a lost race is a reject whose vLLM cached_tokens is
    0 (its salt is unique); never an accept after the revocation."""
    run = Run(tmp_path, server)
    store = run.gw.gw.store
    store.gate.keep_log = True
    server.reset_prefix_cache()
    trials = 24
    race_ids = []

    threads: list[threading.Thread] = []
    rng = random.Random(15)

    async def race(ns):
        # the revocation runs on another thread while the request goes on to take its permit;
        # after a common start the revoker waits up to 1 ms, the request 0 or 2 ms (so both
        # orders occur over the run; which one wins a trial is decided by the gate's lock)
        epoch = store.gate.current(ns)
        go = threading.Event()
        jitter_t, jitter_l = rng.uniform(0, 0.001), rng.choice((0.0, 0.002))

        def revoke():
            go.wait()
            time.sleep(jitter_t)
            store.revoke_sync(ns, epoch)

        t = threading.Thread(target=revoke)
        threads.append(t)
        t.start()
        go.set()
        await asyncio.sleep(jitter_l)

    for _ in range(trials):
        run.send("acme")  # after a revocation: rejected (old epoch), isolated, forgets it
        run.send("acme")  # a miss: writes the new object under the current salt
        mark = len(store.gate.log)
        run.faults.between_lookup_and_permit = race
        r = run.send("acme")
        run.faults.between_lookup_and_permit = None
        threads[-1].join()
        race_ids.append((r.headers["x-prefixscope-request-id"], Run.cached(r),
                         store.gate.log[mark:]))
    run.gw.stop()
    decisions = {d["request_id"]: d for d in read_jsonl(tmp_path / "logs" / "decisions.jsonl")
                 if d.get("record") == "decision"}
    wins = {"permit": 0, "revocation": 0}
    for rid, cached, ops in race_ids:
        d = decisions[rid]
        assert sorted(op.kind for op in ops) == ["permit", "revoke"]
        permit, rev = (next(op for op in ops if op.kind == k) for k in ("permit", "revoke"))
        assert rev.ok and permit.epoch == rev.epoch  # both at the epoch the request saw
        wins["permit" if permit.ok else "revocation"] += 1
        # exactly one wins: the KV use (permit linearised first, accepted, read cached blocks)
        # or the revocation (no permit, rejected, isolated salt: vLLM read nothing)
        outcome = (permit.ok, permit.seq < rev.seq, d["decision"] == "accept", cached >= 1024)
        assert outcome in {(True, True, True, True), (False, False, False, False)}, outcome
        assert d["first_mismatch"] == (None if permit.ok else "authorization_epoch")
    assert run.gw.gw.store.in_flight == 0
    assert sum(wins.values()) == trials and min(wins.values()) > 0  # both orders happened
    print(f"\nrevocation race through the gateway: {wins}")


@pytest.mark.parametrize(("store", "tokenize"), [("memory", "off"), ("redis", "upstream")])
def test_after_a_bump_and_a_revocation_every_accept_is_a_hit_vllm_reports(tmp_path, server,
                                                                          store, tokenize):
    """The new user's walk: A warms, the admin bumps the cache epoch and revokes A, A sends the
    same prompt again. The first is a reject sent under its own isolating salt (vLLM caches
    nothing reachable); the gateway must not then accept the next one (vLLM stored nothing under
    the new salt: it reports cached_tokens 0). Decision by decision, an accept is exactly a
    request vLLM served from cache, in the memory store and in Redis; with the gateway's
    tokenizer the accepted tokens equal vLLM's, without it they bound them from above
    (``candidate_tokens_basis`` says which); the Scopes counts and invariants agree."""
    from prefixscope.store.queries.scopes import hit_rate_by_scope_totals

    with RedisServer(tmp_path / "redis") as redis:
        over = {"store": redis.url, "state_file": None} if store == "redis" else {}
        run = Run(tmp_path, server, tokenize=tokenize, **over)
        server.reset_prefix_cache()
        sent = [run.send("acme") for _ in range(2)]
        run.gw.admin("/admin/cache-epoch/bump")
        run.gw.admin("/admin/revoke", {"tenant": "acme"})
        sent += [run.send("acme") for _ in range(3)]
        run.gw.stop()
    decisions = {d["request_id"]: d for d in read_jsonl(tmp_path / "logs" / "decisions.jsonl")
                 if d.get("record") == "decision"}
    seq = [decisions[r.headers["x-prefixscope-request-id"]] for r in sent]
    cached = [Run.cached(r) for r in sent]
    assert [(d["decision"], d["salt_applied"]) for d in seq] == [
        ("miss", True), ("accept", True), ("reject", False), ("miss", True), ("accept", True)]
    assert seq[2]["reasons"] == ["authorization_epoch", "cache_epoch"]
    assert cached[0] == cached[2] == cached[3] == 0 and cached[1] >= 1024 and cached[4] >= 1024
    for d, c in zip(seq, cached):
        assert (d["decision"] == "accept") == (c > 0)
        assert d["candidate_tokens_basis"] == ("exact" if tokenize == "upstream"
                                               or d["candidate"] is None else "upper_bound")
        if d["decision"] == "accept":
            assert (d["accepted_cached_tokens"] == c if tokenize == "upstream"
                    else d["accepted_cached_tokens"] >= c)
        else:
            assert d["accepted_cached_tokens"] == 0
    con = store_db.connect(str(tmp_path / "acc.duckdb"))
    try:
        store_db.migrate(con)
        ingest_usage_file(con, tmp_path / "logs" / "usage.jsonl")
        ingest_decisions_file(con, tmp_path / "logs" / "decisions.jsonl")
        inv = invariant_counts(con)
        summary = hit_rate_by_scope_totals(con)
    finally:
        con.close()
    assert [inv["cross_scope_acceptance"], inv["wrong_version_acceptance"],
            inv["old_generation_use"]] == [0, 0, 0]
    assert int(summary["accepts"].sum()) == 2 and int(summary["rejects"].sum()) == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages"])
def test_every_endpoint_streaming_and_not(tmp_path, server, path):
    """Each endpoint through the gateway, plain then streamed, same prompt: the answers are
    vLLM's, the usage record of each normalises to the same inclusive prompt count, the
    streamed repeat reads the blocks the first wrote, and a stream whose client did not ask for
    usage carries none."""
    run = Run(tmp_path, server)
    text = TEMPLATE[:1200]
    if path == "/v1/completions":
        body = {"model": SERVED_MODEL_NAME, "prompt": text, "max_tokens": 2}
    else:
        body = {"model": SERVED_MODEL_NAME, "max_tokens": 2,
                "messages": [{"role": "user", "content": text}]}
    h = headers_for("acme")
    plain = httpx.post(run.gw.url + path, json=body, headers=h, timeout=120)
    streamed = httpx.post(run.gw.url + path, json=dict(body, stream=True), headers=h,
                          timeout=120)
    assert plain.status_code == streamed.status_code == 200
    assert streamed.text.rstrip().endswith("[DONE]") or "message_stop" in streamed.text
    assert ('"usage"' in streamed.text) == (path == "/v1/messages")  # anthropic always has it
    run.gw.stop()
    con = store_db.connect(str(tmp_path / "e.duckdb"))
    try:
        store_db.migrate(con)
        s = ingest_usage_file(con, tmp_path / "logs" / "usage.jsonl")
        rows = con.execute("SELECT endpoint, prompt_tokens, cached_tokens FROM requests "
                           "ORDER BY ts_unix_s").fetchall()
    finally:
        con.close()
    assert (s.rows_added, s.rows_quarantined) == (2, 0)
    (e1, p1, c1), (e2, p2, c2) = rows
    assert e1 == e2 == {"/v1/chat/completions": "chat", "/v1/completions": "completions",
                        "/v1/messages": "messages"}[path]
    assert p1 == p2 > 64 and c1 == 0 and c2 == ((p2 - 1) // 32) * 32
