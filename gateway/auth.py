"""Trusted identity: API keys (a file of SHA-256 digests) or headers from a trusted proxy.

The scope and the ids come from here only, never from the request body
(``cache-identity.md#scope``). Two sources, checked in this order:

1. ``Authorization: Bearer <key>`` or ``x-api-key: <key>``: the SHA-256 hex of the key is
   looked up in the API key file (TOML, ``[[key]]`` tables with ``sha256``, ``tenant``,
   optional ``principal``, ``scope`` = TENANT (default) or PRINCIPAL, and ``epoch`` = the
   authorization epoch the key was issued at; without ``epoch`` the key follows the current one).
2. When the client address is inside one of ``trusted_proxies`` (CIDRs): the tenant, principal,
   scope and epoch headers (``x-prefixscope-*`` by default). From any other address those
   headers are ignored.

The raw key and raw ids stay in memory; logs get namespace digests only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prefixscope.core.documents import DocumentError, parse_toml, read_document
from prefixscope.core.errors import ConfigError
from prefixscope.core.identity import PRINCIPAL, TENANT


@dataclass(frozen=True, slots=True)
class AuthContext:
    """The trusted authentication context of one request.

    Attributes:
        tenant_id, principal_id: raw ids (never logged).
        scope: TENANT or PRINCIPAL.
        epoch: authorization epoch the credential was issued at, or None (current).
        source: ``api_key`` or ``trusted_proxy``.
    """

    tenant_id: str
    principal_id: str | None
    scope: str
    epoch: int | None
    source: str


#: An authorization epoch header: ASCII digits only (``str.isdigit`` also takes ``²`` and
#: other Unicode digits, which ``int`` refuses), at most 18 (below 2^63).
_EPOCH = re.compile(r"[0-9]{1,18}")


class BadIdentityHeader(ValueError):
    """A trusted proxy's identity header holds a value that is not one (``header``: its
    name; the message never quotes the value). The gateway answers 400."""

    def __init__(self, header: str, reason: str) -> None:
        super().__init__(f"{header}: {reason}")
        self.header = header


@dataclass(frozen=True, slots=True)
class _KeyEntry:
    tenant: str
    principal: str | None
    scope: str
    epoch: int | None


def key_digest(api_key: str) -> str:
    """SHA-256 hex of an API key (what the key file stores)."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def load_api_keys(path: str | None) -> dict[str, _KeyEntry]:
    """Read the API key file (module docstring). Returns digest -> entry.

    Raises:
        ConfigError: unreadable, invalid TOML, or an entry without a 64-hex ``sha256`` or a
            ``tenant`` (names the entry index, never a key).
    """
    if path is None:
        return {}
    try:
        data = parse_toml(read_document(path))
    except DocumentError as exc:
        if exc.unreadable:
            raise ConfigError(f"{path}: cannot read the API key file: {exc}") from None
        raise ConfigError(f"{path}: {exc}") from None
    out: dict[str, _KeyEntry] = {}
    for i, e in enumerate(data.get("key", [])):
        digest = str(e.get("sha256", "")).removeprefix("sha256:")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(f"{path}: key[{i}].sha256: expected 64 lowercase hex")
        tenant = e.get("tenant")
        if not isinstance(tenant, str) or not tenant:
            raise ConfigError(f"{path}: key[{i}].tenant: missing")
        scope = str(e.get("scope", TENANT)).upper()
        principal = e.get("principal")
        if scope not in (TENANT, PRINCIPAL) or (scope == PRINCIPAL and not principal):
            raise ConfigError(f"{path}: key[{i}].scope: TENANT, or PRINCIPAL with a principal")
        epoch = e.get("epoch")
        if epoch is not None and (not isinstance(epoch, int) or epoch < 0):
            raise ConfigError(f"{path}: key[{i}].epoch: must be an integer >= 0")
        out[digest] = _KeyEntry(tenant, principal, scope, epoch)
    return out


