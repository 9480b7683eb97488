"""Build a :class:`~prefixscope.gateway.app.Gateway` from its configuration and serve it with
uvicorn (graceful shutdown: on SIGTERM/SIGINT uvicorn stops accepting connections, lets
in-flight requests and streams finish for up to ``shutdown_grace_s``; the gateway ends what is
still running then (:func:`make_server`, ``Gateway.drain``), then the app's lifespan flushes and
fsyncs the logs and saves the in-process state)."""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

from prefixscope.core.documents import DocumentError, read_document
from prefixscope.core.errors import ConfigError
from prefixscope.core.identity import PublicInventory, load_hmac_key
from prefixscope.gateway.app import ADMIN_MAX_BODY_BYTES, REFUSED_KEY, Faults, Gateway
from prefixscope.gateway.auth import Authenticator, load_api_keys
from prefixscope.gateway.config import GatewayConfig
from prefixscope.gateway.store import open_store


def read_admin_token(path: str | None) -> str | None:
    """The admin bearer token from its file (None: admin endpoints off).

    Raises:
        ConfigError: unreadable, or shorter than 16 characters.
    """
    if path is None:
        return None
    try:
        token = read_document(path, limit=4096).strip()
    except DocumentError as exc:
        raise ConfigError(f"{path}: cannot read the admin token file: {exc}") from None
    if len(token) < 16:
        raise ConfigError(f"{path}: the admin token needs at least 16 characters")
    return token


def build_gateway(cfg: GatewayConfig, *, faults: Faults | None = None) -> Gateway:
    """A gateway with its key, API keys, inventory, admin token and store from ``cfg``.

    Raises:
        ConfigError: a file named by the configuration is missing or invalid.
    """
    key = load_hmac_key(cfg.hmac_key_file)
    if cfg.api_keys_file is None and not cfg.trusted_proxies:
        raise ConfigError("[gateway] needs api_keys_file or trusted_proxies: the gateway only "
                          "serves requests with a trusted identity")
    auth = Authenticator(api_keys=load_api_keys(cfg.api_keys_file),
                         trusted_proxies=cfg.trusted_proxies, tenant_header=cfg.tenant_header,
                         principal_header=cfg.principal_header, scope_header=cfg.scope_header,
                         epoch_header=cfg.epoch_header)
    inventory = (PublicInventory.from_file(cfg.inventory_file) if cfg.inventory_file
                 else PublicInventory())
    return Gateway(cfg, key, store=open_store(cfg.store, cfg.state_file, max_entries=cfg.registry_max_entries,
                                    entry_ttl_s=cfg.registry_ttl_s), inventory=inventory,
                   authenticator=auth, admin_token=read_admin_token(cfg.admin_token_file),
                   faults=faults)


#: The operator log of refused clients (one line each: status, code, peer address; never a
#: tenant id or request text).
_log = logging.getLogger("prefixscope.gateway")


#: Seconds a refused connection stays open after its answer, its input read and dropped.
REFUSAL_LINGER_S = 0.5


def refusal_response(status: int, code: str, message: str, retry_after_s: int,
                     default_headers=()) -> bytes:
    """A complete HTTP/1.1 refusal (JSON error body, ``connection: close``,
    ``retry-after: <retry_after_s>``) written straight to a transport, before any ASGI
    request exists (header deadline, header size, connection cap)."""
    reason = {408: b"Request Timeout", 413: b"Content Too Large", 431: b"Request Header Fields Too Large",
              503: b"Service Unavailable"}[status]
    body = (b'{"error":{"message":%s,"type":"gateway_error","code":"%s"}}'
            % (json.dumps(message).encode(), code.encode()))
    head = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
    for name, value in default_headers:
        head.extend([name, b": ", value, b"\r\n"])
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\n"
                b"retry-after: %d\r\nconnection: close\r\n\r\n" % (len(body), retry_after_s))
    return b"".join(head) + body


_HEX = re.compile(rb"[0-9A-Fa-f]+")
#: Longest chunk-size line read (llhttp refuses what is longer or malformed itself).
_CHUNK_LINE_MAX = 4096


