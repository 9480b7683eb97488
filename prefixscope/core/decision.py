"""The gateway's decision procedure: one pure rule for the live gateway and its replay model.

``gateway/app.py`` (the live proxy) and ``replay/gateway.py`` (its model for traces) both decide,
per request, scope -> namespace -> lookup -> acceptance -> permit -> salt -> what to register.
The rule lives here once, as three pure stages (no I/O, no awaits); the callers do the I/O
between them (the registry lookup in memory or Redis, the permit from the shared gate):

1. :func:`route`: the scope (PUBLIC only in mode ``public``, when PUBLIC sharing is not stopped
   and every source is on the inventory), the namespace, and the registry keys to look up (one
   per prefix boundary). *Caller:* look the keys up, read the cache epoch, the bypass flag and
   the namespace's current authorization epoch.
2. :func:`judge`: the expected identity per boundary, the candidate (a presented handle's object
   first, else the deepest boundary found), ``check_acceptance``, the stale-credential rule, and
   whether a permit is needed (only a request that would be sent with its derived salt).
   *Caller:* when :attr:`Judged.needs_permit`, take the permit at :attr:`Judged.ctx_epoch`.
3. :func:`settle`: the final :class:`RequestDecision`: the verdict (a lost permit race is a
   reject ``authorization_epoch``), isolated or not, the salt inputs (:func:`salt_for`), and the
   registry changes (objects to register, entries to forget).

Numbered notes (the rule; asserted or tested where named):

1. A request goes **isolated** (a salt unique to it: vLLM reads nothing cached and writes
   nothing another request can reach) when it is rejected, when its credential is stale (its
   authorization epoch is not the namespace's current one: a stale miss is a reject too), when
   the permit race is lost, in mode ``shadow`` and under the bypass. Otherwise it goes with the
   derived salt (:func:`salt_for`).
2. **The registry names only blocks vLLM could hold under the salt the next request with that
   identity is sent with**: an accept or a miss with a fresh credential registers its own
   objects (in shadow mode too: what tenant mode would hold); a reject registers nothing and
   forgets the mismatching entries found under its own keys (compare-and-delete on the writer's
   request id; a presented handle never forgets anything); a stale credential, a lost permit and
   the bypass change nothing. (Issue 30: the replay model used to register a reject's objects;
   it follows this rule now.)
3. The registry key of a boundary is ``lookup_key(namespace, "<served model id>|<digest of the
   messages alone>")``: the model id the upstream serves (a LoRA adapter's own id), never the
   tools or render options, so a tool-set or render change finds the old object and is
   reported by field.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from prefixscope.core.decision_log import lookup_key
from prefixscope.core.identity import (
    PUBLIC,
    SALT_PREFIX,
    CacheIdentity,
    Decision,
    PublicInventory,
    bundle_digest,
    check_acceptance,
    derive_salt,
    resolve_scope,
    salt_generation,
    sha256_hex,
    validate_cache_salt,
)

#: Gateway modes (``docs/gateway.md#modes``): ``shadow`` decides and logs but sends every
#: request isolated; ``tenant`` enables TENANT/PRINCIPAL reuse; ``public`` also PUBLIC.
MODES = ("shadow", "tenant", "public")

#: The verdict of a request whose permit was lost or whose credential is stale.
_EPOCH = "authorization_epoch"


class Registered(Protocol):
    """What :func:`judge` needs of a registry entry (the gateway's and the replay's
    ``StoredObject``): the identity it was written under and the writer's request id."""

    @property
    def identity(self) -> CacheIdentity: ...

    @property
    def request_id(self) -> str: ...


S = TypeVar("S", bound=Registered)


@dataclass(frozen=True, slots=True)
class Versions:
    """The versions in force for a request (resolved by the caller, no I/O here).

    Attributes:
        served_model: the model id the upstream serves the request under (the lookup material,
            note 3; a LoRA adapter's id when the tenant runs one).
        model_digest, tokenizer_digest, runtime_digest, adapter_digest: SHA-256 hex ("" for
            no adapter).
        served_bundle_digest: the upstream's prompt bundle (chat template) digest, before the
            request's render options join it (:func:`bundle_digest`).
        policy_revision: the policy revision of the request's tenant (integer >= 0).
        public_policy_revision: the one of a PUBLIC request (the global revision; the live
            gateway has one revision for all).
    """

    served_model: str
    model_digest: str
    tokenizer_digest: str
    runtime_digest: str
    adapter_digest: str
    served_bundle_digest: str
    policy_revision: int
    public_policy_revision: int


