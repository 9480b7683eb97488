"""The live gateway and its replay model decide alike, request by request (issue 30 #1).

Both call ``prefixscope.core.decision`` (route, judge, settle); this test drives the same
request sequence through

- the live gateway: the real ASGI app (``gateway/app.py``, built by ``build_gateway`` from a
  config, its Redis store on a real ``redis-server``), in process through httpx's ASGI
  transport (each request runs to its end, records included, before the next), forwarding to
  a stub upstream on 127.0.0.1; and
- the replay model (``replay/gateway.py``) with the same HMAC key and inventory,

and asserts the same decision, scope, reasons and salt grouping (which requests share a
``cache_salt``) for every request. The sequences hold several tenants and principals, PUBLIC
inventory hits and misses, render-option (prompt bundle) version mismatches, cache-epoch bumps,
revocations, a stale credential, ``public/stop``, and gateway restarts (a new app on the same
Redis: the registry and epochs survive; once with a new policy revision). One fixed scenario
covers each of these; hypothesis adds bounded random sequences.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.core.identity import PublicInventory, message_digest, render_digest
from prefixscope.gateway.auth import key_digest
from prefixscope.gateway.server import build_gateway
from prefixscope.replay.gateway import Gateway as ReplayGateway
from prefixscope.replay.gateway_trace import (
    AuthContext,
    GatewayRequest,
    TraceHeader,
    VersionEvent,
)
from tests.gateway_support import (
    ADMIN_TOKEN,
    MODEL,
    RedisServer,
    gateway_config,
    loopback_upstream,
    read_jsonl,
)

#: Who sends: (tenant, principal or None, API key, credential epoch or None).
WHO = {
    "acme": ("acme", None, "key-acme-0123456789", None),
    "globex": ("globex", None, "key-globex-0123456789", None),
    "alice": ("acme", "alice", "key-alice-0123456789", None),
    "bob": ("acme", "bob", "key-bob-0123456789", None),
    "globex-stale": ("globex", None, "key-globex-stale-0123456789", 1),  # issued at epoch 1
}
#: Prompts: two approved public ones, two private ones (per tenant the same text: a private
#: prompt of two tenants must still never share).
PROMPTS = {
    "pub0": [{"role": "system", "content": "You are a terse public assistant."},
             {"role": "user", "content": "What is a prefix cache?"}],
    "pub1": [{"role": "system", "content": "You are a terse public assistant."},
             {"role": "user", "content": "What is a KV block?"}],
    "priv0": [{"role": "system", "content": "You are a terse public assistant."},
              {"role": "user", "content": "Summarise our Q3 incident notes."}],
    "priv1": [{"role": "system", "content": "Internal helper for our finance team."},
              {"role": "user", "content": "What is a prefix cache?"}],
}
#: Render options (a prompt-bundle version): none, an approved one, one off the inventory.
RENDERS = {None: {}, "docs-a": {"documents": [{"title": "faq", "text": "public faq"}]},
           "docs-b": {"documents": [{"title": "q3", "text": "a tenant's guess"}]}}


def _keys_toml() -> str:
    out = []
    for tenant, principal, key, epoch in WHO.values():
        out.append(f'[[key]]\nsha256 = "{key_digest(key)}"\ntenant = "{tenant}"\n'
                   + (f'principal = "{principal}"\nscope = "PRINCIPAL"\n' if principal else "")
                   + (f"epoch = {epoch}\n" if epoch is not None else ""))
    return "\n".join(out)


def _inventory() -> str:
    lines = [f"sha256:{message_digest(m)}\n" for p in ("pub0", "pub1") for m in PROMPTS[p]]
    lines.append(f"sha256:{render_digest(RENDERS['docs-a'])}\n")
    return "".join(lines)


@dataclass
class Outcome:
    """One request's decision on one side."""

    scope: str
    decision: str
    reasons: tuple[str, ...]
    salt: str | None