class ChunkSizes:
    """The chunk-size lines of one chunked request body, read as its bytes arrive: ``feed``
    says when the sizes declared so far (a line not yet ended included: ``10000000000000000``
    is past any bound before its CRLF) add up past ``limit``, so that a body that can only be
    too large is refused at once, not after ``client_body_timeout_s``. A line that is not
    hex (the parser's 400) or a framing it cannot follow stops the watch: it never refuses
    what the parser would take."""

    __slots__ = ("limit", "total", "state", "line", "left", "done")

    def __init__(self, limit: int, *, done: bool = False) -> None:
        self.limit, self.total, self.done = limit, 0, done
        self.state, self.line, self.left = "size", b"", 0

    def _over(self, line: bytes) -> bool:
        digits = line.split(b";", 1)[0].strip(b" \t\r")
        if not _HEX.fullmatch(digits):
            return False
        return self.total + int(digits, 16) > self.limit

    def feed(self, data: bytes) -> bool:
        """True when the declared sizes pass the limit."""
        i, n = 0, len(data)
        while i < n and not self.done:
            if self.state == "data":
                take = min(self.left, n - i)
                self.left -= take
                i += take
                if self.left == 0:
                    self.state, self.left = "crlf", 2
            elif self.state == "crlf":
                take = min(self.left, n - i)
                self.left -= take
                i += take
                if self.left == 0:
                    self.state = "size"
            else:  # a chunk-size line or a trailer line
                j = data.find(b"\n", i)
                if j < 0:
                    self.line += data[i:]
                    if len(self.line) > _CHUNK_LINE_MAX:
                        self.done = True
                    return self.state == "size" and self._over(self.line)
                line, self.line, i = self.line + data[i:j], b"", j + 1
                if self.state == "trailer":
                    if not line.strip(b"\r"):
                        self.done = True  # the body's end
                    continue
                digits = line.split(b";", 1)[0].strip(b" \t\r")
                if not _HEX.fullmatch(digits):
                    self.done = True
                    continue
                size = int(digits, 16)
                if size == 0:
                    self.state = "trailer"
                    continue
                self.total += size
                if self.total > self.limit:
                    return True
                self.state, self.left = "data", size
        return False