@dataclass(frozen=True, slots=True)
class Routed:
    """Stage 1's answer: the scope and namespace the request is decided under, and the
    registry keys to look up (one per prefix boundary, shortest prefix first)."""

    scope: str
    namespace: str
    keys: tuple[bytes, ...]


def route(*, mode: str, auth_scope: str, auth_namespace: str, public_namespace: str,
          message_digests: Sequence[str], toolset_digest: str, render: str,
          messages_only: Sequence[str], served_model: str, inventory: PublicInventory,
          public_stopped: bool,
          key_fn: Callable[[str, str], bytes] | None = None) -> Routed:
    """Stage 1: scope, namespace and lookup keys of a request.

    Args:
        mode: one of :data:`MODES`.
        auth_scope: ``TENANT`` or ``PRINCIPAL``, from the trusted authentication context.
        auth_namespace: the context's namespace (``namespace_for``, 64 hex).
        public_namespace: ``namespace_for(key, scope=PUBLIC)``.
        message_digests: ``message_digest`` of every message, prompt order (may be empty when
            ``mode`` is not ``public``: only the inventory check reads them).
        toolset_digest: ``toolset_digest(tools)``, "" without tools.
        render: ``render_digest`` of the body ("" when it sets no render option).
        messages_only: per prefix boundary (ascending), SHA-256 hex of the canonical messages
            of that prefix (``PrefixDigests.messages_only``).
        served_model: :attr:`Versions.served_model`.
        inventory: the approved public inventory.
        public_stopped: ``/admin/public/stop`` was called (or the trace's ``public_stop``):
            PUBLIC is never used again.
        key_fn: the registry key function (default ``lookup_key``; tests force collisions).

    Returns:
        A :class:`Routed`. PUBLIC only in mode ``public``, while not stopped, and when every
        message, the tool set and the render options are approved (``resolve_scope``).
    """
    assert mode in MODES, f"unknown mode {mode!r}"
    scope = auth_scope
    if mode == "public" and not public_stopped:
        scope = resolve_scope(auth_scope, message_digests, toolset_digest or None, inventory,
                              render)
    ns = public_namespace if scope == PUBLIC else auth_namespace
    kf = key_fn or lookup_key
    return Routed(scope, ns, tuple(kf(ns, f"{served_model}|{m}") for m in messages_only))


@dataclass(frozen=True, slots=True)
class Judged(Generic[S]):
    """Stage 2's answer (see :func:`judge`).

    Attributes:
        routed: stage 1's answer.
        expected: the expected identity per prefix boundary (shortest first).
        full: the expected identity of the whole prompt.
        compared: the expected identity the candidate was compared with (the candidate's
            boundary; the whole prompt's without a candidate).
        candidate: the registry entry compared, or None (a miss).
        verdict: ``check_acceptance`` of the candidate, with the stale-credential rule applied.
        ctx_epoch: the request's authorization epoch (the permit is taken at it).
        current_epoch: the namespace's current authorization epoch (the salt uses it).
        stale: ``ctx_epoch != current_epoch``.
        found: the lookup's answer per key (aligned with ``routed.keys``).
        cache_epoch: the cache epoch in force.
        bundle: the request's prompt bundle digest (served bundle + render options).
        versions: the versions in force.
        isolated: sent with a salt unique to it whatever the permit (note 1).
        bypass: the cache bypass was on.
    """

    routed: Routed
    expected: tuple[CacheIdentity, ...]
    full: CacheIdentity
    compared: CacheIdentity
    candidate: S | None
    verdict: Decision
    ctx_epoch: int
    current_epoch: int
    stale: bool
    found: tuple[S | None, ...]
    cache_epoch: int
    bundle: str
    versions: Versions
    isolated: bool
    bypass: bool

    @property
    def needs_permit(self) -> bool:
        """True when the caller must take a use-permit at :attr:`ctx_epoch` before
        :func:`settle` (only a request that would go with its derived salt)."""
        return not self.isolated