class Authenticator:
    """Resolves the :class:`AuthContext` of a request from its headers and client address."""

    def __init__(self, *, api_keys: Mapping[str, _KeyEntry], trusted_proxies: list[str],
                 tenant_header: str, principal_header: str, scope_header: str,
                 epoch_header: str) -> None:
        self.api_keys = dict(api_keys)
        self._seen: dict[str, _KeyEntry] = {}
        try:
            self.proxies = [ipaddress.ip_network(c, strict=False) for c in trusted_proxies]
        except ValueError as exc:
            raise ConfigError(f"[gateway] trusted_proxies: {exc}") from None
        self.h_tenant, self.h_principal = tenant_header.lower(), principal_header.lower()
        self.h_scope, self.h_epoch = scope_header.lower(), epoch_header.lower()
        self._identity_names = frozenset(
            h.encode("latin-1") for h in (self.h_tenant, self.h_principal, self.h_scope,
                                          self.h_epoch))

    def check_repeats(self, raw_headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Refuse a request that repeats an identity header (the ASGI scope's raw list keeps
        repeats; a mapping keeps one of them): any ``x-prefixscope-*`` header or a configured
        identity header name, compared case-insensitively. A trusted proxy that appends
        instead of replacing would otherwise let the client's own value win (the first one
        was used: a client picked its tenant, or made a stale credential current).

        Raises:
            BadIdentityHeader: the first repeated name (the values are never quoted).
        """
        seen: set[bytes] = set()
        for k, _v in raw_headers:
            name = k.lower()
            if not (name.startswith(b"x-prefixscope-") or name in self._identity_names):
                continue
            if name in seen:
                raise BadIdentityHeader(name.decode("latin-1"), "repeated: an identity "
                                        "header must appear once")
            seen.add(name)

    def tenants(self) -> frozenset[str]:
        """The tenant ids of the API key file (trusted-proxy tenants are not known ahead)."""
        return frozenset(e.tenant for e in self.api_keys.values())

    def _trusted(self, client_host: str | None) -> bool:
        if not client_host or not self.proxies:
            return False
        try:
            addr = ipaddress.ip_address(client_host)
        except ValueError:
            return False
        return any(addr in net for net in self.proxies)

    def authenticate(self, headers: Mapping[str, str], client_host: str | None
                     ) -> AuthContext | None:
        """The trusted context, or None (no valid credential: the caller answers 401).

        Raises:
            BadIdentityHeader: from a trusted proxy, an epoch header that is present but not
                1-18 ASCII digits, empty included (a malformed epoch is never read as
                "current": that would make a stale credential current).
        """
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
        if key:
            # a digest lookup: the key itself is never compared, so timing reveals nothing of it
            # (the digest of a key already seen valid is remembered: one SHA-256 per key, not
            # per request; unknown keys are not remembered, so the cache stays bounded by the
            # key file)
            entry = self._seen.get(key)
            if entry is None:
                entry = self.api_keys.get(key_digest(key))
                if entry is not None and len(self._seen) < 4 * len(self.api_keys) + 16:
                    self._seen[key] = entry
            if entry is not None:
                return AuthContext(entry.tenant, entry.principal, entry.scope, entry.epoch,
                                   "api_key")
        if self._trusted(client_host):
            tenant = headers.get(self.h_tenant)
            if not tenant:
                return None
            principal = headers.get(self.h_principal) or None
            scope = (headers.get(self.h_scope) or TENANT).upper()
            if scope not in (TENANT, PRINCIPAL) or (scope == PRINCIPAL and not principal):
                return None
            raw_epoch = headers.get(self.h_epoch)
            epoch = None
            if raw_epoch is not None:  # present, even empty: never read as "current"
                if not _EPOCH.fullmatch(raw_epoch):
                    raise BadIdentityHeader(self.h_epoch, "must be an authorization epoch: 1 "
                                            "to 18 ASCII digits")
                epoch = int(raw_epoch)
            return AuthContext(tenant, principal, scope, epoch, "trusted_proxy")
        return None
