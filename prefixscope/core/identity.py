"""Cache identity, scope, salts and the acceptance check (``../shared/docs/cache-identity.md``).

A cached prefix may be used only when the hit is *eligible*: same content, same versions of
everything that shapes the tokens or the attention computation, and the same trust boundary.
This module is the vocabulary and the arithmetic of that rule; ``replay/gateway.py`` applies it
request by request. Everything here is pure (no DuckDB, no network); the only file reads are the
HMAC key and the public inventory.

Numbered notes (asserted where they are protected):

1. A namespace is HMAC-SHA256 (RFC 2104) of the trusted tenant (or tenant + principal) id under a
   server-side key. The raw id never leaves :func:`namespace_for`; logs carry
   :func:`namespace_digest` (16 hex characters of the namespace) and nothing else.
2. The key is read from a file (``--hmac-key-file``, ``$PREFIXSCOPE_HMAC_KEY_FILE`` or
   ``[identity] hmac_key_file``) or, for containers, the hex value of ``$PREFIXSCOPE_HMAC_KEY``.
   It is at least 32 bytes and never inside the repository (:func:`load_hmac_key` refuses).
3. The salt of a TENANT or PRINCIPAL request is derived from the namespace, the cache epoch and
   the runtime digest only (:func:`derive_salt`), so the physical cache separates namespaces
   and generations before any lookup. PUBLIC requests share one salt per (cache epoch, runtime),
   and only when every source of the prompt is on the approved public inventory.
4. Every salt is a valid vLLM ``cache_salt`` (:func:`validate_cache_salt`, the rule of
   ``validate_cache_salt`` in ``vllm/entrypoints/generate/base/protocol.py``, vLLM 0.33 and 0.32).
5. :func:`check_acceptance` compares *every* field of the identity, in
   :data:`IDENTITY_FIELDS` order, with constant-time comparison for strings; a short lookup key
   is never accepted on its own.
6. :class:`AuthorizationGate` linearises authorization-epoch revocations against use-permits:
   for a revocation from epoch e and a permit requested at epoch e, exactly one wins.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from prefixscope.core.bounds import NotReadable, open_regular
from prefixscope.core.errors import ConfigError
from prefixscope.core.paths import source_root

#: The three scopes of a cacheable prefix (``cache-identity.md#scope``).
PUBLIC = "PUBLIC"
TENANT = "TENANT"
PRINCIPAL = "PRINCIPAL"
SCOPES = (PUBLIC, TENANT, PRINCIPAL)

#: Order in which :func:`check_acceptance` compares the fields; the first mismatch is reported.
IDENTITY_FIELDS = (
    "scope", "namespace", "model_digest", "tokenizer_digest", "runtime_digest",
    "adapter_digest", "prompt_bundle_digest", "toolset_digest", "content_digest",
    "policy_revision", "authorization_epoch", "cache_epoch",
)
#: Fields whose mismatch means another trust boundary (cross-scope attempt).
SCOPE_FIELDS = ("scope", "namespace")
#: Fields whose mismatch means another version of something that shapes the tokens or the
#: attention computation, or another security policy (version-mismatch miss).
VERSION_FIELDS = ("model_digest", "tokenizer_digest", "runtime_digest", "adapter_digest",
                  "prompt_bundle_digest", "toolset_digest", "policy_revision")
#: Fields whose mismatch means an older (or newer) generation of authorization or cache.
GENERATION_FIELDS = ("authorization_epoch", "cache_epoch")
#: Gateway-level reasons that are not identity fields: ``salt`` (the forwarded request did not
#: carry the derived salt) and ``content_digest`` (a short-key collision).
EXTRA_REASONS = ("salt",)
ALL_REASONS = IDENTITY_FIELDS + EXTRA_REASONS

#: The request fields, besides the prompt itself (``messages``, ``system``, ``prompt``: the
#: content digest) and ``tools`` (the toolset digest), that can change the token sequence vLLM
#: builds from a request: the chat template and what it is given (``ChatCompletionRequest
#: .build_chat_params``: ``chat_template``, ``chat_template_kwargs``, ``documents``,
#: ``add_generation_prompt``, ``continue_final_message``, ``reasoning_effort`` (also sets
#: ``enable_thinking``), ``tool_choice``, ``response_format``, ``media_io_kwargs``), the
#: tokenization (``build_tok_params``: ``add_special_tokens``, ``truncate_prompt_tokens``,
#: ``truncation_side``), multimodal processing (``mm_processor_kwargs``), a completions
#: request's ``prompt_embeds`` and the Anthropic route's ``thinking``
#: (``vllm/entrypoints/openai/chat_completion/protocol.py``, vLLM 0.32 and later). One list for
#: every endpoint (a field an endpoint does not take is simply absent from its bodies), owned
#: here and used by the identity and salt (:func:`render_digest`, :func:`bundle_digest`), the
#: PUBLIC rule (:func:`resolve_scope`), the gateway's ``/tokenize`` (``gateway/tokens.py``)
#: and the replay model (``replay/gateway.py``). Not listed, because they change the output
#: and never the prompt's tokens: ``echo`` (prepends the last message to the *answer*),
#: sampling parameters, ``stream``/``stream_options``, ``cache_salt`` (replaced by the
#: gateway). Seed rule: everything that can change the token sequence is part of the identity.
RENDER_FIELDS = (
    "chat_template", "chat_template_kwargs", "documents", "add_generation_prompt",
    "continue_final_message", "add_special_tokens", "reasoning_effort", "tool_choice",
    "response_format", "mm_processor_kwargs", "media_io_kwargs", "truncate_prompt_tokens",
    "truncation_side", "prompt_embeds", "thinking",
)

MIN_KEY_BYTES = 32
#: Largest HMAC key file read, bytes (a key is 32-64 bytes; anything far larger is not a key).
MAX_KEY_FILE_BYTES = 4096
SALT_PREFIX = "ps1-"
SALT_MAX_CHARS = 128          # vLLM validate_cache_salt (0.33, 0.32)
_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")
NAMESPACE_DIGEST_CHARS = 16
SHORT_DIGEST_CHARS = 12
#: Keys that never change the rendered prompt and are dropped before hashing content.
_NON_SEMANTIC_KEYS = frozenset({"cache_control", "prompt_cache_breakpoint"})


# --------------------------------------------------------------------------- the key

def load_hmac_key(path: str | os.PathLike[str] | None = None, *,
                  config_path: str | None = None) -> bytes:
    """Load the server-side HMAC key (note 2).

    Lookup order: ``path``; ``$PREFIXSCOPE_HMAC_KEY_FILE``; ``config_path`` (the
    ``[identity] hmac_key_file`` setting); the hex string in ``$PREFIXSCOPE_HMAC_KEY``.
    A key file holds the key bytes; surrounding whitespace is stripped.

    Returns:
        The key bytes (at least 32).

    Raises:
        ConfigError: no key configured, the file is unreadable, too short, or lies inside the
            prefixscope repository (keys never live in the repo).
    """
    candidate = path or os.environ.get("PREFIXSCOPE_HMAC_KEY_FILE") or config_path
    if candidate:
        p = Path(candidate).expanduser().resolve()
        root = source_root()
        inside = root is not None and (p == root or root in p.parents)
        if inside:
            raise ConfigError(f"{p}: the HMAC key file lies inside the repository; keep it outside "
                              "(e.g. /etc/prefixscope/hmac.key, mode 0600)")
        try:
            with open_regular(p) as fh:  # a FIFO or /dev/zero is refused, never read
                key = fh.read(MAX_KEY_FILE_BYTES + 1)
        except NotReadable as exc:
            raise ConfigError(f"{p}: cannot read the HMAC key file: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the HMAC key file: {exc.strerror}") from exc
        if len(key) > MAX_KEY_FILE_BYTES:
            raise ConfigError(f"{p}: not an HMAC key file: larger than {MAX_KEY_FILE_BYTES:,} "
                              "bytes")
        key = key.strip()
        source = str(p)
    else:
        text = os.environ.get("PREFIXSCOPE_HMAC_KEY")
        if not text:
            raise ConfigError(
                "no HMAC key: pass --hmac-key-file, set PREFIXSCOPE_HMAC_KEY_FILE, or set "
                "[identity] hmac_key_file (create one with: head -c 32 /dev/urandom > FILE)")
        try:
            key = bytes.fromhex(text.strip())
        except ValueError as exc:
            raise ConfigError("PREFIXSCOPE_HMAC_KEY: not a hex string") from exc
        source = "PREFIXSCOPE_HMAC_KEY"
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"{source}: HMAC key has {len(key)} bytes; need at least {MIN_KEY_BYTES}")
    return key


def _hmac_hex(key: bytes, *parts: str | bytes) -> str:
    assert len(key) >= MIN_KEY_BYTES, "HMAC key too short (note 2)"
    msg = b"\x00".join(p.encode("utf-8") if isinstance(p, str) else p for p in parts)
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


# --------------------------------------------------------------------------- namespaces

def namespace_for(key: bytes, *, scope: str, tenant_id: str | None = None,
                  principal_id: str | None = None) -> str:
    """The namespace of a request: HMAC-SHA256 hex (64 chars) of the trusted id (note 1).

    Args:
        key: the server-side key (:func:`load_hmac_key`).
        scope: ``PUBLIC``, ``TENANT`` or ``PRINCIPAL`` (from the authentication context).
        tenant_id: trusted tenant id (required for TENANT and PRINCIPAL).
        principal_id: trusted principal id (required for PRINCIPAL).

    Raises:
        ValueError: unknown scope or a missing id (a programming error of the caller).
    """
    if scope == PUBLIC:
        return _hmac_hex(key, "prefixscope/namespace/v1", PUBLIC)
    if scope == TENANT:
        if not tenant_id:
            raise ValueError("TENANT namespace needs a tenant id")
        return _hmac_hex(key, "prefixscope/namespace/v1", TENANT, tenant_id)
    if scope == PRINCIPAL:
        if not tenant_id or not principal_id:
            raise ValueError("PRINCIPAL namespace needs a tenant id and a principal id")
        return _hmac_hex(key, "prefixscope/namespace/v1", PRINCIPAL, tenant_id, principal_id)
    raise ValueError(f"unknown scope {scope!r}")


def namespace_digest(namespace: str) -> str:
    """The short form of a namespace that logs, tables and labels carry: its first 16 hex chars."""
    assert len(namespace) == 64, "namespace must be a 64-hex HMAC (note 1)"
    return namespace[:NAMESPACE_DIGEST_CHARS]


def tenant_digest(key: bytes, tenant_id: str) -> str:
    """Namespace digest of a TENANT-scoped tenant id (what usage logs' tenant ids become)."""
    return namespace_digest(namespace_for(key, scope=TENANT, tenant_id=tenant_id))


# --------------------------------------------------------------------------- content digests

def _canon(value: Any) -> Any:
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, Mapping):
        return {str(k): _canon(v) for k, v in value.items()
                if k not in _NON_SEMANTIC_KEYS and v is not None}
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return value