def judge(routed: Routed, *, mode: str, versions: Versions, content: Sequence[str],
          full_content: str, toolset_digest: str, render: str, cache_epoch: int, bypass: bool,
          current_epoch: int, ctx_epoch: int | None, found: Sequence[S | None],
          presented: S | None = None) -> Judged[S]:
    """Stage 2: expected identities, candidate, acceptance, the stale rule; pure.

    Args:
        routed: from :func:`route`.
        mode: one of :data:`MODES`.
        versions: the versions in force.
        content: ``content_digest`` of each prefix boundary (ascending, aligned with
            ``routed.keys``).
        full_content: ``content_digest`` of the whole prompt.
        toolset_digest: "" without tools.
        render: ``render_digest`` of the body ("" for none).
        cache_epoch: the cache epoch in force (integer >= 0).
        bypass: ``/admin/bypass`` is on.
        current_epoch: the namespace's current authorization epoch (from the gate).
        ctx_epoch: the credential's authorization epoch, or None for "current" (a credential
            without an epoch of its own).
        found: the registry's answer per key of ``routed.keys`` (None: absent).
        presented: the entry of a client-presented cache handle (an untrusted hint, compared in
            full like any other), or None.

    Returns:
        A :class:`Judged`; the caller takes a permit when :attr:`Judged.needs_permit`.
    """
    assert len(found) == len(routed.keys) == len(content), "one lookup answer per boundary"
    ctx = current_epoch if ctx_epoch is None else ctx_epoch
    bundle = bundle_digest(versions.served_bundle_digest, render)
    scope, ns = routed.scope, routed.namespace
    policy = versions.public_policy_revision if scope == PUBLIC else versions.policy_revision
    expected = tuple(CacheIdentity(
        scope, ns, versions.model_digest, versions.tokenizer_digest, versions.runtime_digest,
        versions.adapter_digest, bundle, toolset_digest, d, policy, ctx, cache_epoch)
        for d in content)
    full = CacheIdentity(
        scope, ns, versions.model_digest, versions.tokenizer_digest, versions.runtime_digest,
        versions.adapter_digest, bundle, toolset_digest, full_content, policy, ctx, cache_epoch)
    cand: S | None = None
    cand_k: int | None = None
    if presented is not None:
        cand = presented
        cand_k = next((i for i in range(len(expected) - 1, -1, -1)
                       if expected[i].content_digest == presented.identity.content_digest),
                      len(expected) - 1 if expected else None)
    else:
        for i in range(len(found) - 1, -1, -1):
            obj = found[i]
            if obj is not None:
                cand, cand_k = obj, i
                break
    exp = expected[cand_k] if cand_k is not None else full
    verdict = Decision("miss") if cand is None else check_acceptance(exp, cand.identity)
    stale = ctx != current_epoch
    if stale and verdict.outcome != "reject":  # a stale credential uses nothing (note 1)
        verdict = Decision("reject", _EPOCH, (_EPOCH,))
    isolated = mode == "shadow" or bypass or verdict.outcome == "reject"
    return Judged(routed, expected, full, exp, cand, verdict, ctx, current_epoch, stale,
                  tuple(found), cache_epoch, bundle, versions, isolated, bypass)


@dataclass(frozen=True, slots=True)
class SaltInputs:
    """Everything the derived salt depends on (hashable: the gateway caches salts by it).

    ``authorization_epoch`` is the namespace's *current* epoch (a fresh credential's)."""

    scope: str
    namespace: str
    cache_epoch: int
    runtime_digest: str
    model_digest: str
    tokenizer_digest: str
    adapter_digest: str
    prompt_bundle_digest: str
    toolset_digest: str
    policy_revision: int
    authorization_epoch: int


def salt_for(key: bytes, inputs: SaltInputs) -> str:
    """The derived ``cache_salt`` of :class:`SaltInputs`: :func:`derive_salt` over the scope,
    namespace, cache epoch and runtime digest with the :func:`salt_generation` of the rest.

    Returns:
        A 68-character salt, valid for vLLM.
    """
    generation = salt_generation(
        model_digest=inputs.model_digest, tokenizer_digest=inputs.tokenizer_digest,
        adapter_digest=inputs.adapter_digest, prompt_bundle_digest=inputs.prompt_bundle_digest,
        toolset_digest=inputs.toolset_digest, policy_revision=inputs.policy_revision,
        authorization_epoch=inputs.authorization_epoch)
    return derive_salt(key, scope=inputs.scope, namespace=inputs.namespace,
                       cache_epoch=inputs.cache_epoch, runtime_digest=inputs.runtime_digest,
                       generation=generation)


def isolated_salt(unique: str) -> str:
    """A salt unique to one request (note 1): ``ps1-iso-`` + ``unique`` when that is a valid
    salt of at most 128 characters, else ``ps1-iso-`` + 40 hex of its SHA-256 (trace request
    ids may hold ``/``)."""
    salt = f"{SALT_PREFIX}iso-{unique}"
    try:
        validate_cache_salt(salt)
    except ValueError:
        salt = f"{SALT_PREFIX}iso-{sha256_hex(unique)[:40]}"
    return salt


