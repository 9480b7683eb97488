"""A cache gateway model for replay: identity, salts, candidate lookup, acceptance, decisions.

Per request, in trace order, :class:`Gateway` does what ``cache-identity.md`` asks of a gateway in
front of vLLM, by the live gateway's own procedure (``prefixscope.core.decision``: the same pure
stages ``gateway/app.py`` calls):

1. **Resolve identity** from the trusted authentication context (tenant, principal, scope; never
   from the request body): the namespace (HMAC), the versions in force (model, tokenizer,
   runtime, the tenant's adapter, prompt bundle = chat template, toolset, the tenant's policy
   revision), the request's authorization epoch and the cache epoch. A request is PUBLIC only
   when every message and its tool set are on the approved public inventory.
2. **Apply the salt** (``prefixscope.core.identity.derive_salt``): namespace + cache epoch + runtime digest
   for TENANT/PRINCIPAL, the shared public salt for PUBLIC. Private prefixes are therefore
   separated physically before any lookup.
3. **Look up candidates** in the gateway's registry of stored prefix objects: one object per
   message boundary of earlier requests (everything before the last message), keyed by a short
   lookup key of (namespace, content digest). The deepest boundary found is the candidate. A
   client-supplied ``cache_handle`` is only a hint: its object is compared like any other.
4. **Check acceptance** (``prefixscope.core.identity.check_acceptance``): every identity field must match,
   then a use-permit is taken from the :class:`~prefixscope.core.identity.AuthorizationGate`. Before
   forwarding, the outgoing salt must equal the derived one (reason ``salt`` otherwise).
5. **Forward**: an accepted or missed request goes to the engine with its derived salt; a
   rejected one (a stale credential and a lost permit included) with a salt unique to it, as
   the live gateway, and vLLM's ``skip_reading_prefix_cache`` (``TraceRequest.skip_reading``).
   It registers nothing and forgets the mismatching entries under its own keys, so the next
   request is a miss that writes the new generation (``prefixscope.core.decision`` note 2).
6. **Record** one :class:`DecisionRecord` per request (``docs/scopes.md#decision-log``).

Registry objects are written only by accepted or missed requests forwarded with their derived
salt and a current authorization epoch. The registry does not see engine evictions or restarts: an accepted
candidate may still find nothing in the engine (accepted > cached tokens in the usage join).

Version events (:data:`prefixscope.replay.gateway_trace.EVENT_KINDS`) change the state; ``model_upgrade``, ``tokenizer_upgrade``,
``runtime_upgrade`` and ``worker_restart`` start a new engine (empty cache, counters from 0):
vLLM loads those at start-up. :func:`prefixscope.replay.gateway_replay.replay_gateway_trace` runs each engine lifetime through
``prefixscope.replay.sim.simulate`` with the salts applied.

The model is three modules: ``prefixscope.replay.gateway_trace`` (the trace format and its reader),
``prefixscope.replay.gateway`` (this one: identity, salts, registry, acceptance, decision records) and
``prefixscope.replay.gateway_replay`` (a whole trace through the gateway and the simulator, the decision
log).

Pure: no DuckDB, no HTTP; reads only the trace, its text library, inventory and tokenizers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefixscope.core import decision
from prefixscope.core.decision_log import DecisionRecord, candidate_tokens, event_record
from prefixscope.core.errors import ParseError
from prefixscope.core.identity import (
    PRINCIPAL,
    PUBLIC,
    TENANT,
    AuthorizationGate,
    CacheIdentity,
    PublicInventory,
    file_digest,
    namespace_digest,
    namespace_for,
    prefix_digests,
    render_digest,
    sha256_hex,
    short_digest,
    toolset_digest,
)
from prefixscope.replay.types import TraceRequest
from prefixscope.replay.gateway_trace import GatewayRequest, TraceHeader, VersionEvent


@dataclass(frozen=True, slots=True)
class StoredObject:
    """A prefix object in the gateway's registry: its identity, its length in tokens, the
    request that stored it and the handle a client may present for it."""

    identity: CacheIdentity
    num_tokens: int
    request_id: str
    handle: str


@dataclass(frozen=True, slots=True)
class Routed:
    """What the gateway forwards for one request and what it decided."""

    trace_request: TraceRequest
    decision: DecisionRecord


@dataclass
class Faults:
    """Failure injection for negative tests (never used by the CLI).

    Attributes:
        drop_salt: requests for which the outgoing salt is lost after derivation (a proxy bug).
        lookup_key: replaces the registry key function (e.g. a deliberately weak hash); the
            live gateway's ``Faults.lookup_key``.
    """

    drop_salt: Callable[[GatewayRequest], bool] | None = None
    lookup_key: Callable[[str, str], bytes] | None = None


class Gateway:
    """The gateway model. Feed it events and requests in time order (see the module docstring).

    Args:
        key: the server-side HMAC key (``prefixscope.core.identity.load_hmac_key``).
        header: the deployment at t = 0.
        base_dir: folder that relative paths of the header and events resolve against.
        inventory: approved public inventory (default: the header's file, or empty).
        faults: failure injection for tests.
        run_id, instance: copied into decision records.
        mode: the live gateway's mode (``prefixscope.core.decision.MODES``): ``public``
            (default: PUBLIC prompts shared), ``tenant`` or ``shadow``.
    """

    def __init__(self, key: bytes, header: TraceHeader, *, base_dir: str | os.PathLike[str] = ".",
                 inventory: PublicInventory | None = None, faults: Faults | None = None,
                 run_id: str | None = None, instance: str | None = None,
                 mode: str = "public") -> None:
        assert mode in decision.MODES, f"unknown mode {mode!r}"
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
        self.mode = mode
        #: PUBLIC sharing stopped (:meth:`stop_public`; one way, as ``/admin/public/stop``)
        self.public_stopped = False
        #: every request isolated (as ``/admin/bypass``; :meth:`set_bypass`)
        self.bypass = False
        self._public_ns = namespace_for(key, scope=PUBLIC)
        self._handle_mac = decision.handle_mac(key)

    # ---- state

    def _tokenizer(self) -> Any:
        from prefixscope.replay.tokenization import BUNDLED_TOKENIZER_DIR, load_chat_tokenizer

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

    def stop_public(self) -> None:
        """Stop PUBLIC sharing for good (the live ``/admin/public/stop``): later requests are
        TENANT or PRINCIPAL."""
        self.public_stopped = True

    def set_bypass(self, on: bool) -> None:
        """Switch the bypass (the live ``/admin/bypass``): while on, every request is isolated;
        turning it off advances the cache epoch, so nothing from before is used again."""
        if self.bypass and not on:
            self.cache_epoch += 1
        self.bypass = on

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
        return event_record(self.header.t0_unix_s + ev.t_s, ev.event, run_id=self.run_id,
                            namespace_digest=ns_digest, new_value=new_value)

    # ---- requests

    def route(self, req: GatewayRequest) -> Routed:
        """Decide one request: resolve, look up, check, take the permit, salt, forward, record.

        The rule is ``prefixscope.core.decision`` (the live gateway's, one procedure); this
        method gives it the model's state: the versions in force, the in-memory registry and
        gate."""
        tok, tok_digest, served_bundle = self._tokenizer()
        B = self.header.block_size
        tools_name = self.toolset_override.get(req.tools_ref, req.tools_ref) if req.tools_ref else None
        tools = list(self.toolsets.get(tools_name, [])) if tools_name else []
        messages = list(req.messages)
        # the render options the template sees (core.identity.RENDER_FIELDS; the replay's
        # template is the tokenizer's own, so a request's chat_template enters the identity
        # only)
        render = dict(req.render)
        kwargs = dict(render.get("chat_template_kwargs") or {})
        kwargs.update({k: render[k] for k in ("documents", "continue_final_message")
                       if k in render})
        ids = tok.encode(tok.render(messages, tools=tools or None,
                                    add_generation_prompt=render.get("add_generation_prompt",
                                                                     True), **kwargs))
        n = len(ids)
        # message boundaries: prefix objects are everything before the last message
        bounds: list[int] = []
        for k in range(len(messages) - 1):
            pre = tok.encode(tok.render(messages[:k + 1], tools=tools or None,
                                        add_generation_prompt=False, **kwargs))
            m = len(pre)
            if ids[:m] != pre:  # a tokenizer merged across the boundary: keep the common part
                m = next((i for i, (a, b) in enumerate(zip(ids, pre)) if a != b), min(m, n))
            bounds.append(m)
        dig = prefix_digests(messages, tools, range(1, len(messages)))
        r_digest = render_digest(render)  # the live gateway's rule, core.identity
        auth = req.auth
        adapter = self.adapter_for(auth.tenant_id)
        versions = decision.Versions(
            served_model=adapter[0] if adapter else self.header.model,
            model_digest=self.model_digest(), tokenizer_digest=tok_digest,
            runtime_digest=self.runtime_digest(),
            adapter_digest=sha256_hex(f"adapter:{adapter[0]}:{adapter[1]}") if adapter else "",
            served_bundle_digest=served_bundle,
            policy_revision=self.policy_revision(auth.tenant_id),
            public_policy_revision=self.policy_base)
        routed = decision.route(
            mode=self.mode, auth_scope=auth.scope,
            auth_namespace=namespace_for(self.key, scope=auth.scope, tenant_id=auth.tenant_id,
                                         principal_id=auth.principal_id),
            public_namespace=self._public_ns, message_digests=dig.message,
            toolset_digest=dig.toolset, render=r_digest, messages_only=dig.messages_only,
            served_model=versions.served_model, inventory=self.inventory,
            public_stopped=self.public_stopped, key_fn=self.faults.lookup_key)
        ns = routed.namespace
        current = self.gate.current(ns)
        presented = self.handles.get(req.cache_handle) if req.cache_handle is not None else None
        judged = decision.judge(
            routed, mode=self.mode, versions=versions, content=dig.content,
            full_content=dig.full, toolset_digest=dig.toolset, render=r_digest,
            cache_epoch=self.cache_epoch, bypass=self.bypass, current_epoch=current,
            ctx_epoch=current - max(0, auth.epoch_lag),
            found=[self.registry.get(k) for k in routed.keys], presented=presented)
        d = decision.settle(judged, self.gate.acquire_permit(ns, judged.ctx_epoch)
                            if judged.needs_permit else None)
        if self.faults.drop_salt and self.faults.drop_salt(req):
            d, salt = decision.salt_lost(d), None  # the forward check catches the lost salt
        elif d.salt is None:
            salt = decision.isolated_salt(f"replay-{req.request_id}")
        else:
            salt = decision.salt_for(self.key, d.salt)
        self._apply_registry(d, bounds, req.request_id)
        outcome = d.verdict.outcome
        cand = judged.candidate
        cand_tokens = candidate_tokens(cand.num_tokens, n, B) if cand is not None else 0
        record = DecisionRecord(
            ts_unix_s=self.header.t0_unix_s + req.t_s, request_id=req.request_id,
            scope=d.scope, namespace_digest=namespace_digest(ns), decision=outcome,
            reasons=d.verdict.mismatches, candidate_cached_tokens=cand_tokens,
            accepted_cached_tokens=(cand_tokens if outcome == "accept" and not d.bypass
                                    else 0),
            salt_applied=d.salt_applied, expected=d.expected.short(self.key),
            candidate=None if cand is None else cand.identity.short(self.key),
            candidate_request_id=None if cand is None else cand.request_id,
            run_id=self.run_id, instance=self.instance, model=self.header.model,
            bypass=True if d.bypass else None)
        tr = TraceRequest(
            request_id=req.request_id, arrival_s=req.t_s, num_prompt_tokens=n,
            prompt_token_ids=ids, output_tokens=req.output_tokens, model=self.header.model,
            cache_salt=salt, lora_name=adapter[0] if adapter else None,
            lora_path=adapter[1] if adapter else None, skip_reading=(outcome == "reject"),
            source=req.source,
            attrs={"scope": d.scope, "tenant_digest": namespace_digest(ns), "decision": outcome})
        return Routed(tr, record)

    def _apply_registry(self, d: decision.RequestDecision, bounds: list[int],
                        request_id: str) -> None:
        """Register the decision's objects (``bounds``: each boundary's length in tokens) and
        forget its entries (compare-and-delete on the writer), as the live store does."""
        for key, writer in d.forget:
            old = self.registry.get(key)
            if old is not None and old.request_id == writer:
                del self.registry[key]
                self.handles.pop(old.handle, None)
        handle = None
        for i, key, ident in d.register:
            handle = decision.cache_handle(self._handle_mac, key, d.namespace)
            obj = StoredObject(ident, bounds[i], request_id, handle)
            self.registry[key] = obj
            self.handles[handle] = obj
        if handle is not None:
            self._handle_by_request[request_id] = handle