def canonical_json(value: Any) -> bytes:
    """Canonical bytes of a JSON value: keys sorted, no insignificant whitespace, strings NFC,
    ``None``-valued keys and non-semantic keys (``cache_control``, ``prompt_cache_breakpoint``)
    dropped, UTF-8. String contents are otherwise kept byte for byte (whitespace changes tokens)."""
    return json.dumps(_canon(value), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes | str) -> str:
    """SHA-256 hex of bytes (strings are UTF-8 encoded)."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def content_digest(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()) -> str:
    """SHA-256 hex over the canonicalised messages and tool definitions of a prefix.

    Args:
        messages: chat messages in prompt order (``role``, ``content``, optional ``name``,
            ``tool_calls``, ``tool_call_id``), as rendered.
        tools: tool definitions (OpenAI shape), in request order (order changes the prompt).
    """
    return sha256_hex(canonical_json({"messages": list(messages), "tools": list(tools)}))


@dataclass(frozen=True, slots=True)
class PrefixDigests:
    """The digests of every prefix of one prompt, each message canonicalised once.

    Attributes:
        content: ``content_digest(messages[:k], tools)`` for each k of ``boundaries``.
        full: ``content_digest(messages, tools)``.
        messages_only: ``sha256_hex(canonical_json(messages[:k]))`` for each k of
            ``boundaries`` (the registry lookup material, ``decision_log.lookup_key``).
        message: ``message_digest(m)`` of each message (the public inventory's digests).
        toolset: ``toolset_digest(tools)``, or "" without tools.
    """

    content: tuple[str, ...]
    full: str
    messages_only: tuple[str, ...]
    message: tuple[str, ...]
    toolset: str


def prefix_digests(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                   boundaries: Sequence[int], *,
                   canonical: Callable[[Any], bytes] | None = None,
                   message_digests: bool = True) -> PrefixDigests:
    """All the digests :func:`content_digest`, :func:`message_digest` and
    :func:`toolset_digest` give for the prefixes ``messages[:k]`` (k in ``boundaries``,
    ascending, each 1..len(messages)), equal to them byte for byte, in O(total size) instead of O(messages²): the
    canonical form of ``{"messages": [...], "tools": [...]}`` is ``{"messages":[`` + the
    messages' canonical forms joined by ``,`` + ``],"tools":`` + the tools' + ``}`` (keys
    sorted), so one running SHA-256 per prefix kind is copied at each boundary.

    ``canonical`` replaces :func:`canonical_json` for each message and the tool list (it must
    return the same bytes, e.g. a cache of them: the gateway's ``CanonicalCache``);
    ``message_digests=False`` leaves ``message`` empty (one hash pass less: only the public
    inventory check needs them)."""
    canon_fn = canonical or canonical_json
    canon = [canon_fn(m) for m in messages]
    t = canon_fn(list(tools)) if tools else b"[]"
    tail = b'],"tools":' + t + b"}"
    hc = hashlib.sha256(b'{"messages":[')
    hm = hashlib.sha256(b"[")
    content: list[str] = []
    only: list[str] = []
    want = iter(boundaries)
    nxt = next(want, None)
    for i, c in enumerate(canon):
        if i:
            hc.update(b",")
            hm.update(b",")
        hc.update(c)
        hm.update(c)
        while nxt == i + 1:
            h = hc.copy()
            h.update(tail)
            content.append(h.hexdigest())
            h = hm.copy()
            h.update(b"]")
            only.append(h.hexdigest())
            nxt = next(want, None)
    assert nxt is None, "boundaries must be ascending and within 1..len(messages)"
    hc.update(tail)
    return PrefixDigests(tuple(content), hc.hexdigest(), tuple(only),
                         tuple(sha256_hex(c) for c in canon) if message_digests else (),
                         sha256_hex(t) if tools else "")


def render_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`RENDER_FIELDS` a request body sets (a ``null`` value counts as not set:
    vLLM's default applies), in :data:`RENDER_FIELDS` order."""
    return {k: body[k] for k in RENDER_FIELDS if body.get(k) is not None}


def render_digest(body: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonicalised :func:`render_options` of a request body, or ``""``
    when it sets none of them (every such request renders with the served defaults).

    Two bodies that differ in any :data:`RENDER_FIELDS` value get different digests; a value
    given explicitly equal to vLLM's default (``"add_generation_prompt": true``) counts as
    different from an absent one (one more cache split, never a wrong share). This is also
    the digest the public inventory approves for a request's render options
    (``prefixscope inventory digest``)."""
    opts = render_options(body)
    return sha256_hex(canonical_json(opts)) if opts else ""


def bundle_digest(served: str, render: str) -> str:
    """The ``prompt_bundle_digest`` of a request: the served prompt bundle's digest (chat
    template and tokenizer settings the upstream loaded) alone when the request sets no
    render option (``render`` = ``""``), else SHA-256 hex of both (NUL-separated), so the
    identity, and through it the salt, differ whenever the rendering may.

    Args:
        served: the upstream's (or the replay's) prompt bundle digest, 64 hex.
        render: :func:`render_digest` of the request body.
    """
    return served if not render else sha256_hex(served + "\x00" + render)


def message_digest(message: Mapping[str, Any]) -> str:
    """SHA-256 hex of one canonicalised message (what the public inventory lists)."""
    return sha256_hex(canonical_json(message))


def toolset_digest(tools: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 hex of the canonicalised tool definitions (the tool schema version)."""
    return sha256_hex(canonical_json(list(tools)))


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 hex of a file's bytes (tokenizer.json, chat template, adapter weights...)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def short_digest(digest: str) -> str:
    """First 12 hex chars of a (public) version digest, for logs."""
    return digest[:SHORT_DIGEST_CHARS]


def log_content_digest(key: bytes, digest: str) -> str:
    """Short, keyed form of a content digest for logs: 12 hex chars of HMAC(key, digest), so a
    log reader without the key cannot confirm a guessed prompt."""
    return _hmac_hex(key, "prefixscope/log-content/v1", digest)[:SHORT_DIGEST_CHARS]


# --------------------------------------------------------------------------- identity

@dataclass(frozen=True, slots=True)
class CacheIdentity:
    """The full identity of a cached prefix object (``cache-identity.md#identity``).

    Attributes:
        scope: PUBLIC, TENANT or PRINCIPAL.
        namespace: 64-hex HMAC namespace (note 1).
        model_digest, tokenizer_digest, runtime_digest, adapter_digest, prompt_bundle_digest,
            toolset_digest: SHA-256 hex of each artefact ("" for "none", e.g. no adapter).
        content_digest: SHA-256 hex of the canonicalised messages + tools of the prefix
            (compared after the versions, so a tool-set change reports ``toolset_digest``
            first).
        policy_revision: security policy revision in force (integer, grows on each policy change
            or revocation; an integer so that no name can leak into logs).
        authorization_epoch: authorization state of the namespace (integer, grows on revocation).
        cache_epoch: global cache generation (integer, advanced to invalidate everything).
    """

    scope: str
    namespace: str
    model_digest: str
    tokenizer_digest: str
    runtime_digest: str
    adapter_digest: str
    prompt_bundle_digest: str
    toolset_digest: str
    content_digest: str
    policy_revision: int
    authorization_epoch: int
    cache_epoch: int

    def __post_init__(self) -> None:
        assert self.scope in SCOPES, f"unknown scope {self.scope!r}"

    def short(self, key: bytes) -> dict[str, Any]:
        """Log form: namespace digest, keyed content digest, 12-hex version digests, epochs.
        Never the namespace itself, never a raw id."""
        return {
            "scope": self.scope,
            "namespace_digest": namespace_digest(self.namespace),
            "content_digest": log_content_digest(key, self.content_digest),
            "model_digest": short_digest(self.model_digest),
            "tokenizer_digest": short_digest(self.tokenizer_digest),
            "runtime_digest": short_digest(self.runtime_digest),
            "adapter_digest": short_digest(self.adapter_digest),
            "prompt_bundle_digest": short_digest(self.prompt_bundle_digest),
            "toolset_digest": short_digest(self.toolset_digest),
            "policy_revision": self.policy_revision,
            "authorization_epoch": self.authorization_epoch,
            "cache_epoch": self.cache_epoch,
        }


assert tuple(f.name for f in fields(CacheIdentity)) == IDENTITY_FIELDS


@dataclass(frozen=True, slots=True)
class Decision:
    """Outcome of :func:`check_acceptance`.

    Attributes:
        outcome: ``accept`` or ``reject``.
        first_mismatch: the first mismatching field in :data:`IDENTITY_FIELDS` order, or None.
        mismatches: every mismatching field, in that order (empty when accepted).
    """

    outcome: str
    first_mismatch: str | None = None
    mismatches: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        """True when the candidate may be used."""
        return self.outcome == "accept"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))
    return type(a) is type(b) and a == b