def bounded_protocol(cfg: GatewayConfig, on_refused=None):
    """uvicorn's httptools HTTP protocol with the bounds uvicorn's does not have
    (``docs/gateway.md#slow-clients``): a deadline on the request headers, a bound on their
    size, and the connection cap answered at once.

    - **Header deadline** (``client_header_timeout_s``): a connection's request line and
      headers must arrive within that long of the connection being made (first request) or of
      the request's first byte (later keep-alive requests): else ``408 client_timeout``
      (uvicorn's ``timeout_keep_alive`` only covers the idle time between requests). One
      ``call_later`` per request, cancelled when the headers are complete.
    - **Header size** (``max_header_bytes``): httptools buffers an unfinished header whole
      and has no limit of its own (20 connections x 16 MiB of headers took the gateway from
      88 to 424 MB); the bytes received before the end of the headers are counted per request
      and past the bound the answer is ``431 header_too_large`` without feeding the parser. A
      chunk that holds the end of the headers within the bound (and the body after it) passes.
    - **Connection cap** (``max_connections``): a connection made while that many are open is
      answered ``503 overloaded`` and closed at once, before anything is read (uvicorn's
      ``limit_concurrency`` still answers requests past the cap of tasks).
    - **Chunk sizes** (``max_body_bytes``, 1 MiB for ``/admin/*``): the chunk-size lines of
      a chunked body are read as they arrive (:class:`ChunkSizes`); when the sizes declared
      add up past the bound (a chunk of ``ffffffff`` or ``10000000000000000``), ``413
      too_large`` at once, before the bytes are sent (they would otherwise be awaited until
      ``client_body_timeout_s``); the request's decision record says ``too_large``.

    Every refusal carries ``retry-after: <retry_after_s>`` and ``connection: close``, calls
    ``on_refused(code)`` (the metric) and logs one line (status, code, peer address).
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    timeout_s = cfg.client_header_timeout_s
    limit = cfg.max_header_bytes
    retry = cfg.retry_after_s

    class BoundedProtocol(HttpToolsProtocol):
        _header_timer = None
        _refused = False
        _in_headers = True   # the current request's headers are not complete
        _header_bytes = 0    # bytes received for them so far
        _tail = b""          # the last 3 bytes received while in headers (a split CRLFCRLF)
        _chunks: ChunkSizes | None = None  # the current request's chunk sizes, when chunked
        _completed = 0       # messages completed within the current data_received call

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > cfg.max_connections:
                self._refuse(503, "overloaded", f"the gateway has max_connections "
                             f"({cfg.max_connections}) connections open; retry in {retry} s")
                return
            self._header_timer = self.loop.call_later(timeout_s, self._headers_late)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            body_at = 0  # where this data's body bytes begin (after the headers' end)
            if self._in_headers:
                room = limit - self._header_bytes
                if len(data) > room:
                    # past the bound unless the headers end within it
                    window = self._tail + data[:max(room, 0) + 4]
                    if b"\r\n\r\n" not in window:
                        self._refuse(431, "header_too_large", "the request line and headers "
                                     f"are above max_header_bytes ({limit:,} bytes)")
                        return
                end = (self._tail + data).find(b"\r\n\r\n")
                body_at = end + 4 - len(self._tail) if end >= 0 else len(data)
                self._header_bytes += len(data)
                self._tail = data[-3:]
            self._completed = 0
            super().data_received(data)
            watch = self._chunks
            if watch is not None and not self._refused and watch.feed(data[body_at:]):
                self._refuse(413, "too_large", "the chunk sizes of the request body add up "
                             f"past its bound ({watch.limit:,} bytes)", body=True)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None and not self._refused:
                self._header_timer = self.loop.call_later(timeout_s, self._headers_late)

        def on_headers_complete(self) -> None:
            self._in_headers = False
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().on_headers_complete()
            chunked = any(k == b"transfer-encoding" and b"chunked" in v.lower()
                          for k, v in self.headers)
            if chunked:
                bound = (ADMIN_MAX_BODY_BYTES if self.url.startswith(b"/admin")
                         else cfg.max_body_bytes)
                # a pipelined request after one completed in the same read: its body's start
                # is not known here, so it is not watched (max_body_bytes and the body
                # deadline still hold)
                self._chunks = ChunkSizes(bound, done=self._completed > 0)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._chunks = None
            self._completed += 1
            # a keep-alive or pipelined request's headers come next
            self._in_headers, self._header_bytes, self._tail = True, 0, b""

        def connection_lost(self, exc) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                # a pipelined request's headers while the previous answer is still being
                # sent: look again later, never write into that answer
                self._header_timer = self.loop.call_later(timeout_s, self._headers_late)
                return
            self._refuse(408, "client_timeout", "the request headers did not arrive within "
                         f"client_header_timeout_s ({timeout_s:g} s)")

        def _refuse(self, status: int, code: str, message: str, *, body: bool = False) -> None:
            """Answer ``status`` at once and close (the connection is read no further).
            ``body``: refused while the current request's body arrives (its app has not
            answered yet: it sees a disconnect, and the scope names the refusal for its
            decision record)."""
            self._refused = True
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            if on_refused is not None:
                on_refused(code)
            peer = "%s:%d" % tuple(self.client) if self.client else "unknown"
            _log.warning("gateway: refused client %s: %d %s", peer, status, code)
            cycle = self.cycle
            if body and cycle is not None and not cycle.response_started:
                cycle.scope[REFUSED_KEY] = (status, code, message)
                cycle.disconnected = True  # its app's sends are dropped from here on
                cycle.message_event.set()
            elif cycle is not None and not cycle.response_complete:
                self.transport.close()  # an answer is being written: never write into it
                return
            self.transport.write(refusal_response(status, code, message, retry,
                                                  self.server_state.default_headers))
            # a lingering close: what the client still sends is read and dropped for a
            # moment (data_received), so its kernel gets the answer before the close, not a
            # reset that discards it
            self.loop.call_later(REFUSAL_LINGER_S, self.transport.close)

    return BoundedProtocol


def _uvicorn_config(app, cfg: GatewayConfig, *, on_refused=None):
    """The uvicorn configuration of a gateway: see ``docs/gateway.md#slow-clients`` for the
    client timeouts, the header bound and the connection cap."""
    import uvicorn

    # proxy_headers off: the client address is the TCP peer (trusted proxies are the gateway's
    # own rule, gateway/auth.py); uvloop (uvicorn's "auto") and httptools with the header
    # deadline, header bound and connection cap (bounded_protocol); limit_concurrency: with
    # max_connections requests in flight a new request is answered 503 at once
    return uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                          access_log=False, lifespan="on", proxy_headers=False,
                          loop="auto", backlog=4096,
                          http=bounded_protocol(cfg, on_refused),
                          limit_concurrency=cfg.max_connections + 1,
                          # the gateway ends what is left at shutdown_grace_s itself
                          # (Gateway.drain); uvicorn's own cancellation is only a backstop
                          timeout_graceful_shutdown=cfg.shutdown_grace_s + SHUTDOWN_BACKSTOP_S)


#: Seconds after ``shutdown_grace_s`` at which uvicorn cancels whatever is still running
#: (the gateway has ended every request at ``shutdown_grace_s``; this only catches a bug).
SHUTDOWN_BACKSTOP_S = 5.0


def make_server(gw: Gateway, cfg: GatewayConfig):
    """The uvicorn server of gateway ``gw`` (``server.run()`` serves until SIGTERM/SIGINT).

    On shutdown it stops accepting connections and calls ``gw.drain(shutdown_grace_s)``:
    requests and streams still in flight at the deadline are ended by the gateway (an SSE
    ``gateway_shutdown`` event or a ``503``, records saying so), then the lifespan flushes the
    logs."""
    import uvicorn

    class GatewayServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            gw.drain(cfg.shutdown_grace_s)
            await super().shutdown(sockets)

    def refused(code: str) -> None:
        gw.metrics.child(gw.metrics.client_errors, code).inc()

    return GatewayServer(_uvicorn_config(gw.app, cfg, on_refused=refused))


def tune_gc() -> None:
    """Garbage collector settings of a serving process, called once its gateway is built.

    Everything allocated so far (modules, configuration, key files: about 70,000 objects) is
    moved to the permanent generation (``gc.freeze``), so a full collection no longer walks it:
    measured on the paced benchmark, each full collection took 30-40 ms of CPU on the event
    loop thread (every stream in flight waits that long) and now takes about 4 ms. The young
    generation's threshold is raised from 700 to 10,000 allocations: a request's objects die
    by reference counting, and at 700 a collection ran every ~12 requests (0.3 ms each, 0.02
    ms per request); at 10,000 a few per 3,000 requests (``docs/benchmarks.md``). Cycles are
    still collected, only less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


