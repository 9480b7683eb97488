"""The gateway: an OpenAI-compatible reverse proxy that applies cache identity (docs/gateway.md).

Per request to ``/v1/chat/completions``, ``/v1/completions`` or ``/v1/messages``:

1. **Authenticate** (``gateway/auth.py``): no trusted context -> 401, nothing forwarded.
2. **Read and check the body**: above ``max_body_bytes`` -> 413 ``too_large``; not a JSON
   object or without the fields the endpoint needs -> 400 ``bad_request``; a model no upstream
   serves -> 404 ``unknown_model``. Each of these still writes one decision record (with
   ``error``) so nothing is lost from the logs.
3. **Resolve the identity** (``prefixscope.core.identity``): scope (PUBLIC only in mode
   ``public``, before ``stop public`` and for prompts whose every message and tool set are on
   the inventory; else the context's TENANT or PRINCIPAL), namespace (HMAC), the versions of
   the model (``gateway/upstream.py``), prompt bundle, toolset, policy revision, the
   credential's authorization epoch and the cache epoch; one expected identity per prefix
   boundary (``gateway/prompt.py``).
4. **Look up** the candidate: a presented ``x-prefixscope-cache-handle`` (untrusted: compared in
   full like any other), else the deepest boundary found in the registry.
5. **Check acceptance** (``check_acceptance``), then take a CacheUsePermit from the gate for the
   credential's epoch. A reject (every mismatching field logged), a stale credential or a lost
   permit race is forwarded under a salt unique to the request, so vLLM reads nothing cached
   and writes nothing anybody else can reach; an accept or a miss goes with the derived salt
   (:func:`derive_salt`: namespace, cache epoch, runtime digest and the digest of the other
   versions, so vLLM's own block hashes keep namespaces and generations apart). A client's
   ``cache_salt`` is always replaced (``client_salt_replaced``).
6. **Forward** over the pooled upstream client (``gateway/upstream_client.py``); the answer is
   passed through byte for byte, except that a stream whose client did not ask for usage gets
   ``stream_options.include_usage`` and the extra usage chunk is kept from that client.
7. **Record**: one usage-log record (the shape ``ingest requests`` reads) when the upstream
   reported usage, one decision record (``ingest decisions``), the registry entries of a
   request forwarded with its derived salt (a reject registers nothing and forgets the
   mismatching entries of its own keys: the registry never names blocks the engine did not
   store under that salt), metrics; the permit is released in every case.

Modes: ``shadow`` computes and logs every decision but forwards every request isolated;
``tenant`` enables TENANT/PRINCIPAL reuse; ``public`` also PUBLIC. The admin endpoints
(``/admin/*``, loopback and bearer token) bump the cache epoch, revoke a namespace, stop public
sharing and switch the bypass (every request isolated); turning the bypass off advances the cache
epoch, so an old generation is never used again.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import itertools
import json
import logging
import re
import secrets
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prefixscope.core import decision
from prefixscope.core.bounds import MAX_COUNT, TOO_DEEP, escape_line, json_too_deep
from prefixscope.core.decision_log import DecisionRecord, candidate_tokens, event_record
from prefixscope.core.identity import (
    PUBLIC,
    CacheIdentity,
    Decision,
    PublicInventory,
    namespace_digest,
    namespace_for,
    prefix_digests,
    reason_class,
    render_digest,
)
from prefixscope.gateway.auth import AuthContext, Authenticator, BadIdentityHeader
from prefixscope.gateway.config import GatewayConfig
from prefixscope.gateway.logs import JsonlLog
from prefixscope.gateway.metrics import GatewayMetrics
from prefixscope.gateway.prompt import BadBody, CanonicalCache, extract
from prefixscope.gateway.tokens import block_chain, shared_tokens, tokenize_request
from prefixscope.gateway.store import STORE_ERRORS, MemoryStore, StoredObject
from prefixscope.gateway.upstream import ModelInfo, discover
from prefixscope.gateway.upstream_client import UpstreamError, UpstreamPool
from prefixscope.ingest.usage_shapes import normalise_usage

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
             "/v1/messages": "messages"}
HANDLE_HEADER = "x-prefixscope-cache-handle"
REQUEST_ID_HEADER = "x-prefixscope-request-id"
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "te",
                  "trailer", "upgrade", "proxy-authenticate", "proxy-authorization"})
# not passed on from the upstream: hop-by-hop headers, and date and server, which uvicorn
# writes on every response itself (passing the upstream's gave two of each)
_DROP = _HOP | {"date", "server"}
_HOP_B = frozenset(h.encode() for h in _DROP)
_VERSION_FIELDS = ("model_digest", "tokenizer_digest", "runtime_digest", "adapter_digest",
                   "prompt_bundle_digest", "toolset_digest", "content_digest", "policy_revision")


@dataclass
class Faults:
    """Failure injection for tests (never set by the CLI): ``between_lookup_and_permit`` is
    awaited with the namespace after the lookup and before the permit (a revocation there);
    ``lookup_key`` replaces the registry key function (forced collisions)."""

    between_lookup_and_permit: Callable[[str], Awaitable[None]] | None = None
    lookup_key: Callable[[str, str], bytes] | None = None  # e.g. a deliberately weak hash


#: The 400 message for valid JSON with a number past the double range (``1e999``): no value
#: is quoted (it could be anywhere in the prompt).
NUMBER_OUT_OF_RANGE = ("body has a number out of range (its magnitude is above 1.8e308, the "
                       "largest finite double)")

#: Bodies from this size on get their prefix digests computed on a worker thread.
_DIGEST_THREAD_BYTES = 64 << 10

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
#: What the upstream client raises for a failed or cut upstream request.
_UPSTREAM_ERRORS = (UpstreamError, TimeoutError, OSError)
_DISCONNECTED = object()  # _prepare: the client went away while sending its body
_log = logging.getLogger("prefixscope.gateway")


def _error_body(code: str, message: str) -> bytes:
    return _encode({"error": {"message": message, "type": "gateway_error", "code": code}})


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "gateway_error", "code": code}},
                        status_code=status)


#: Refusals after which the connection is closed: the rest of the body is not read.
_CLOSE_AFTER = frozenset({408, 413})
#: Refusals of a bound (size, time, load): they carry ``retry-after`` and log one line.
_BOUND_CODES = frozenset({"too_large", "client_timeout", "overloaded"})


async def _send_error(send, status: int, code: str, message: str,
                      retry_after_s: int | None = None) -> None:
    body = _error_body(code, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status in _CLOSE_AFTER or code == "overloaded":  # uvicorn closes after this response
        headers.append((b"connection", b"close"))
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _sse_error(code: str, message: str) -> bytes:
    return b"data: " + json.dumps({"error": {"message": message, "type": "gateway_error",
                                             "code": code}}).encode() + b"\n\n"


def _rewrite(raw: bytes, body: dict, salt: str, add_usage: bool) -> bytes:
    """The outgoing body: the client's bytes untouched except ``cache_salt`` (always set) and,
    when ``add_usage``, ``stream_options.include_usage``. When the client sent neither key the
    two members are appended before the closing brace (the client's bytes are kept as they
    are); else the decoded object is re-encoded with the fields set (a client's ``cache_salt``
    is replaced, never left beside ours)."""
    if "cache_salt" in body or (add_usage and "stream_options" in body):
        body["cache_salt"] = salt
        if add_usage:
            so = body.get("stream_options")
            body["stream_options"] = {**(so if isinstance(so, dict) else {}),
                                      "include_usage": True}
        return _encode(body)
    end = raw.rstrip(b" \t\r\n")  # a JSON object with at least "model": ends with "}"
    extra = b',"cache_salt":' + _encode(salt)
    if add_usage:
        extra += b',"stream_options":{"include_usage":true}'
    return end[:-1] + extra + b"}"


@dataclass(slots=True)
class _Call:
    """Per-request state collected for the records."""

    rid: str
    endpoint: str
    ts: float
    t0: float
    auth: AuthContext
    scope: str = ""
    ns: str = ""
    model: str | None = None
    decision: Decision | None = None
    expected: CacheIdentity | None = None
    candidate: StoredObject | None = None
    salt_applied: bool = False
    bypass: bool = False  # /admin/bypass was on: forwarded isolated, nothing accepted for use
    client_salt: bool = False
    error: str | None = None
    status: int = 0
    usage: dict | None = None
    ttft_s: float | None = None
    permit: bool = False
    register: list[tuple[bytes, StoredObject]] = field(default_factory=list)
    forget: list[tuple[bytes, str]] = field(default_factory=list)  # (key, writer request id)
    block_size: int = 16
    upstream: str | None = None
    streaming: bool = False
    finished: bool = False
    message: str = ""
    tokens_task: asyncio.Future | None = None
    blocks: bytes | None = None
    task: asyncio.Task | None = None  # the request's task (cut at the shutdown deadline)
    resp: Any = None  # the upstream answer being streamed
    body_bytes: int = 0  # of body_bytes_in_flight, this request's (released when it ends)


class Gateway:
    """The gateway's state and its Starlette app (:attr:`app`).

    Args:
        cfg: the configuration.
        key: the HMAC key (``load_hmac_key``).
        store: ``MemoryStore`` or ``RedisStore`` (``gateway/store.py``).
        inventory: the approved public inventory.
        authenticator: resolves trusted contexts.
        admin_token: the admin bearer token, or None (admin endpoints off).
        faults: test hooks.
    """

    def __init__(self, cfg: GatewayConfig, key: bytes, *, store, inventory: PublicInventory,
                 authenticator: Authenticator, admin_token: str | None = None,
                 faults: Faults | None = None) -> None:
        self.cfg = cfg
        self.key = key
        self.store = store
        self.inventory = inventory
        self.auth = authenticator
        self.admin_token = admin_token
        self.faults = faults or Faults()
        self.metrics = GatewayMetrics(cfg.metrics_namespace_labels)
        self.models: dict[str, ModelInfo] = {}
        self._rr = itertools.count()
        self._last_discovery = 0.0
        #: per upstream base URL: the last discovery's outcome (:meth:`upstream_states`)
        self.upstream_state: dict[str, dict[str, Any]] = {}
        self.client: httpx.AsyncClient | None = None
        self.usage_log: JsonlLog | None = None
        self.decision_log: JsonlLog | None = None
        self.in_flight = 0
        #: request body bytes held by requests in flight (bounded by max_inflight_body_bytes)
        self.body_bytes_in_flight = 0
        self._calls: dict[int, _Call] = {}  # requests in flight, for the shutdown deadline
        self._drain_timer: asyncio.TimerHandle | None = None
        self._drain_t0: float | None = None  # drain() began (monotonic s)
        self._cut = 0  # requests ended by the gateway at the shutdown deadline
        # request ids and isolating salts: a random per-process prefix and a counter (unique,
        # and cheaper than uuid4/urandom per request)
        self._id_prefix = secrets.token_hex(6)
        self._ids = itertools.count(1)
        self._ns_cache: dict[tuple, str] = {}
        self._salt_cache: dict[decision.SaltInputs, str] = {}
        self._canonical = CanonicalCache()  # canonical_json of recurring messages and tools
        self._short_cache: dict[CacheIdentity, dict] = {}  # CacheIdentity.short (a keyed HMAC)
        # the handle HMAC keyed once; each handle is a copy fed the rest (same digest as
        # hmac.new(key, b"handle" + ...), without re-keying per request)
        self._handle_mac = decision.handle_mac(key)
        self._public_ns = namespace_for(key, scope=PUBLIC)
        self.session: UpstreamPool | None = None
        self.app = self  # the ASGI app (:meth:`__call__`)
        self.starlette = Starlette(routes=[
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/admin/state", self.admin, methods=["GET"]),
            Route("/admin/cache-epoch/bump", self.admin, methods=["POST"]),
            Route("/admin/revoke", self.admin, methods=["POST"]),
            Route("/admin/public/stop", self.admin, methods=["POST"]),
            Route("/admin/bypass", self.admin, methods=["POST"]),
        ], lifespan=self._lifespan)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the upstream pool and the logs, discover the upstreams."""
        c = self.cfg
        # the hot path: gateway/upstream_client.py (keep-alive pool on raw asyncio, httptools'
        # C parser, no cookie jar: an upstream's Set-Cookie reaches its client only);
        # discovery and /v1/models: httpx
        self.session = UpstreamPool(limit=c.pool_size, connect_timeout_s=c.connect_timeout_s,
                                    read_timeout_s=c.read_timeout_s)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=c.connect_timeout_s, read=c.read_timeout_s,
                                  write=c.read_timeout_s, pool=c.connect_timeout_s),
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=8))
        log_dir = Path(c.log_dir)
        kw = dict(rotate_bytes=c.rotate_bytes, keep=c.rotate_keep,
                  fsync_interval_s=c.fsync_interval_s)
        self.usage_log = JsonlLog(log_dir / "usage.jsonl", **kw)
        self.decision_log = JsonlLog(log_dir / "decisions.jsonl", **kw)
        await self.rediscover(force=True)
        print(await self.startup_text(), file=sys.stderr, flush=True)

    async def startup_text(self) -> str:
        """The startup lines printed on stderr: listen address, mode, then per upstream what
        discovery found (models, runtime and where its digest came from) or its error; a
        stopped PUBLIC generation in mode ``public`` is a warning."""
        c = self.cfg
        lines = [f"prefixscope gateway: listening on http://{c.host}:{c.port} (mode {c.mode}, "
                 f"instance {c.instance}), {len(c.upstreams)} upstream(s)"]
        for st in self.upstream_states():
            if st["ok"]:
                src = ("declared in [gateway.declared]" if c.declared.runtime_digest
                       else "GET /version + vllm:cache_config_info of /metrics")
                lines.append(f"  upstream {st['url']}: ok, models {', '.join(st['models']) or '(none)'}"
                             f"; runtime {st['runtime']} (runtime digest: {src})")
            else:
                lines.append(f"  upstream {st['url']}: UNREACHABLE: {st['error']} (requests get "
                             "503 upstream_error until it answers; /health says unhealthy)")
        for w in await self.warnings():
            lines.append(f"  warning: {w}")
        return "\n".join(lines)

    async def warnings(self) -> list[str]:
        """Operator warnings (startup line, ``/health``): PUBLIC stopped by an earlier
        ``/admin/public/stop`` in mode ``public`` (one way: old generations are never
        re-enabled, docs/gateway.md#rollout-and-rollback)."""
        if self.cfg.mode != "public":
            return []
        try:
            gen = await self.store.generation()
        except STORE_ERRORS:
            return ["the shared store did not answer: PUBLIC sharing state unknown"]
        if gen.public_stopped:
            return ["mode public, but PUBLIC sharing was stopped by an earlier "
                    "/admin/public/stop saved in the state: requests use TENANT/PRINCIPAL "
                    "scope only (one way; docs/gateway.md#rollout-and-rollback)"]
        return []

    def upstream_states(self) -> list[dict[str, Any]]:
        """Per configured upstream, config order: ``url``, ``ok`` (the last discovery read its
        ``/v1/models``), ``models``, ``runtime``, ``error`` (None when ok), ``checked_unix_s``."""
        return [self.upstream_state.get(b.rstrip("/"), {
            "url": b.rstrip("/"), "ok": False, "models": [], "runtime": None,
            "error": "not checked yet", "checked_unix_s": None}) for b in self.cfg.upstreams]

    async def stop(self) -> None:
        """Flush and close the logs, the pool and the store (after in-flight requests ended)."""
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        for log in (self.usage_log, self.decision_log):
            if log is not None:
                log.close()
        if self._drain_t0 is not None:  # once: the end of the shutdown grace
            t0, self._drain_t0 = self._drain_t0, None
            self._say(f"shut down after {time.monotonic() - t0:.1f} s: "
                      f"{self._cut} request(s) ended at the deadline (gateway_shutdown), "
                      "the others finished; logs flushed")
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.client is not None:
            await self.client.aclose()
        await self.store.close()

    def _lifespan(self, app):
        gw = self

        class _Ctx:
            async def __aenter__(self):
                await gw.start()

            async def __aexit__(self, *exc):
                await gw.stop()

        return _Ctx()

    async def rediscover(self, *, force: bool = False) -> None:
        """Re-read every upstream's models (at most every 5 s unless forced; each upstream's
        discovery bounded by :data:`DISCOVERY_TIMEOUT_S`); records each upstream's outcome in
        :attr:`upstream_state`."""
        now = time.monotonic()
        if not force and now - self._last_discovery < 5.0:
            return
        self._last_discovery = now
        found: dict[str, ModelInfo] = {}
        for base in self.cfg.upstreams:
            url = base.rstrip("/")
            try:
                infos = await asyncio.wait_for(
                    discover(self.client, url, self.cfg.declared, self.cfg.block_size),
                    DISCOVERY_TIMEOUT_S)
            except (httpx.HTTPError, ValueError, TypeError, AttributeError, TimeoutError,
                    asyncio.TimeoutError) as exc:  # TypeError/AttributeError: not a model list
                self.metrics.upstream_errors.labels("discovery").inc()
                self.upstream_state[url] = {
                    "url": url, "ok": False,
                    "models": self.upstream_state.get(url, {}).get("models", []),
                    "runtime": None, "error": _discovery_error(url, exc),
                    "checked_unix_s": round(time.time(), 3)}
                continue
            self.upstream_state[url] = {
                "url": url, "ok": True, "models": sorted(i.model for i in infos),
                "runtime": infos[0].runtime if infos else None, "error": None,
                "checked_unix_s": round(time.time(), 3)}
            for info in infos:
                if info.model in found:
                    found[info.model].upstreams.extend(info.upstreams)
                else:
                    found[info.model] = info
        if found or force:
            self.models = found

    # ------------------------------------------------------------------ small endpoints

    async def health(self, request: Request) -> Response:
        """``200 {"status": "ok", ...}`` when at least one upstream answered its last discovery
        (re-checked at most every 5 s, :meth:`rediscover`), else ``503 {"status":
        "unhealthy", ...}``; both with ``models``, ``upstreams`` (:meth:`upstream_states`)
        and ``warnings``."""
        await self.rediscover()
        states = self.upstream_states()
        ok = any(st["ok"] for st in states)
        return JSONResponse({"status": "ok" if ok else "unhealthy", "models": sorted(self.models),
                             "upstreams": states, "warnings": await self.warnings()},
                            status_code=200 if ok else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        try:
            self.metrics.permits.set(await self.store.permits_in_flight())
            self.metrics.cache_epoch.set((await self.store.generation()).cache_epoch)
        except STORE_ERRORS:  # the gauges keep their last values; the counters still answer
            self.metrics.upstream_errors.labels("store").inc()
        return Response(self.metrics.exposition(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def list_models(self, request: Request) -> Response:
        try:
            self.auth.check_repeats(request.scope["headers"])
            auth = self.auth.authenticate(request.headers, _client_host(request))
        except BadIdentityHeader as exc:
            return _error(400, "bad_request", str(exc))
        if auth is None:
            return _error(401, "unauthorized", "no valid API key or trusted proxy identity")
        bases = self.cfg.upstreams
        if len(bases) == 1:
            try:
                r = await self.client.get(bases[0].rstrip("/") + "/v1/models")
            except httpx.HTTPError as exc:
                self.metrics.upstream_errors.labels(_kind(exc)).inc()
                return _error(502, _kind(exc), f"upstream /v1/models failed: {type(exc).__name__}")
            return Response(r.content, status_code=r.status_code, headers={
                k: v for k, v in r.headers.items() if k.lower() not in _DROP})
        await self.rediscover()
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": "vllm"} for m in sorted(self.models)]})

    # ------------------------------------------------------------------ admin

    async def admin(self, request: Request) -> Response:
        try:
            return await self._admin(request)
        except STORE_ERRORS:
            self.metrics.upstream_errors.labels("store").inc()
            return _error(503, "store_unavailable", "the shared store did not answer; check "
                          "GET /admin/state before retrying")

    async def _admin(self, request: Request) -> Response:
        if self.admin_token is None:
            return _error(404, "not_found", "admin endpoints are off (no admin_token_file)")
        host = _client_host(request)
        if not self.cfg.admin_allow_remote and host not in ("127.0.0.1", "::1", "localhost"):
            return _error(403, "forbidden", "admin endpoints answer loopback clients only")
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.admin_token}".encode()):
            return _error(401, "unauthorized", "admin token missing or wrong")
        path = request.url.path
        raw = bytearray()
        try:
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > ADMIN_MAX_BODY_BYTES:
                    return _error(413, "too_large", f"admin body above "
                                  f"{ADMIN_MAX_BODY_BYTES:,} bytes")
        except ClientDisconnect:  # gone, or refused by the protocol (a chunk past the bound)
            return _error(499, "client_disconnected", "the client closed the connection")
        body, problem = _admin_body(bytes(raw), path)
        if problem is not None:
            return _error(400, "bad_request", problem)
        now = time.time()
        if path == "/admin/cache-epoch/bump":
            epoch = await self.store.bump_cache_epoch()
            self._event(event_record(now, "cache_epoch_bump", new_value=epoch))
            return JSONResponse({"cache_epoch": epoch})
        if path == "/admin/revoke":
            tenant = body.get("tenant")
            if not _admin_id(tenant):
                return _error(400, "bad_request", "revoke needs a tenant (and optionally "
                              "principal): a non-empty string of valid Unicode")
            if _CONTROL.search(tenant):
                return _error(400, "bad_request", "tenant holds a control character (C0, "
                              "DEL or C1): an id is printable text")
            force = body.get("force", False)
            if not isinstance(force, bool):
                return _error(400, "bad_request", "force must be true or false")
            if not force and tenant not in self.auth.tenants():
                return _error(404, "unknown_tenant", "no API key of the key file is for this "
                              "tenant; a tenant that only comes through the trusted-proxy "
                              "headers is revoked with \"force\": true")
            principal = body.get("principal")
            if principal is not None and not _admin_id(principal):
                return _error(400, "bad_request", "principal must be a non-empty string")
            if principal is not None and _CONTROL.search(principal):
                return _error(400, "bad_request", "principal holds a control character (C0, "
                              "DEL or C1): an id is printable text")
            from_epoch = body.get("from_epoch")
            if from_epoch is not None and (type(from_epoch) is not int
                                           or not 0 <= from_epoch <= MAX_COUNT):
                return _error(400, "bad_request", "from_epoch must be an integer from 0 to "
                              "2^62 (the authorization epoch the revoker saw)")
            scope = "PRINCIPAL" if principal else "TENANT"
            ns = namespace_for(self.key, scope=scope, tenant_id=tenant, principal_id=principal)
            new = await self.store.revoke(ns, from_epoch)
            if new is None:
                return _error(409, "conflict", "the authorization epoch moved (compare-and-set)")
            self._event(event_record(now, "authorization_epoch_bump",
                                     namespace_digest=namespace_digest(ns), new_value=new))
            return JSONResponse({"authorization_epoch": new,
                                 "namespace_digest": namespace_digest(ns)})
        if path == "/admin/public/stop":
            await self.store.stop_public()
            return JSONResponse({"public_stopped": True})
        if path == "/admin/bypass":
            on = body.get("on")
            if not isinstance(on, bool):
                return _error(400, "bad_request", "bypass needs {\"on\": true|false}")
            before = (await self.store.generation()).cache_epoch
            epoch = await self.store.set_bypass(on)
            if epoch != before:
                self._event(event_record(now, "cache_epoch_bump", new_value=epoch))
            return JSONResponse({"bypass": on, "cache_epoch": epoch})
        gen = await self.store.generation()
        return JSONResponse({"mode": self.cfg.mode, "cache_epoch": gen.cache_epoch,
                             "public_stopped": gen.public_stopped, "bypass": gen.bypass,
                             "permits_in_flight": await self.store.permits_in_flight(),
                             "requests_in_flight": self.in_flight})

    def _event(self, rec: dict) -> None:
        self.decision_log.write(rec)

    # ------------------------------------------------------------------ the proxy

    async def __call__(self, scope, receive, send) -> None:
        """The ASGI entry: the three proxy routes run as raw ASGI (no Starlette request,
        middleware or response objects on the hot path); everything else is the Starlette app."""
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = ENDPOINTS.get(scope["path"])
            if endpoint is not None:
                await self._proxy(scope, receive, send, endpoint)
                return
        await self.starlette(scope, receive, send)

    async def _proxy(self, scope, receive, send, endpoint: str) -> None:
        hdrs: dict[str, str] = {}
        for k, v in scope["headers"]:
            name = k.decode("latin-1")
            if name not in hdrs:  # the first of repeated headers, as Starlette's Headers.get
                hdrs[name] = v.decode("latin-1")
        client = scope.get("client")
        try:
            self.auth.check_repeats(scope["headers"])
            auth = self.auth.authenticate(hdrs, client[0] if client else None)
        except BadIdentityHeader as exc:
            self._m_client_err("bad_request").inc()
            await _send_error(send, 400, "bad_request", str(exc))
            return
        if auth is None:
            self._m_client_err("unauthorized").inc()
            await _send_error(send, 401, "unauthorized", "no valid API key or trusted proxy identity")
            return
        call = _Call(rid=f"gw-{self._id_prefix}-{next(self._ids):x}", endpoint=endpoint,
                     ts=time.time(), t0=time.perf_counter(), auth=auth)
        call.scope = auth.scope
        call.ns = self._namespace(auth)
        self.in_flight += 1
        call.task = asyncio.current_task()
        self._calls[id(call)] = call
        try:
            prepared = await self._prepare(receive, hdrs, call)
            if prepared is None:  # refused; call.error/status set
                bound = call.error in _BOUND_CODES
                if bound:  # one line per refused client: no tenant id, no request text
                    peer = "%s:%d" % tuple(client) if client else "unknown"
                    _log.warning("gateway: refused client %s: %d %s", peer, call.status,
                                 call.error)
                await _send_error(send, call.status, call.error, call.message,
                                  self.cfg.retry_after_s if bound else None)
                return
            if prepared is _DISCONNECTED:
                refused = scope.get(REFUSED_KEY)
                if refused is not None:  # the protocol answered it (server.ChunkSizes)
                    call.status, call.error, call.message = refused
                return
            await self._forward(scope, receive, send, hdrs, call, *prepared)
        except Exception as exc:  # noqa: BLE001 (a bug: a JSON 500 and a record, no traceback)
            await self._internal_error(send, call, exc)
        except asyncio.CancelledError:
            if call.error != "gateway_shutdown":
                raise
            # cut by drain() at the shutdown deadline (a request that is not a stream)
            call.task.uncancel()
            call.status = 503
            try:
                await _send_error(send, 503, "gateway_shutdown", self._shutdown_message())
            except Exception:  # noqa: BLE001 (the response had begun or the client is gone)
                pass
        finally:
            self.body_bytes_in_flight -= call.body_bytes
            call.body_bytes = 0
            self._calls.pop(id(call), None)
            if not call.finished:
                await self._finish_shielded(call)

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun (uvicorn accepts no new connection): requests still in flight
        ``grace_s`` from now are ended by the gateway, a stream with an SSE error event
        ``gateway_shutdown`` and a request waiting for its answer with ``503
        gateway_shutdown``; their decision (and usage) records say ``gateway_shutdown``."""
        self._grace_s = grace_s
        self._drain_t0 = time.monotonic()
        calls = [c for c in self._calls.values() if not c.finished]
        streams = sum(1 for c in calls if c.streaming)
        self._say(f"shutting down: {len(calls)} request(s) in flight ({streams} stream(s)), "
                  f"up to {grace_s:g} s (shutdown_grace_s)")
        self._drain_timer = asyncio.get_running_loop().call_later(grace_s, self._cut_in_flight)

    def _say(self, text: str) -> None:
        """One operator line on stderr (as the startup lines), naming the worker when
        ``workers`` > 1."""
        who = f" {self.cfg.instance}" if self.cfg.workers > 1 else ""
        print(f"prefixscope gateway{who}: {text}", file=sys.stderr, flush=True)

    def _shutdown_message(self) -> str:
        return (f"the gateway is shutting down and the request did not finish within "
                f"shutdown_grace_s ({getattr(self, '_grace_s', self.cfg.shutdown_grace_s):g} s)")

    def _cut_in_flight(self) -> None:
        for call in list(self._calls.values()):
            if call.finished:
                continue
            self._cut += 1
            call.error = "gateway_shutdown"
            if call.resp is not None:  # a stream: its read ends, _stream sends the event
                call.resp.close()
            elif call.task is not None:
                call.task.cancel()

    async def _internal_error(self, send, call: _Call, exc: Exception) -> None:
        """An unexpected exception while serving ``call``: one log line (the exception type
        and the frames, escaped onto one line; never the exception's text, which may quote the
        prompt), ``error: internal_error`` on the decision record, and a JSON 500 to the client
        (an SSE error event when its stream had begun)."""
        frames = " | ".join(f"{f.filename}:{f.lineno} in {f.name}"
                            for f in traceback.extract_tb(exc.__traceback__))
        _log.error("%s", escape_line(f"gateway: request {call.rid} failed: "
                                     f"{type(exc).__name__} at {frames}"))
        started = call.streaming
        call.error, call.status = "internal_error", call.status if started else 500
        message = (f"the gateway failed on this request ({type(exc).__name__}); its log has "
                   f"the details under request id {call.rid}")
        try:
            if started:
                await send({"type": "http.response.body",
                            "body": _sse_error("internal_error", message)})
            else:
                await _send_error(send, 500, "internal_error", message)
        except Exception:  # noqa: BLE001 (the response had begun or the client is gone)
            pass

    def _namespace(self, auth: AuthContext) -> str:
        key = (auth.scope, auth.tenant_id, auth.principal_id)
        ns = self._ns_cache.get(key)
        if ns is None:
            ns = namespace_for(self.key, scope=auth.scope, tenant_id=auth.tenant_id,
                               principal_id=auth.principal_id)
            if len(self._ns_cache) > 100_000:
                self._ns_cache.clear()
            self._ns_cache[key] = ns
        return ns

    async def _prepare(self, receive, hdrs: dict[str, str], call: _Call):
        """Steps 2-5: the body, the identity, the decision. Returns None (refused: ``call``
        has the status, code and message), :data:`_DISCONNECTED`, or (outgoing body bytes,
        model info, stream, strip_usage)."""
        chunks, size = [], 0
        limit = self.cfg.max_body_bytes
        try:
            # the whole body within client_body_timeout_s (a stalled or 1 B/s client, a
            # Content-Length above what is sent): 408 and the connection closed
            async with asyncio.timeout(self.cfg.client_body_timeout_s):
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        call.error, call.status = "client_disconnected", 499
                        return _DISCONNECTED
                    chunk = msg.get("body", b"")
                    if chunk:
                        size += len(chunk)
                        if size > limit:
                            return self._refuse(call, 413, "too_large",
                                                f"request body above {limit} bytes")
                        if (self.body_bytes_in_flight + len(chunk)
                                > self.cfg.max_inflight_body_bytes):
                            return self._refuse(
                                call, 503, "overloaded", "the gateway holds "
                                f"max_inflight_body_bytes ({self.cfg.max_inflight_body_bytes:,}"
                                f") of request bodies; retry in {self.cfg.retry_after_s} s")
                        self.body_bytes_in_flight += len(chunk)
                        call.body_bytes += len(chunk)
                        chunks.append(chunk)
                    if not msg.get("more_body", False):
                        break
        except TimeoutError:
            return self._refuse(call, 408, "client_timeout", "the request body did not arrive "
                                f"within client_body_timeout_s ({self.cfg.client_body_timeout_s:g} s)")
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        # the ingester's bound (prefixscope.core.bounds): msgspec recurses, so a body nested
        # 100,000 deep would raise RecursionError; the check is one bracket count in the
        # common case
        if (await asyncio.get_running_loop().run_in_executor(None, json_too_deep, raw)
                if len(raw) >= _DIGEST_THREAD_BYTES else json_too_deep(raw)):
            return self._refuse(call, 400, "bad_request", f"body is {TOO_DEEP}")
        try:
            body = _decode(raw)
        except msgspec.ValidationError as exc:  # valid JSON msgspec will not hold, e.g. 1e999
            if str(exc).startswith("Number out of range"):
                return self._refuse(call, 400, "bad_request", NUMBER_OUT_OF_RANGE)
            return self._refuse(call, 400, "bad_request", "body is not valid JSON")
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return self._refuse(call, 400, "bad_request", "body is not valid JSON")
        if not isinstance(body, dict):
            return self._refuse(call, 400, "bad_request", "body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return self._refuse(call, 400, "bad_request", "model: missing or not a string")
        # vLLM's pydantic models coerce "yes" to a stream; the gateway must agree with the
        # upstream on whether this is a stream, so only JSON booleans (or null) pass
        stream = body.get("stream")
        if stream is not None and type(stream) is not bool:
            return self._refuse(call, 400, "bad_request", "stream: must be a boolean")
        so = body.get("stream_options")
        if so is not None:
            if type(so) is not dict:
                return self._refuse(call, 400, "bad_request",
                                    "stream_options: must be an object")
            iu = so.get("include_usage")
            if iu is not None and type(iu) is not bool:
                return self._refuse(call, 400, "bad_request",
                                    "stream_options.include_usage: must be a boolean")
        try:
            prompt = extract(call.endpoint, body)
        except BadBody as exc:
            return self._refuse(call, 400, "bad_request", str(exc))
        info = self.models.get(model)
        if info is None:
            await self.rediscover()
            info = self.models.get(model)
        if info is None:
            # unknown only when an upstream answered and none serves it: every upstream down,
            # or the one that served it before down -> 503 upstream_error with the reasons
            down = [st for st in self.upstream_states() if not st["ok"]]
            if down and (len(down) == len(self.cfg.upstreams)
                         or any(model in st["models"] for st in down)):
                return self._refuse(call, 503, "upstream_error", "no upstream that could serve "
                                    "the model answered: " + "; ".join(st["error"] for st in down))
        if info is None:
            return self._refuse(call, 404, "unknown_model",
                                f"model {model!r} is not served by any upstream"
                                if len(model) <= 200 else "model is not served by any upstream")
        call.model = model
        call.block_size = info.block_size
        call.client_salt = "cache_salt" in body
        handle = hdrs.get(HANDLE_HEADER)
        try:
            salt = await self._decide(handle if handle and len(handle) <= 64 else None, call,
                                      body, prompt, info, len(raw))
        except STORE_ERRORS:  # the shared store failed: fail closed, no cached KV
            self.metrics.upstream_errors.labels("store").inc()
            call.decision = Decision("reject", "authorization_epoch", ("authorization_epoch",))
            call.expected = call.candidate = None
            call.register = []
            call.forget = []
            call.salt_applied = False
            salt = decision.isolated_salt(f"{self._id_prefix}-{call.rid}")
        stream = stream is True
        strip_usage = False
        if stream and call.endpoint in ("chat", "completions"):
            strip_usage = so is None or not so.get("include_usage")
        if self._tokenize_for(call):
            call.tokens_task = asyncio.ensure_future(self._tokenize(info, call, body))
        return _rewrite(raw, body, salt, strip_usage), info, stream, strip_usage

    async def _decide(self, presented: str | None, call: _Call, body: dict, prompt,
                      info: ModelInfo, size: int = 0) -> str:
        """Steps 3-5 (identity, lookup, acceptance, permit); returns the ``cache_salt`` to send.
        The rule is ``prefixscope.core.decision`` (shared with the replay model); this method
        does its I/O: the store's snapshot and lookup, the handle, the permit. Raises whatever
        the store raises (the caller fails closed)."""
        tools = prompt.tools
        digests = functools.partial(prefix_digests, prompt.messages, tools, prompt.boundaries,
                                    canonical=self._canonical,
                                    message_digests=self.cfg.mode == "public")
        if size >= _DIGEST_THREAD_BYTES:
            # a large prompt: hashing it takes milliseconds (a 430 KB body: about 2 ms) and
            # hashlib lets go of the GIL for large inputs, so the loop serves other streams
            dig = await asyncio.get_running_loop().run_in_executor(None, digests)
        else:
            dig = digests()
        render = render_digest(body)
        route = functools.partial(
            decision.route, mode=self.cfg.mode, auth_scope=call.auth.scope,
            auth_namespace=call.ns, public_namespace=self._public_ns,
            message_digests=dig.message, toolset_digest=dig.toolset, render=render,
            messages_only=dig.messages_only, served_model=info.model, inventory=self.inventory,
            key_fn=self.faults.lookup_key)
        routed = route(public_stopped=False)
        # generation, authorization epoch and registry entries in one store round trip
        gen, current, found = await self.store.snapshot(routed.namespace, list(routed.keys))
        if gen.public_stopped and routed.scope == PUBLIC:  # looked up under PUBLIC: again
            routed = route(public_stopped=True)
            current = await self.store.auth_epoch(routed.namespace)
            found = await self.store.lookup(list(routed.keys))
        cand = await self.store.by_handle(presented) if presented else None
        judged = decision.judge(
            routed, mode=self.cfg.mode, versions=self._versions(info),
            content=dig.content, full_content=dig.full, toolset_digest=dig.toolset,
            render=render, cache_epoch=gen.cache_epoch, bypass=gen.bypass,
            current_epoch=current, ctx_epoch=call.auth.epoch, found=found, presented=cand)
        permit = None
        if judged.needs_permit:
            if self.faults.between_lookup_and_permit is not None:
                await self.faults.between_lookup_and_permit(routed.namespace)
            permit = call.permit = await self.store.acquire_permit(routed.namespace,
                                                                   judged.ctx_epoch)
        d = decision.settle(judged, permit)
        call.scope, call.ns = d.scope, d.namespace
        call.expected, call.candidate = d.expected, judged.candidate
        call.decision, call.bypass, call.salt_applied = d.verdict, d.bypass, d.salt_applied
        call.forget = list(d.forget)
        nsb = d.namespace
        call.register = [(k, StoredObject(ident, 0, call.rid,
                                          decision.cache_handle(self._handle_mac, k, nsb)))
                         for _, k, ident in d.register]
        if d.salt is None:
            return decision.isolated_salt(f"{self._id_prefix}-{call.rid}")
        salt = self._salt_cache.get(d.salt)  # remembered by everything it derives from
        if salt is None:
            salt = decision.salt_for(self.key, d.salt)
            if len(self._salt_cache) > 100_000:
                self._salt_cache.clear()
            self._salt_cache[d.salt] = salt
        return salt

    def _versions(self, info: ModelInfo) -> decision.Versions:
        """The versions in force for a model (the live gateway has one policy revision)."""
        p = self.cfg.policy_revision
        return decision.Versions(info.model, info.model_digest, info.tokenizer_digest,
                                 info.runtime_digest, info.adapter_digest,
                                 info.prompt_bundle_digest, p, p)

    def _refuse(self, call: _Call, status: int, code: str, message: str) -> None:
        call.error, call.status, call.message = code, status, message
        self._m_client_err(code).inc()
        return None

    def _m_client_err(self, code: str):
        return self.metrics.child(self.metrics.client_errors, code)

    def _tokenize_for(self, call: _Call) -> bool:
        return self.cfg.tokenize == "upstream" and call.endpoint in ("chat", "completions")

    async def _tokenize(self, info: ModelInfo, call: _Call, body: dict) -> bytes | None:
        """The block-hash chain of this prompt from the upstream's ``/tokenize``
        (``gateway/tokens.py``), or None when it cannot be had (then the decision's
        candidate tokens stay an upper bound)."""
        req = tokenize_request(call.endpoint, body)
        if req is None:
            return None
        try:
            if isinstance(req, list):
                tokens = req
            else:
                base = info.upstreams[0].rstrip("/")
                async with await self.session.post(base, "/tokenize", _encode(req), {
                        "content-type": "application/json"}) as r:
                    if r.status != 200:
                        raise ValueError(f"/tokenize answered {r.status}")
                    tokens = _decode(await r.read())["tokens"]
            return block_chain(tokens, info.block_size)
        except (*_UPSTREAM_ERRORS, ValueError, KeyError, TypeError, msgspec.DecodeError):
            self.metrics.upstream_errors.labels("tokenize").inc()
            return None

    def _pick_upstream(self, call: _Call, info: ModelInfo) -> str:
        bases = info.upstreams
        base = bases[next(self._rr) % len(bases)].rstrip("/")
        call.upstream = base
        return base

    async def _forward(self, scope, receive, send, hdrs: dict[str, str], call: _Call,
                       out: bytes, info: ModelInfo, stream: bool, strip_usage: bool) -> None:
        base = self._pick_upstream(call, info)
        headers = {"content-type": "application/json", "x-request-id": call.rid}
        for h in ("accept", "anthropic-version", "anthropic-beta"):
            v = hdrs.get(h)
            if v is not None:
                headers[h] = v
        extra = [(b"x-prefixscope-request-id", call.rid.encode())]
        if call.register:
            extra.append((HANDLE_HEADER.encode(), call.register[-1][1].handle.encode()))
        try:
            resp = await self.session.post(base, scope["path"], out, headers)
        except _UPSTREAM_ERRORS as exc:
            await self._upstream_failed(send, call, exc)
            return
        try:
            if not stream or resp.status != 200:
                try:
                    content = await resp.read()
                except _UPSTREAM_ERRORS as exc:
                    await self._upstream_failed(send, call, exc)
                    return
                call.status = resp.status
                call.ttft_s = time.perf_counter() - call.t0
                if resp.status == 200:
                    try:
                        obj = _decode(content)
                        call.usage = obj.get("usage") if isinstance(obj, dict) else None
                    except (msgspec.DecodeError, UnicodeDecodeError):
                        call.usage = None
                else:
                    call.error = "upstream_error" if resp.status >= 500 else "upstream_status"
                    if resp.status >= 500:
                        self.metrics.upstream_errors.labels("status_5xx").inc()
                hl = _pass_headers(resp)
                hl.append((b"content-length", str(len(content)).encode()))
                await send({"type": "http.response.start", "status": resp.status,
                            "headers": hl + extra})
                await send({"type": "http.response.body", "body": content})
                return
            call.status = 200
            call.streaming = True
            await self._stream(receive, send, call, resp, strip_usage,
                               _pass_headers(resp) + extra)
        finally:
            resp.release()

    async def _stream(self, receive, send, call: _Call, resp, strip_usage: bool,
                      headers: list) -> None:
        """Pass the SSE stream through event by event (byte for byte), keeping back the usage
        chunk the gateway asked for; an upstream failure mid-stream ends with an error event; a
        client that goes away ends the upstream request (``client_disconnected``)."""
        gone = False

        async def watch() -> None:  # the only message after the body is http.disconnect
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            resp.close()  # wakes the read below; sends to a gone client are no-ops

        watcher = asyncio.ensure_future(watch())
        call.resp = resp
        buf = b""
        anthropic = call.endpoint == "messages"
        usage: dict = {}
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            content = resp.content
            ended = False  # the client's response is complete (terminator sent)
            async for chunk in content.iter_any():
                if call.ttft_s is None:
                    call.ttft_s = time.perf_counter() - call.t0
                if b'"usage"' not in chunk and b"\n\n" in chunk and not buf:
                    # the common case: whole events without usage, passed on untouched
                    cut = chunk.rfind(b"\n\n") + 2
                    buf = chunk[cut:]
                    # the upstream's stream ended in this read too: the last events and the
                    # end of the answer in one write to the client, not two
                    ended = not buf and content.at_eof()
                    await send({"type": "http.response.body", "body": chunk[:cut],
                                "more_body": not ended})
                    continue
                buf += chunk
                out = []
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        break
                    event, buf = buf[:cut + 2], buf[cut + 2:]
                    if b'"usage"' in event:
                        keep = self._usage_event(event, usage, anthropic, strip_usage)
                        if not keep:
                            continue
                    out.append(event)
                ended = not buf and content.at_eof()
                if out or ended:
                    await send({"type": "http.response.body", "body": b"".join(out),
                                "more_body": not ended})
            if not ended:
                await send({"type": "http.response.body", "body": buf})
            if gone:
                call.error = call.error or "client_disconnected"
        except TimeoutError:
            call.error = "upstream_timeout"
            self.metrics.upstream_errors.labels("upstream_timeout").inc()
            await send({"type": "http.response.body", "body": _sse_error(
                "upstream_timeout", "the upstream stopped sending within the read timeout "
                f"({self.cfg.read_timeout_s:g} s)")})
        except _UPSTREAM_ERRORS:
            if call.error == "gateway_shutdown":  # cut by drain(): the client is told why
                await send({"type": "http.response.body", "body": _sse_error(
                    "gateway_shutdown", self._shutdown_message())})
                return
            if gone:
                call.error = call.error or "client_disconnected"
                return
            call.error = "upstream_dropped"
            self.metrics.upstream_errors.labels("upstream_dropped").inc()
            await send({"type": "http.response.body", "body": _sse_error(
                "upstream_dropped", "the upstream closed the stream before its end")})
        except asyncio.CancelledError:
            call.error = call.error or "client_disconnected"
            raise
        except Exception as exc:  # noqa: BLE001 (a bug: an error event, recorded as such)
            await self._internal_error(send, call, exc)
        finally:
            watcher.cancel()
            call.resp = None
            call.usage = usage or None
            await self._finish_shielded(call)

    def _usage_event(self, event: bytes, usage: dict, anthropic: bool, strip: bool) -> bool:
        """Collect the usage of one SSE event; False = keep the event from the client."""
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            try:
                obj = _decode(line[5:])
            except (msgspec.DecodeError, UnicodeDecodeError):
                return True
            if not isinstance(obj, dict):
                return True
            if anthropic:
                u = (obj.get("message") or {}).get("usage") if obj.get("type") == "message_start" \
                    else obj.get("usage")
                if isinstance(u, dict):
                    usage.update({k: v for k, v in u.items() if v is not None})
                return True
            u = obj.get("usage")
            if isinstance(u, dict):
                usage.clear()
                usage.update(u)
                if strip and not obj.get("choices"):
                    return False
        return True

    async def _upstream_failed(self, send, call: _Call, exc: BaseException) -> None:
        kind = _kind(exc)
        call.error, call.status = kind, 502
        self._last_discovery = 0.0  # the next /health or unknown model re-checks the upstreams
        self.metrics.upstream_errors.labels(kind).inc()
        what = {"upstream_timeout": "did not answer within the timeouts "
                f"(connect {self.cfg.connect_timeout_s:g} s, read {self.cfg.read_timeout_s:g} s)",
                "upstream_dropped": "closed the connection before the answer was complete"}.get(
                    kind, f"could not be reached ({type(exc).__name__})")
        await _send_error(send, 502, kind, f"upstream {call.upstream} {what}")

    # ------------------------------------------------------------------ records

    async def _finish_shielded(self, call: _Call) -> None:
        """:meth:`_finish`, never cut short by a cancellation (a client gone mid-stream). With
        the in-process store and no ``/tokenize`` call in flight nothing in it suspends, so a
        plain await already runs it to its end (no cancellation can arrive); else it runs in a
        shielded task."""
        if call.tokens_task is None and type(self.store) is MemoryStore:
            await self._finish(call)
        else:
            await asyncio.shield(self._finish(call))

    async def _finish(self, call: _Call) -> None:
        """Release the permit, register objects, write the records and metrics (once)."""
        if call.finished:
            return
        call.finished = True
        self.in_flight -= 1
        norm = None
        if call.usage is not None:
            try:
                norm = normalise_usage({"usage": call.usage, "endpoint": call.endpoint})
            except Exception:  # noqa: BLE001 (an odd usage object is logged without counts)
                norm = None
        prompt_tokens = norm.prompt_tokens if norm is not None else None
        cached = norm.cached_tokens if norm is not None else None
        if call.tokens_task is not None:
            if call.error is None:
                call.blocks = await call.tokens_task
            else:
                call.tokens_task.cancel()
        ok = call.error is None and call.status == 200 and norm is not None
        items = []
        if ok and call.register:
            blocks = call.blocks or b""
            items = [(k, StoredObject(o.identity, prompt_tokens or 0, o.request_id, o.handle,
                                      blocks)) for k, o in call.register]
        release, call.permit = call.permit, False
        forget, call.forget = call.forget, []
        if release or items or forget:
            # the permit released and the entries registered in one store round trip; a
            # failing store: the records below are still written, a lost entry is a later
            # miss, never a hit (an entry not forgotten: one more reject, never a hit)
            try:
                await self.store.finish(release, items, forget)
            except STORE_ERRORS:
                self.metrics.upstream_errors.labels("store").inc()
        self._write_records(call, prompt_tokens, cached, norm is not None)

    def _write_records(self, call: _Call, prompt_tokens: int | None, cached: int | None,
                       has_usage: bool) -> None:
        latency = time.perf_counter() - call.t0
        ns_d = namespace_digest(call.ns)
        m = self.metrics
        status = f"{call.status // 100}xx" if call.status else "none"
        child = m.child
        child(m.requests, call.endpoint, call.scope, status).inc()
        child(m.latency, call.endpoint).observe(latency)
        if call.ttft_s is not None:
            child(m.ttft, call.endpoint).observe(call.ttft_s)
        if call.client_salt:
            m.salt_replaced.inc()
        if has_usage:
            rec = {"ts_unix_s": round(call.ts, 6), "request_id": call.rid, "run_id": "",
                   "model": call.model, "instance": self.cfg.instance, "endpoint": call.endpoint,
                   "ttft_ms": None if call.ttft_s is None else round(call.ttft_s * 1000, 3),
                   "latency_ms": round(latency * 1000, 3), "scope": call.scope,
                   "tenant_digest": ns_d, "usage": call.usage}
            if call.error:
                rec["error"] = call.error
            self.usage_log.write(rec)
            if prompt_tokens is not None:
                child(m.prompt_tokens, call.scope).inc(prompt_tokens)
            if cached is not None:
                child(m.cached_tokens, call.scope).inc(cached)
                m.namespace(ns_d, cached)
        verdict = call.decision or Decision("miss")
        cand = call.candidate
        cand_tokens = 0
        basis = "exact" if cand is None else "upper_bound"  # a miss: 0, exactly
        if cand is not None and prompt_tokens:
            if call.blocks is not None and cand.blocks:
                cand_tokens = shared_tokens(cand.blocks, call.blocks, prompt_tokens,
                                            call.block_size)
                basis = "exact"
            else:
                cand_tokens = candidate_tokens(cand.num_tokens, prompt_tokens, call.block_size)
        child(m.candidate_tokens, basis).inc(cand_tokens)
        exp_short = self._short(call.expected) if call.expected is not None else {
            "scope": call.scope, "namespace_digest": ns_d}
        rec = DecisionRecord(
            ts_unix_s=call.ts, request_id=call.rid, scope=call.scope, namespace_digest=ns_d,
            decision=verdict.outcome, reasons=verdict.mismatches,
            candidate_cached_tokens=cand_tokens,
            # a bypassed accept was not used (sent isolated: vLLM reports 0 cached tokens);
            # a shadow-mode accept keeps its tokens: what tenant mode would reuse
            accepted_cached_tokens=(cand_tokens if verdict.outcome == "accept"
                                    and not call.bypass else 0),
            salt_applied=call.salt_applied, expected=exp_short,
            candidate=None if cand is None else self._short(cand.identity),
            candidate_request_id=None if cand is None else cand.request_id,
            instance=self.cfg.instance, model=call.model, error=call.error,
            client_salt_replaced=call.client_salt, candidate_tokens_basis=basis,
            bypass=True if call.bypass else None)
        self.decision_log.write(rec.as_json())
        child(m.decisions, verdict.outcome, verdict.first_mismatch or "none").inc()
        self._check_invariants(call, verdict, cached or 0)

    def _short(self, identity: CacheIdentity) -> dict:
        """``identity.short(key)``, remembered (the same prefix objects recur; the log form
        costs a keyed HMAC). The dict is shared: ``DecisionRecord.as_json`` copies it."""
        d = self._short_cache.get(identity)
        if d is None:
            if len(self._short_cache) > 100_000:
                self._short_cache.clear()
            d = self._short_cache[identity] = identity.short(self.key)
        return d

    def _check_invariants(self, call: _Call, verdict: Decision, cached: int) -> None:
        """The three invariants on this request, as ``store/queries/scopes.py`` counts them."""
        m = self.metrics.invariants
        exp, cand = call.expected, call.candidate
        if verdict.outcome == "accept" and cand is not None and exp is not None:
            c = cand.identity
            if c == exp:  # every field equal (the usual accept): none of the three can hold
                return
            if c.scope != exp.scope or c.namespace != exp.namespace:
                m.labels("cross_scope_acceptance").inc()
            if any(getattr(c, f) != getattr(exp, f) for f in _VERSION_FIELDS):
                m.labels("wrong_version_acceptance").inc()
            if (c.authorization_epoch, c.cache_epoch) != (exp.authorization_epoch,
                                                            exp.cache_epoch):
                m.labels("old_generation_use").inc()
        elif verdict.outcome == "reject" and cached > 0:
            cls = reason_class(verdict.first_mismatch)
            name = {"cross_scope": "cross_scope_acceptance", "version": "wrong_version_acceptance",
                    "collision": "wrong_version_acceptance",
                    "generation": "old_generation_use"}[cls]
            m.labels(name).inc()


#: Longest one upstream's discovery (``/v1/models``, ``/version``, ``/metrics``) may take.
DISCOVERY_TIMEOUT_S = 5.0


def _discovery_error(url: str, exc: BaseException) -> str:
    """One line on why an upstream's discovery failed (no response body echoed)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{url}/v1/models answered HTTP {exc.response.status_code}"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, httpx.TimeoutException)):
        return f"{url} did not answer within {DISCOVERY_TIMEOUT_S:g} s"
    if isinstance(exc, httpx.ConnectError):
        return f"{url} could not be reached (connection refused or no route)"
    if isinstance(exc, (ValueError, TypeError, AttributeError)):
        return f"{url}/v1/models is not a JSON model list"
    return f"{url}: {type(exc).__name__}"


#: Where the server's protocol (``server.bounded_protocol``) notes, in the ASGI scope, a
#: request it refused while the body arrived: ``(status, code, message)``.
REFUSED_KEY = "prefixscope.refused"

#: Largest admin request body, bytes (the bodies are a few small fields; 1 MiB lets a
#: 100,000-deep body be told it is too deep rather than too large).
ADMIN_MAX_BODY_BYTES = 1 << 20


#: The keys each admin endpoint takes; any other key is a 400 naming it (a typo such as
#: ``{"tenant": "acme"}`` sent to ``/admin/cache-epoch/bump`` bumped the global epoch).
ADMIN_KEYS: dict[str, frozenset[str]] = {
    "/admin/state": frozenset(),
    "/admin/cache-epoch/bump": frozenset(),
    "/admin/revoke": frozenset({"tenant", "principal", "from_epoch", "force"}),
    "/admin/public/stop": frozenset(),
    "/admin/bypass": frozenset({"on"}),
}


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a JSON object that repeats a key is refused (the stdlib keeps
    the last one: ``{"tenant": "a", "tenant": "b"}`` revoked ``b``)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _RepeatedKey(k)
        out[k] = v
    return out


def _key_name(key: str) -> str:
    """A key of an admin body as a message may show it: JSON-quoted ASCII, at most 40
    characters (a hostile key can be 1 MiB or hold control characters)."""
    shown = json.dumps(key, ensure_ascii=True)
    return shown if len(shown) <= 40 else shown[:36] + '..."'


def _admin_body(raw: bytes, path: str = "") -> tuple[dict, str | None]:
    """The admin request body as an object (empty body: ``{}``), or ``({}, problem)`` with
    the sentence of the 400: not UTF-8 JSON, nested deeper than the ingester's bound (the
    stdlib decoder recurses), not a JSON object (``[]``, ``null``, ``"acme"``), an object
    that repeats a key, or a key ``path`` does not take (``ADMIN_KEYS``). The problem never
    quotes the body (a key is named, quoted and cut short)."""
    if not raw.strip():
        return {}, None
    if json_too_deep(raw):
        return {}, f"admin body is {TOO_DEEP}"
    try:  # the stdlib decoder: NaN and 1e999 decode, so the field check below names them
        body = json.loads(raw, object_pairs_hook=_no_repeats)
    except _RepeatedKey as exc:
        return {}, f"admin body repeats the key {_key_name(exc.key)}: each key once"
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return {}, "admin body must be JSON"
    if not isinstance(body, dict):
        return {}, "admin body must be a JSON object, e.g. {\"tenant\": \"...\"}"
    allowed = ADMIN_KEYS.get(path, frozenset())
    for k in body:
        if k not in allowed:
            takes = ", ".join(sorted(allowed)) or "no keys"
            return {}, f"admin body has an unknown key {_key_name(k)} ({path} takes {takes})"
    return body, None


def _admin_id(value: Any) -> bool:
    """A tenant or principal id of an admin body: a non-empty string that is valid Unicode
    (the stdlib decoder keeps a lone surrogate such as ``"\\ud800"``, which cannot be hashed
    as UTF-8). Control characters are checked after it (``_CONTROL``), with their own 400."""
    if not isinstance(value, str) or not value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: A control character (C0, DEL, C1): never part of a tenant or principal id.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _client_host(request: Request) -> str | None:
    return request.client.host if request.client else None


def _kind(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
        return "upstream_timeout"
    if isinstance(exc, UpstreamError):
        return exc.kind
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, ConnectionError)):
        return "upstream_dropped"
    return "upstream_error"


def _pass_headers(resp) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers without hop-by-hop ones (ASGI form)."""
    return [(k, v) for k, v in resp.raw_headers if k.lower() not in _HOP_B]