def check_acceptance(expected: CacheIdentity, candidate: CacheIdentity) -> Decision:
    """Accept a cached candidate only if every identity field equals the expected one (note 5).

    Args:
        expected: the tuple resolved from the authorised request (its scope, namespace, the
            versions in force, the request's authorization epoch, the cache epoch).
        candidate: the identity the cached object was stored with.

    Returns:
        ``Decision("accept")``, or ``Decision("reject", first_mismatch, mismatches)`` naming the
        first mismatching field and all of them, in :data:`IDENTITY_FIELDS` order.
    """
    mismatches = tuple(name for name in IDENTITY_FIELDS
                       if not _same(getattr(expected, name), getattr(candidate, name)))
    if not mismatches:
        return Decision("accept")
    return Decision("reject", mismatches[0], mismatches)


def reason_class(reason: str | None) -> str | None:
    """``cross_scope``, ``version``, ``generation``, ``collision`` (content digest) or None."""
    if reason is None:
        return None
    if reason in SCOPE_FIELDS or reason == "salt":
        return "cross_scope"
    if reason in VERSION_FIELDS:
        return "version"
    if reason in GENERATION_FIELDS:
        return "generation"
    if reason == "content_digest":
        return "collision"
    raise ValueError(f"unknown reason {reason!r}")