@dataclass(frozen=True, slots=True)
class RequestDecision:
    """Stage 3's answer: the whole decision of one request.

    Attributes:
        verdict: ``accept`` / ``reject`` / ``miss`` with the mismatching fields (reasons).
        scope: PUBLIC, TENANT or PRINCIPAL.
        namespace: 64-hex namespace (callers log only its digest).
        expected: the expected identity compared (logged in short form).
        isolated: sent with a salt unique to the request (note 1).
        salt: the derived salt's inputs (:func:`salt_for`), None when isolated.
        permit_lost: the permit race was lost (a revocation won).
        register: (boundary index, registry key, identity) to register after a successful
            answer, shortest prefix first (note 2).
        forget: (registry key, writer request id) to compare-and-delete (note 2).
        bypass: the bypass was on.
    """

    verdict: Decision
    scope: str
    namespace: str
    expected: CacheIdentity
    isolated: bool
    salt: SaltInputs | None
    permit_lost: bool
    register: tuple[tuple[int, bytes, CacheIdentity], ...]
    forget: tuple[tuple[bytes, str], ...]
    bypass: bool

    @property
    def salt_applied(self) -> bool:
        """True when the request goes with its derived salt."""
        return not self.isolated


def settle(j: Judged, permit: bool | None) -> RequestDecision:
    """Stage 3: the final decision, given the permit's answer; pure.

    Args:
        j: from :func:`judge`.
        permit: the gate's answer when :attr:`Judged.needs_permit` (True: granted, False: a
            revocation won the race); None when no permit was asked for.

    Returns:
        A :class:`RequestDecision` (notes 1 and 2).

    Raises:
        AssertionError: a permit answer missing when one was needed (a caller bug).
    """
    assert (permit is None) != j.needs_permit, "a permit answer exactly when one is needed"
    verdict, isolated, lost = j.verdict, j.isolated, False
    if j.needs_permit and not permit:  # the revocation won: no cached KV for this request
        verdict = Decision("reject", _EPOCH, (_EPOCH,) + tuple(
            f for f in verdict.mismatches if f != _EPOCH))
        isolated = lost = True
    r = j.routed
    register: tuple[tuple[int, bytes, CacheIdentity], ...] = ()
    forget: tuple[tuple[bytes, str], ...] = ()
    if not j.stale and not j.bypass and not lost:
        if verdict.outcome == "reject":
            forget = tuple((k, o.request_id) for k, o, e in zip(r.keys, j.found, j.expected)
                           if o is not None and o.identity != e)
        else:
            register = tuple((i, k, j.expected[i]) for i, k in enumerate(r.keys))
    salt = None
    if not isolated:
        v = j.versions
        salt = SaltInputs(r.scope, r.namespace, j.cache_epoch, v.runtime_digest, v.model_digest,
                          v.tokenizer_digest, v.adapter_digest, j.bundle,
                          j.full.toolset_digest, j.full.policy_revision, j.current_epoch)
    return RequestDecision(verdict, r.scope, r.namespace, j.compared, isolated, salt,
                           lost, register, forget, j.bypass)


def salt_lost(d: RequestDecision) -> RequestDecision:
    """The forward check (the replay model's ``drop_salt`` fault: a proxy bug lost the derived
    salt after it was derived): the request is a reject with reason ``salt`` first, goes
    isolated and changes nothing in the registry."""
    return RequestDecision(Decision("reject", "salt", ("salt",) + d.verdict.mismatches),
                           d.scope, d.namespace, d.expected, True, None, d.permit_lost, (), (),
                           d.bypass)


def handle_mac(key: bytes) -> hmac.HMAC:
    """The keyed HMAC that :func:`cache_handle` copies (keyed once per process)."""
    return hmac.new(key, b"handle", hashlib.sha256)


def cache_handle(mac: hmac.HMAC, registry_key: bytes, namespace: str) -> str:
    """The cache handle of a registry entry that a client may present: ``h-`` + 32 hex of
    HMAC-SHA256(key, ``handle`` + registry key + namespace) (keyed: a client cannot forge
    one for another namespace's entry; a presented one is compared in full anyway)."""
    h = mac.copy()
    h.update(registry_key + namespace.encode())
    return "h-" + h.hexdigest()[:32]