@dataclass
class Live:
    """The live gateway (ASGI app in process, Redis store) and its admin calls."""

    cfg_args: dict
    d: Path
    upstream_control: object
    gw: object = None
    rids: list[str] = field(default_factory=list)
    salts: list[str] = field(default_factory=list)

    async def start(self, **over) -> None:
        self.cfg_args.update(over)
        self.gw = build_gateway(gateway_config(self.d, **self.cfg_args))
        await self.gw.start()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(
            app=self.gw, client=("127.0.0.1", 50000)), base_url="http://gw")

    async def stop(self) -> None:
        await self.client.aclose()
        await self.gw.stop()

    async def send(self, who: str, prompt: str, render: str | None) -> None:
        body = {"model": MODEL, "messages": PROMPTS[prompt], "max_tokens": 4,
                **RENDERS[render]}
        r = await self.client.post("/v1/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {WHO[who][2]}"})
        assert r.status_code == 200, r.text
        self.rids.append(r.headers["x-prefixscope-request-id"])
        self.salts.append(self.upstream_control.requests[-1]["cache_salt"])

    async def admin(self, path: str, body: dict | None = None) -> dict:
        r = await self.client.post(path, json=body or {},
                                   headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 200, r.text
        return r.json()

    def outcomes(self) -> list[Outcome]:
        recs = {r["request_id"]: r for r in read_jsonl(self.d / "logs" / "decisions.jsonl")
                if r.get("record") == "decision"}
        return [Outcome(recs[rid]["scope"], recs[rid]["decision"], tuple(recs[rid]["reasons"]),
                        salt) for rid, salt in zip(self.rids, self.salts)]


class Model:
    """The replay model of the same deployment."""

    def __init__(self, key: bytes, inventory: PublicInventory) -> None:
        self.gw = ReplayGateway(key, TraceHeader(model=MODEL), inventory=inventory)
        self.out: list[Outcome] = []
        self.t = 0.0

    def send(self, who: str, prompt: str, render: str | None) -> None:
        from prefixscope.core.identity import PRINCIPAL, TENANT, namespace_for

        tenant, principal, _, epoch = WHO[who]
        scope = PRINCIPAL if principal else TENANT
        current = self.gw.gate.current(namespace_for(self.gw.key, scope=scope,
                                                     tenant_id=tenant, principal_id=principal))
        lag = 0 if epoch is None else current - epoch
        self.t += 1
        routed = self.gw.route(GatewayRequest(
            f"r{len(self.out)}", self.t, AuthContext(tenant, principal, scope, lag),
            tuple(PROMPTS[prompt]), render=RENDERS[render]))
        rec = routed.decision
        self.out.append(Outcome(rec.scope, rec.decision, tuple(rec.reasons),
                                routed.trace_request.cache_salt))

    def event(self, kind: str, tenant: str | None = None, principal: str | None = None) -> None:
        self.t += 1
        self.gw.apply_event(VersionEvent(self.t, kind, None, tenant, principal))


def _partition(salts: list[str | None]) -> list[int]:
    return [salts.index(s) for s in salts]


async def _drive(d: Path, upstream, redis_url: str, ops: list[tuple]) -> tuple[list, list]:
    """Run ``ops`` through both sides; returns (live outcomes, model outcomes)."""
    app, control = upstream
    redis.Redis.from_url(redis_url).flushall()
    secrets = d / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    (secrets / "hmac.key").write_bytes(bytes(range(32)).hex().encode())
    (secrets / "keys.toml").write_text(_keys_toml())
    (secrets / "admin.token").write_text(ADMIN_TOKEN)
    (d / "inventory.txt").write_text(_inventory())
    live = Live(dict(upstream_url=app.url, mode="public", store=redis_url,
                     inventory_file=str(d / "inventory.txt"),
                     hmac_key_file=str(secrets / "hmac.key"),
                     api_keys_file=str(secrets / "keys.toml"),
                     admin_token_file=str(secrets / "admin.token"), policy_revision=1),
                d, control)
    model = Model(bytes(range(32)).hex().encode(),
                  PublicInventory.from_file(d / "inventory.txt"))
    await live.start()
    try:
        for op in ops:
            kind = op[0]
            if kind == "req":
                await live.send(*op[1:])
                model.send(*op[1:])
            elif kind == "bump":
                await live.admin("/admin/cache-epoch/bump")
                model.event("cache_epoch_bump")
            elif kind == "revoke":
                tenant, principal = WHO[op[1]][:2]
                await live.admin("/admin/revoke", {"tenant": tenant, "principal": principal}
                                 if principal else {"tenant": tenant})
                model.event("authorization_epoch_bump", tenant, principal)
            elif kind == "stop_public":
                await live.admin("/admin/public/stop")
                model.gw.stop_public()
            elif kind == "restart":  # a new app on the same Redis; maybe a new policy
                await live.stop()
                over = {}
                if op[1]:
                    over["policy_revision"] = live.cfg_args["policy_revision"] + 1
                    model.event("policy_revocation")
                await live.start(**over)
            else:  # pragma: no cover - the strategies below make only these
                raise AssertionError(kind)
    finally:
        await live.stop()
    return live.outcomes(), model.out


def _assert_same(live: list[Outcome], model: list[Outcome], ops) -> None:
    reqs = [op for op in ops if op[0] == "req"]
    for i, (a, b) in enumerate(zip(live, model)):
        assert (a.scope, a.decision, a.reasons) == (b.scope, b.decision, b.reasons), (
            i, reqs[i], a, b)
    assert len(live) == len(model) == len(reqs)
    assert _partition([o.salt for o in live]) == _partition([o.salt for o in model])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def upstream():
    with loopback_upstream() as app_and_control:
        yield app_and_control


#: The fixed scenario: every kind of step, with the expected live decisions.
SCENARIO = [
    ("req", "acme", "pub0", None), ("req", "globex", "pub0", None),        # PUBLIC miss, hit
    ("req", "acme", "priv0", None), ("req", "globex", "priv0", None),      # TENANT: never shared
    ("req", "acme", "priv0", None),                                          # acme's own: accept
    ("req", "alice", "priv0", None), ("req", "bob", "priv0", None),        # PRINCIPAL: apart
    ("req", "alice", "priv0", None),
    ("req", "acme", "pub0", "docs-a"),                                      # bundle version
    ("req", "globex", "pub0", "docs-a"), ("req", "globex", "pub0", "docs-a"),
    ("req", "globex", "pub1", "docs-b"),                                    # off the inventory
    ("bump",), ("req", "acme", "priv0", None), ("req", "acme", "priv0", None),
    ("req", "acme", "priv0", None),                                          # reject, miss, accept
    ("req", "globex", "priv1", None), ("revoke", "globex"),
    ("req", "globex-stale", "priv1", None),                                 # stale credential
    ("req", "globex", "priv1", None), ("req", "globex", "priv1", None),
    ("req", "globex", "priv1", None),
    ("restart", False), ("req", "globex", "priv1", None),                   # Redis kept it
    ("req", "alice", "priv0", None),
    ("restart", True), ("req", "acme", "pub0", None),                       # new policy
    ("req", "globex", "pub0", None), ("req", "globex", "pub0", None),
    ("stop_public",), ("req", "acme", "pub0", None), ("req", "globex", "pub0", None),
    ("req", "globex", "pub0", None),
]


def test_fixed_scenario_decides_alike(tmp_path, upstream, redis_url):
    live, model = asyncio.run(_drive(tmp_path, upstream, redis_url, SCENARIO))
    _assert_same(live, model, SCENARIO)
    got = [(o.scope, o.decision, o.reasons[:1]) for o in live]
    P, T, R = "PUBLIC", "TENANT", "PRINCIPAL"
    assert got == [
        (P, "miss", ()), (P, "accept", ()),
        (T, "miss", ()), (T, "miss", ()), (T, "accept", ()),
        (R, "miss", ()), (R, "miss", ()), (R, "accept", ()),
        (P, "reject", ("prompt_bundle_digest",)), (P, "miss", ()), (P, "accept", ()),
        (T, "reject", ("prompt_bundle_digest",)),  # globex's system message, no render
        (T, "reject", ("cache_epoch",)), (T, "miss", ()), (T, "accept", ()),
        (T, "miss", ()),
        (T, "reject", ("authorization_epoch",)),
        (T, "reject", ("authorization_epoch",)), (T, "miss", ()), (T, "accept", ()),
        (T, "accept", ()),
        (R, "reject", ("cache_epoch",)),
        (P, "reject", ("prompt_bundle_digest",)), (P, "miss", ()), (P, "accept", ()),
        (T, "reject", ("policy_revision",)), (T, "miss", ()), (T, "accept", ()),
    ], got
    assert live[22].reasons == ("prompt_bundle_digest", "policy_revision", "cache_epoch")
    # salts: a reject goes isolated (a salt of its own); two tenants' private prompts never
    # share one; PUBLIC hits do
    salts = [o.salt for o in live]
    assert salts[0] == salts[1] and salts[2] != salts[3] and salts[2] == salts[4]
    assert len({s for s, o in zip(salts, live) if o.decision == "reject"}) == sum(
        o.decision == "reject" for o in live)
    assert "acme" not in json.dumps([o.__dict__ for o in live])


_who = st.sampled_from(sorted(WHO))
# a credential's own epoch (the stale key) is compared with the namespace the request is
# decided under: the live gateway's is absolute, the replay's a lag behind the tenant's
# namespace, so the stale key sends private prompts only (no PUBLIC namespace in between)
_req = st.tuples(st.just("req"), _who, st.sampled_from(sorted(PROMPTS)),
                 st.sampled_from([None, "docs-a", "docs-b"])).filter(
                     lambda r: r[1] != "globex-stale" or r[2].startswith("priv"))
_op = st.one_of(
    _req, _req, _req, _req, _req, _req,
    st.just(("bump",)),
    st.tuples(st.just("revoke"), st.sampled_from(["acme", "globex", "alice"])),
    st.just(("stop_public",)),
    st.tuples(st.just("restart"), st.booleans()),
)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=5, max_size=30))
def test_random_sequences_decide_alike(tmp_path_factory, upstream, redis_url, ops):
    d = tmp_path_factory.mktemp("diff")
    live, model = asyncio.run(_drive(d, upstream, redis_url, ops))
    _assert_same(live, model, ops)