# --------------------------------------------------------------------------- salts

def validate_cache_salt(salt: str | None) -> None:
    """Raise ValueError unless ``salt`` is valid for vLLM (note 4): absent, or a non-empty
    string of at most 128 characters without ``@``, ``/``, ``\\`` or NUL
    (``validate_cache_salt`` in ``vllm/entrypoints/generate/base/protocol.py``, 0.33 / 0.32)."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise ValueError("cache_salt must be a non-empty string")
    if len(salt) > SALT_MAX_CHARS:
        raise ValueError(f"cache_salt has {len(salt)} characters; vLLM allows {SALT_MAX_CHARS}")
    for ch in _SALT_FORBIDDEN:
        if ch in salt:
            raise ValueError(f"cache_salt contains a forbidden character {ch!r}")


def salt_generation(*, model_digest: str, tokenizer_digest: str, adapter_digest: str,
                    prompt_bundle_digest: str, toolset_digest: str, policy_revision: int,
                    authorization_epoch: int) -> str:
    """The ``generation`` of :func:`derive_salt`: SHA-256 hex over the versions that shape the
    tokens (model, tokenizer, adapter, prompt bundle with the request's render options,
    toolset), the policy revision and the namespace's *current* authorization epoch, joined
    by NUL. One rule for the live gateway and its replay model: two requests whose identities
    differ in any of these are sent under different salts, so vLLM's block hashes keep them
    apart even for a PUBLIC prefix."""
    return sha256_hex("\x00".join([model_digest, tokenizer_digest, adapter_digest,
                                   prompt_bundle_digest, toolset_digest, str(policy_revision),
                                   str(authorization_epoch)]))


def derive_salt(key: bytes, *, scope: str, namespace: str, cache_epoch: int,
                runtime_digest: str, generation: str = "") -> str:
    """The ``cache_salt`` a request is forwarded with (note 3).

    TENANT / PRINCIPAL: ``ps1-`` + HMAC-SHA256 hex over (namespace, cache epoch, runtime digest).
    PUBLIC: the same over (the PUBLIC namespace, cache epoch, runtime digest) — one shared salt
    per generation; callers give PUBLIC only to prompts approved by :class:`PublicInventory`.
    ``generation`` (the live gateway: a digest of the other versions, the policy revision and the
    current authorization epoch, "whatever else of the identity must split physical reuse" in
    ``cache-identity.md``) joins the HMAC only when non-empty, so salts without it are unchanged.

    Returns:
        A 68-character salt, valid for vLLM (asserted).
    """
    assert scope in SCOPES
    parts = (scope, namespace, str(int(cache_epoch)), runtime_digest) + (
        (generation,) if generation else ())
    salt = SALT_PREFIX + _hmac_hex(key, "prefixscope/salt/v1", *parts)
    validate_cache_salt(salt)
    return salt


# --------------------------------------------------------------------------- public inventory

@dataclass(frozen=True, slots=True)
class PublicInventory:
    """The approved public-data inventory: SHA-256 digests of approved message contents and
    tool sets (:func:`message_digest`, :func:`toolset_digest`).

    File format (text, UTF-8): one entry per line, ``sha256:<64 hex>`` optionally followed by
    whitespace and a label; ``#`` starts a comment; blank lines ignored.
    """

    digests: frozenset[str] = frozenset()
    source: str | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> PublicInventory:
        """Read an inventory file.

        Raises:
            ConfigError: unreadable file, or a line that is not ``sha256:<64 hex>`` (names the
                file and line).
        """
        from prefixscope.core.documents import DocumentError, read_document

        try:
            text = read_document(path)
        except DocumentError as exc:
            prefix = "cannot read public inventory: " if exc.unreadable else ""
            raise ConfigError(f"{path}: {prefix}{exc}") from None
        found: set[str] = set()
        for lineno, line in enumerate(text.splitlines(), 1):
            entry = line.split("#", 1)[0].strip()
            if not entry:
                continue
            token = entry.split()[0]
            hexpart = token.removeprefix("sha256:")
            if not token.startswith("sha256:") or len(hexpart) != 64 or any(
                    c not in "0123456789abcdef" for c in hexpart):
                raise ConfigError(f"{path}:{lineno}: expected 'sha256:<64 lowercase hex>'")
            found.add(hexpart)
        return cls(frozenset(found), str(path))

    def approves(self, digests: Iterable[str]) -> bool:
        """True when every given digest is on the inventory (and there is at least one)."""
        ds = list(digests)
        return bool(ds) and all(d in self.digests for d in ds)


def resolve_scope(auth_scope: str, message_digests: Sequence[str], tools_digest: str | None,
                  inventory: PublicInventory, render: str | None = None) -> str:
    """Scope of a request: PUBLIC only when every source of the prompt is on the inventory:
    every message, the tool set and, when the request sets any :data:`RENDER_FIELDS`
    (``documents``, ``chat_template_kwargs``...), their :func:`render_digest` ``render``
    (never inferred from content); otherwise the scope of the authentication context."""
    assert auth_scope in (TENANT, PRINCIPAL), "auth scope comes from the trusted context"
    parts = (list(message_digests) + ([tools_digest] if tools_digest else [])
             + ([render] if render else []))
    return PUBLIC if inventory.approves(parts) else auth_scope


# --------------------------------------------------------------------------- the gate

@dataclass(frozen=True, slots=True)
class GateOp:
    """One linearised gate operation (for audits and tests): sequence number, kind
    (``permit`` or ``revoke``), namespace digest, epoch seen, success."""

    seq: int
    kind: str
    namespace_digest: str
    epoch: int
    ok: bool


@dataclass
class AuthorizationGate:
    """Linearizable gate between authorization-epoch revocations and KV use-permits (note 6).

    Each namespace has an authorization epoch (starts at ``initial_epoch``). Under one lock:
    :meth:`revoke` advances it (compare-and-set from the epoch the revoker saw, retried by the
    caller if it moved) and :meth:`acquire_permit` succeeds only while the epoch still equals
    the one the request was authorised at. Whichever takes the lock first wins; a permit is
    never granted at an epoch a revocation has already left.
    """

    initial_epoch: int = 1
    _epochs: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seq: int = 0
    log: list[GateOp] = field(default_factory=list)
    keep_log: bool = True

    def current(self, namespace: str) -> int:
        """Current authorization epoch of a namespace."""
        with self._lock:
            return self._epochs.get(namespace, self.initial_epoch)

    def _record(self, kind: str, namespace: str, epoch: int, ok: bool) -> None:
        self._seq += 1
        if self.keep_log:
            self.log.append(GateOp(self._seq, kind, namespace_digest(namespace), epoch, ok))

    def revoke(self, namespace: str, *, from_epoch: int | None = None) -> int | None:
        """Advance the namespace's epoch by one. With ``from_epoch``, only if the epoch still is
        that value (compare-and-set). Returns the new epoch, or None when the CAS failed."""
        with self._lock:
            cur = self._epochs.get(namespace, self.initial_epoch)
            if from_epoch is not None and cur != from_epoch:
                self._record("revoke", namespace, cur, False)
                return None
            self._epochs[namespace] = cur + 1
            self._record("revoke", namespace, cur, True)
            return cur + 1

    def acquire_permit(self, namespace: str, epoch: int) -> bool:
        """Take a use-permit for cached KV of ``namespace`` for a request authorised at
        ``epoch``. True only if no revocation has advanced the epoch since."""
        with self._lock:
            cur = self._epochs.get(namespace, self.initial_epoch)
            ok = cur == epoch
            self._record("permit", namespace, epoch, ok)
            return ok