def worker_config(cfg: GatewayConfig, index: int) -> GatewayConfig:
    """The configuration of worker ``index`` of ``cfg.workers``: its own log folder
    (``<log_dir>/worker-<index>``) and ``instance`` (``<instance>-w<index>``); one worker keeps
    ``cfg`` as it is."""
    if cfg.workers == 1:
        return cfg
    return cfg.model_copy(update={"log_dir": str(Path(cfg.log_dir) / f"worker-{index}"),
                                  "instance": f"{cfg.instance}-w{index}"})


def check_workers(cfg: GatewayConfig) -> None:
    """Raises ConfigError when ``workers`` > 1 with the in-process store: each process would
    have its own registry, epochs and permit gate, so a revocation seen by one worker would not
    close the permits of another (``docs/deploy.md#several-gateway-replicas``)."""
    if cfg.workers > 1 and cfg.store == "memory":
        raise ConfigError("[gateway] workers > 1 needs store = \"redis://...\": the in-process "
                          "store is per process (registry, authorization epochs and permits "
                          "would not be shared between the workers)")


def _worker_main(cfg_json: str, index: int, sock) -> None:
    """One worker process (spawned, ``PROMETHEUS_MULTIPROC_DIR`` inherited): its gateway on
    the shared listening socket."""
    cfg = worker_config(GatewayConfig.model_validate_json(cfg_json), index)
    gw = build_gateway(cfg)
    tune_gc()
    make_server(gw, cfg).run(sockets=[sock])


def serve(cfg: GatewayConfig) -> None:
    """Run the gateway in the foreground until SIGTERM/SIGINT (graceful, see module).

    With ``workers`` > 1 (Redis store only, :func:`check_workers`): the listening socket is
    bound here and shared by ``workers`` spawned processes (the kernel spreads connections
    between them); each writes its own logs (:func:`worker_config`); ``/metrics`` answers from
    any worker with the sum over all of them (prometheus_client's multiprocess mode, files in
    a private temporary folder). SIGTERM/SIGINT is passed to every worker (each finishes its
    streams); if one worker dies the others are stopped and this exits non-zero (let the
    service manager restart it).
    """
    check_workers(cfg)
    if cfg.workers == 1:
        gw = build_gateway(cfg)
        tune_gc()
        make_server(gw, cfg).run()
        return
    build_gateway(cfg)  # fail here, once, on a bad key file or inventory
    metrics_dir = tempfile.mkdtemp(prefix="prefixscope-gw-metrics-")
    sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as exc:
        raise ConfigError(f"[gateway] cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}"
                          ) from None
    sock.listen(4096)
    sock.set_inheritable(True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # read by the workers' imports
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker_main, args=(cfg.model_dump_json(), i, sock),
                         name=f"gateway-w{i}") for i in range(cfg.workers)]
    stopping = False

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    failed = False
    try:
        for p in procs:
            p.start()
        while not stopping:
            if any(p.exitcode is not None for p in procs):
                failed = True
                stop(None, None)
                break
            time.sleep(0.2)
        for p in procs:
            p.join()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if failed:
        raise SystemExit(1)
