"""OTLP/HTTP trace receiver: ``POST /v1/traces`` (protobuf or JSON, gzip or not) into the store.

What an OpenTelemetry Collector's ``otlphttp`` exporter (or an SDK's OTLP/HTTP exporter) needs
from a receiver (OTLP specification, "OTLP/HTTP"):

1. **Ack after commit**: the response is sent only after the request's spans are committed
   (:func:`prefixscope.ingest.otlp.store_otlp_request`, one transaction); a request that was not
   stored is never answered 200, so the exporter sends it again. Spans are keyed by
   ``gen_ai.response.id`` or trace/span id: a batch sent twice lands once.
2. **Back-pressure**: the store stayed locked by another process for ``lock_timeout_s`` -> 503
   with ``Retry-After``; more than ``max_pending`` requests already waiting -> 429 with
   ``Retry-After``. Both are retryable for the exporters; nothing of that request was stored.
3. A body that is not an OTLP trace request -> 400 (not retryable). A span that cannot be
   decoded (a malformed attribute) or has a bad usage attribute is quarantined and counted in
   ``partial_success.rejected_spans`` with an ``error_message``; the others are stored and the
   answer is 200 (``ingest/otlp_partial.py``).
4. The response body is an ``ExportTraceServiceResponse`` in the request's encoding.

**Bounds** (what one receiver holds, whatever its clients send; ``docs/ingest.md#otlp``):

5. At most ``max_connections`` open connections. A new one beyond it closes the oldest
   connection still sending its headers after ``evict_after_s`` (a stalled client), else it is
   answered 503 with ``Retry-After`` and closed. Threads: at most one per connection (plus the
   closing ones).
6. Request line and headers: at most :data:`MAX_HEADER_BYTES` in all (431), within
   ``header_timeout_s`` of the connection's previous request (or its opening); the body within
   ``body_timeout_s`` of the headers. A client past its time is closed (408 when it was sending
   a body), whether it sends nothing or a byte at a time.
7. A body over :data:`MAX_BODY_BYTES` (its ``Content-Length``, the chunks received so far, or
   after decompression) -> 413 and the connection is closed. Chunk sizes are read strictly
   (hex digits only: ``-1`` is a 400, never "read to the end").
8. Body bytes held by every request together (received, and decompressed) at most
   ``max_inflight_bytes``: a request that would pass it -> 503 with ``Retry-After`` (retryable;
   nothing was stored).
9. One log line per refused or closed client, never a traceback (a client gone before its
   answer is one line too), written whole (:func:`log_line`: one write under a lock).
10. Framing and encoding: ``Content-Length`` headers that disagree, or not plain digits ->
   400; a ``Content-Encoding`` other than none, ``identity``, ``gzip``, ``deflate`` -> 415
   naming it (the body is not read).

One write at a time (a lock in this process): DuckDB allows one writer per file, and each
request opens the store, commits and closes it (``store/db.py`` rule 1), so the dashboard can
read between requests. The stdlib ``http.server`` (threading) serves the connections.
"""

from __future__ import annotations

import http.client
import re
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from prefixscope.core.errors import StoreFull, StoreLocked
from prefixscope.ingest.genai_spans import OtlpDecodeError
from prefixscope.ingest.otlp import SpanOptions, StoredRequest, store_otlp_request
from prefixscope.ingest.otlp_partial import PartialRequest, decode_request

#: Largest accepted body, bytes, received and after decompression (a collector's default batch
#: is far smaller).
MAX_BODY_BYTES = 64 << 20
#: Body bytes all requests may hold at once (received plus decompressed), bytes: two bodies of
#: the largest size.
MAX_INFLIGHT_BYTES = 128 << 20
#: Request line plus header fields of one request, bytes.
MAX_HEADER_BYTES = 64 << 10
#: Open connections (each has a thread).
MAX_CONNECTIONS = 64
#: Seconds a request's line and headers may take (from the previous request or the opening).
HEADER_TIMEOUT_S = 10.0
#: Seconds a request's body may take once its headers are in.
BODY_TIMEOUT_S = 60.0
#: A connection still in its headers after this many seconds is closed when a new one needs
#: its place.
EVICT_AFTER_S = 2.0

_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})(?:[ \t]*;[^\r\n]*)?\r?\n")
_PIECE = 1 << 20  # bytes read at a time


@dataclass
class ReceiverStats:
    """Counters of a running receiver (read by tests and the CLI's closing line).

    ``busy_503`` counts every 503: the store locked, the in-flight byte bound, and connections
    refused at the connection bound (``refused_connections`` of them)."""

    requests: int = 0
    spans_added: int = 0
    spans_duplicate: int = 0
    spans_rejected: int = 0
    busy_503: int = 0
    busy_429: int = 0
    bad_400: int = 0
    too_large_413: int = 0
    headers_431: int = 0
    refused_connections: int = 0
    closed_slow: int = 0


_LOG_LOCK = threading.Lock()


def log_line(line: str) -> None:
    """Write one log line to stderr atomically: one ``write`` of the line with its newline,
    under a lock (``print`` writes the text and the newline separately: under load lines of
    several clients were glued together, then an empty line)."""
    with _LOG_LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


#: Content-Encoding values read (none, ``identity``, ``gzip``, ``deflate``); any other is 415.
ENCODINGS = ("", "identity", "gzip", "deflate")
_TOKEN = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]{1,32}")  # an encoding named back, never raw input


def _content_length(h: BaseHTTPRequestHandler) -> int:
    """The one ``Content-Length`` of a request (0 when none); -1 when it is not a number or
    two headers disagree (``2`` then ``20``: request smuggling by framing, RFC 9112 6.3: 400).
    The same value repeated is one."""
    values = {v.strip() for v in h.headers.get_all("Content-Length") or ()}
    if not values:
        return 0
    if len(values) > 1:
        return -1
    v = values.pop()
    return int(v) if v.isascii() and v.isdigit() else -1


def _unsupported_encoding(h: BaseHTTPRequestHandler) -> str | None:
    """The reason a request's Content-Encoding is refused (415), None when it is read."""
    values = [v.strip().lower() for v in h.headers.get_all("Content-Encoding") or ()]
    if len(values) > 1 or (values and values[0] not in ENCODINGS):
        enc = ", ".join(values)
        named = f"Content-Encoding {enc}" if _TOKEN.fullmatch(enc) else \
            "this Content-Encoding"
        return f"{named} is not supported (gzip, deflate or none)"
    return None


class _Refuse(Exception):
    """Answer ``code`` with ``message`` and close the connection."""

    def __init__(self, code: int, message: str, retry_after: bool = False):
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after


class _Gone(Exception):
    """The client closed the connection, or was closed for its time, while sending."""


class _HeadersTooLarge(http.client.LineTooLong):
    def __init__(self) -> None:
        super().__init__("header bytes")


class _HeaderBudget:
    """``rfile`` while a request line and headers are read: at most ``left`` bytes in all."""

    def __init__(self, raw, left: int):
        self.raw, self.left = raw, left

    def readline(self, limit: int = -1) -> bytes:
        if self.left <= 0:
            raise _HeadersTooLarge()
        n = self.left + 1 if limit is None or limit < 0 else min(limit, self.left + 1)
        line = self.raw.readline(n)
        self.left -= len(line)
        if self.left < 0:
            raise _HeadersTooLarge()
        return line


@dataclass
class _Conn:
    sock: socket.socket
    address: str
    phase: str  # headers, body, work
    since: float  # monotonic start of the phase
    deadline: float | None
    closed: bool = False


class OtlpReceiver:
    """An OTLP/HTTP trace receiver writing into the DuckDB file ``db_path``.

    Args:
        db_path: the store (opened per request, closed after commit).
        host, port: where to listen (port 0: any free port; see :attr:`port`).
        opts: how spans become rows.
        lock_timeout_s: how long one request waits for the store's lock before 503.
        retry_after_s: the ``Retry-After`` seconds sent with 429 and 503.
        max_pending: requests that may wait for the write lock before 429.
        log: one line per answered request that was not a plain 200, and per refused or closed
            client (default: stderr).
        max_connections, max_inflight_bytes, header_timeout_s, body_timeout_s, evict_after_s:
            the bounds of the module docstring (items 5 to 8).
    """

    def __init__(self, db_path: str, *, host: str = "127.0.0.1", port: int = 4318,
                 opts: SpanOptions = SpanOptions(), lock_timeout_s: float = 2.0,
                 retry_after_s: int = 1, max_pending: int = 8,
                 log: Callable[[str], None] | None = None,
                 max_connections: int = MAX_CONNECTIONS,
                 max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
                 header_timeout_s: float = HEADER_TIMEOUT_S,
                 body_timeout_s: float = BODY_TIMEOUT_S, evict_after_s: float = EVICT_AFTER_S):
        self.db_path = db_path
        self.opts = opts
        self.lock_timeout_s = lock_timeout_s
        self.retry_after_s = retry_after_s
        self.max_pending = max_pending
        self.max_connections = max_connections
        self.max_inflight_bytes = max_inflight_bytes
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.evict_after_s = evict_after_s
        self.stats = ReceiverStats()
        self._write_lock = threading.Lock()
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._inflight = 0
        self._conns: dict[int, _Conn] = {}
        self._conns_lock = threading.Lock()
        self._stopping = threading.Event()
        self._log = log or log_line
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # per read, a safety net only: the reaper closes a phase past its time first
            timeout = max(header_timeout_s, body_timeout_s) + 5.0

            def log_message(self, format, *args):  # noqa: A002 (stdlib signature)
                return  # one line per problem instead (receiver._log)

            # a request line that cannot be parsed is answered with a status line, never as
            # HTTP/0.9 (a bare body)
            default_request_version = "HTTP/1.1"

            def send_error(self, code, message=None, explain=None):
                # the stdlib's messages quote the request line (input): neither the log nor
                # the answer repeats it, only the status
                if code in (414, 431):
                    receiver.stats.headers_431 += code == 431
                    why = f"request line or headers over {MAX_HEADER_BYTES:,} bytes"
                elif code == 405:
                    why = message or "method not allowed"
                else:
                    why = HTTPStatus(code).phrase.lower()
                    receiver.stats.bad_400 += code == 400
                receiver._log(f"{code} {self.client_address[0]}: {why}")
                self.close_connection = True
                try:
                    super().send_error(code, why if code == 405 else None)
                except OSError:
                    pass

            def handle_one_request(self):
                receiver._phase(self.request, "headers")
                raw = self.rfile
                self.rfile = _HeaderBudget(raw, MAX_HEADER_BYTES)
                try:
                    try:
                        self.raw_requestline = self.rfile.readline(65537)
                    except _HeadersTooLarge:
                        self.requestline, self.request_version, self.command = "", "", ""
                        self.send_error(431)
                        return
                    if not self.raw_requestline:
                        self.close_connection = True
                        return
                    if not self.parse_request():
                        return
                finally:
                    self.rfile = raw
                if receiver._closed(self.request):  # closed for its time: what came is cut
                    self.close_connection = True
                    return
                if self.command != "POST":
                    self.send_error(405, "only POST /v1/traces is received here")
                    return
                receiver._phase(self.request, "body")
                self.do_POST()
                self.wfile.flush()

            def do_POST(self):  # noqa: N802 (stdlib name)
                receiver._handle(self)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False
            request_queue_size = 128

            def verify_request(self, request, client_address):
                return receiver._admit(request, client_address[0])

            def shutdown_request(self, request):
                receiver._forget(request)
                super().shutdown_request(request)

            def handle_error(self, request, client_address):
                exc = sys.exc_info()[1]
                if isinstance(exc, (OSError, ValueError)):  # a client gone, a socket closed
                    receiver._log(f"client {client_address[0]} gone before its answer "
                                  f"({type(exc).__name__})")
                else:  # a bug: one line, never a traceback on the console of a service
                    receiver._log(f"500 {client_address[0]}: {type(exc).__name__} (a bug; "
                                  "please report it)")

        self._server = Server((host, port), Handler)
        self.host, self.port = self._server.server_address[:2]

    @property
    def url(self) -> str:
        """The traces endpoint, ``http://host:port/v1/traces``."""
        return f"http://{self.host}:{self.port}/v1/traces"

    def serve_forever(self) -> None:
        """Answer requests until :meth:`shutdown` (from another thread) or KeyboardInterrupt."""
        reaper = threading.Thread(target=self._reap, name="otlp-reaper", daemon=True)
        reaper.start()
        try:
            self._server.serve_forever(poll_interval=0.2)
        finally:
            self._stopping.set()

    def start(self) -> threading.Thread:
        """Serve in a daemon thread; returns it."""
        t = threading.Thread(target=self.serve_forever, name="otlp-receiver", daemon=True)
        t.start()
        return t

    def shutdown(self) -> None:
        """Stop serving and close the socket."""
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ connections

    def _admit(self, sock: socket.socket, address: str) -> bool:
        """Called for each new connection before its thread starts (the accepting thread)."""
        now = time.monotonic()
        with self._conns_lock:
            open_ = [c for c in self._conns.values() if not c.closed]
            if len(open_) >= self.max_connections:
                stalled = [c for c in open_ if c.phase == "headers"
                           and now - c.since >= self.evict_after_s]
                if not stalled or len(self._conns) >= 2 * self.max_connections:
                    self.stats.busy_503 += 1
                    self.stats.refused_connections += 1
                    refuse = True
                else:
                    oldest = min(stalled, key=lambda c: c.since)
                    self._close(oldest, f"closed {oldest.address}: still sending its headers "
                                        f"after {now - oldest.since:.0f} s, its place was needed")
                    refuse = False
            else:
                refuse = False
            if not refuse:
                self._conns[id(sock)] = _Conn(sock, address, "headers", now,
                                              now + self.header_timeout_s)
        if refuse:
            self._log(f"503 {address}: {self.max_connections} connections open; refused")
            body = b"too many connections, retry\n"
            try:
                sock.settimeout(0.5)
                sock.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                             b"Retry-After: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                             % (self.retry_after_s, len(body)) + body)
            except OSError:
                pass
            return False
        return True

    def _forget(self, sock: socket.socket) -> None:
        with self._conns_lock:
            self._conns.pop(id(sock), None)

    def _closed(self, sock: socket.socket) -> bool:
        with self._conns_lock:
            c = self._conns.get(id(sock))
            return c is None or c.closed

    def _phase(self, sock: socket.socket, phase: str) -> None:
        now = time.monotonic()
        limit = {"headers": self.header_timeout_s, "body": self.body_timeout_s}.get(phase)
        with self._conns_lock:
            c = self._conns.get(id(sock))
            if c is not None:
                c.phase, c.since = phase, now
                c.deadline = None if limit is None else now + limit

    def _close(self, c: _Conn, line: str, answer: bytes = b"") -> None:
        """Close a connection from outside its thread (the reader then sees the end); under
        ``_conns_lock``."""
        c.closed = True
        self.stats.closed_slow += 1
        self._log(line)
        try:
            if answer:
                c.sock.send(answer, socket.MSG_DONTWAIT)
            c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _reap(self) -> None:
        """Close connections past their phase's time (item 6), every 0.2 s."""
        while not self._stopping.wait(0.2):
            now = time.monotonic()
            with self._conns_lock:
                for c in list(self._conns.values()):
                    if c.closed or c.deadline is None or now < c.deadline:
                        continue
                    if c.phase == "headers":
                        self._close(c, f"closed {c.address}: request line and headers not in "
                                       f"within {self.header_timeout_s:g} s")
                    else:
                        self._close(c, f"408 {c.address}: body not in within "
                                       f"{self.body_timeout_s:g} s; closed",
                                    b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n"
                                    b"Connection: close\r\n\r\n")

    # ------------------------------------------------------------------ body bytes

    def _reserve(self, n: int) -> bool:
        with self._conns_lock:
            if self._inflight + n > self.max_inflight_bytes:
                return False
            self._inflight += n
            return True

    def _release(self, n: int) -> None:
        with self._conns_lock:
            self._inflight -= n

    def _read_body(self, h: BaseHTTPRequestHandler, length: int, chunked: bool,
                   held: list[int]) -> bytearray:
        """The body, reserving its bytes as they come (``held[0]`` = bytes reserved).

        Raises:
            _Refuse: 413 (over :data:`MAX_BODY_BYTES`), 503 (over the in-flight bound), 400 (a
                malformed chunk).
            _Gone: the client closed, or was closed for its time.
        """
        busy = _Refuse(503, "receiver holds its bound of body bytes, retry", retry_after=True)
        if not chunked:
            if not self._reserve(length):
                raise busy
            held[0] += length
            buf = bytearray(length)
            view, got = memoryview(buf), 0
            while got < length:
                n = h.rfile.readinto(view[got:got + _PIECE])
                if not n:
                    raise _Gone
                got += n
            return buf
        buf = bytearray()
        while True:
            line = h.rfile.readline(1026)
            if not line:
                raise _Gone
            m = _CHUNK_SIZE.fullmatch(line)
            if m is None:
                raise _Refuse(400, "malformed chunk size (hex digits, RFC 9112 7.1)")
            size = int(m.group(1), 16)
            if size == 0:
                left = MAX_HEADER_BYTES
                while (t := h.rfile.readline(min(left, 8192) + 1)) not in (b"\r\n", b"\n"):
                    left -= len(t)
                    if not t:
                        raise _Gone
                    if left < 0:
                        raise _Refuse(431, "trailer fields over the header bound")
                return buf
            if len(buf) + size > MAX_BODY_BYTES:
                raise _Refuse(413, "body larger than 64 MiB")
            if not self._reserve(size):
                raise busy
            held[0] += size
            while size:
                piece = h.rfile.read(min(size, _PIECE))
                if not piece:
                    raise _Gone
                buf += piece
                size -= len(piece)
            if h.rfile.readline(3) not in (b"\r\n", b"\n"):
                raise _Refuse(400, "malformed chunk (no CRLF after its data)")

    # ------------------------------------------------------------------ one request

    def _reply(self, h: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str,
               retry_after: bool = False) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        if retry_after:
            h.send_header("Retry-After", str(self.retry_after_s))
        if h.close_connection:
            h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        held = [0]
        try:
            self._handle_held(h, held)
        finally:
            if held[0]:
                self._release(held[0])

    def _handle_held(self, h: BaseHTTPRequestHandler, held: list[int]) -> None:
        path = h.path.split("?", 1)[0]
        ctype = (h.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        is_json = ctype == "application/json"
        out_type = "application/json" if is_json else "application/x-protobuf"
        chunked = "chunked" in (h.headers.get("Transfer-Encoding") or "").lower()
        client = h.client_address[0]
        length = _content_length(h)
        if path != "/v1/traces":
            h.close_connection = True  # its body is not read
            self._reply(h, 404, b"only /v1/traces is received here\n", "text/plain")
            return
        if not chunked and (length < 0 or length > MAX_BODY_BYTES):
            h.close_connection = True  # the rest of the body is not read
            if length > 0:
                self.stats.too_large_413 += 1
                self._log(f"413 {client}: Content-Length over {MAX_BODY_BYTES:,} bytes")
                self._reply(h, 413, b"body larger than 64 MiB\n", "text/plain")
            else:
                self.stats.bad_400 += 1
                self._log(f"400 {client}: bad Content-Length")
                self._reply(h, 400, b"bad Content-Length\n", "text/plain")
            return
        if length == 0 and not chunked:
            self.stats.bad_400 += 1
            self._reply(h, 411, b"Content-Length required\n", "text/plain")
            return
        if ctype not in ("application/json", "application/x-protobuf"):
            h.close_connection = True
            self._reply(h, 415, b"Content-Type must be application/x-protobuf or "
                                b"application/json\n", "text/plain")
            return
        bad_enc = _unsupported_encoding(h)
        if bad_enc is not None:
            h.close_connection = True  # its body is not read
            self._log(f"415 {client}: {bad_enc}")
            self._reply(h, 415, _status_body(bad_enc, is_json), out_type)
            return
        try:
            body: bytes | bytearray = self._read_body(h, length, chunked, held)
            enc = (h.headers.get("Content-Encoding") or "").strip().lower()  # one, known
            if enc in ("gzip", "deflate"):
                body = inflate_bounded(body, enc, reserve=self._reserver(held))
                if body is None:  # a gzip bomb: the bound holds after decompression too
                    raise _Refuse(413, "body larger than 64 MiB after decompression")
            self._phase(h.request, "work")
            got = decode_request(body, is_json=is_json)
        except (_Gone, TimeoutError):  # the reaper closed it (and answered 408), or a read
            h.close_connection = True   # outlived even the safety net
            return
        except _Refuse as r:
            h.close_connection = True
            if r.code == 503:
                self.stats.busy_503 += 1
            elif r.code == 413:
                self.stats.too_large_413 += 1
            elif r.code == 431:
                self.stats.headers_431 += 1
            else:
                self.stats.bad_400 += 1
            self._log(f"{r.code} {client}: {r.message}")
            self._reply(h, r.code, _status_body(r.message, is_json), out_type,
                        retry_after=r.retry_after)
            return
        except (OtlpDecodeError, OSError, EOFError, zlib.error) as exc:
            self.stats.bad_400 += 1
            self._log(f"400 {client}: {exc}")
            self._reply(h, 400, _status_body(str(exc), is_json), out_type)
            return
        del body

        with self._pending_lock:
            if self._pending >= self.max_pending:
                self.stats.busy_429 += 1
                busy = True
            else:
                self._pending += 1
                busy = False
        if busy:
            self._log(f"429 {client}: {self.max_pending} requests already waiting")
            self._reply(h, 429, _status_body("too many requests waiting", is_json), out_type,
                        retry_after=True)
            return
        try:
            stored = self._store(got)
        except (StoreLocked, StoreFull) as exc:  # retryable: nothing of it was stored
            self.stats.busy_503 += 1
            self._log(f"503 {client}: {exc}")
            why = "store full, retry" if isinstance(exc, StoreFull) else "store locked, retry"
            self._reply(h, 503, _status_body(why, is_json), out_type, retry_after=True)
            return
        finally:
            with self._pending_lock:
                self._pending -= 1
        self.stats.requests += 1
        self.stats.spans_added += stored.added
        self.stats.spans_duplicate += stored.duplicate
        self.stats.spans_rejected += stored.rejected
        resp = ExportTraceServiceResponse()
        if stored.rejected:
            resp.partial_success.rejected_spans = stored.rejected
            resp.partial_success.error_message = f"{stored.rejected} span(s) quarantined; first: " \
                                                 f"{stored.first_problem}"
            self._log(f"200 {client}: {resp.partial_success.error_message}")
        payload = (json_format.MessageToJson(resp).encode() if is_json
                   else resp.SerializeToString())
        self._reply(h, 200, payload, out_type)

    def _reserver(self, held: list[int]) -> Callable[[int], bool]:
        def reserve(n: int) -> bool:
            if not self._reserve(n):
                return False
            held[0] += n
            return True
        return reserve

    def _store(self, got: PartialRequest) -> StoredRequest:
        from prefixscope.store import db as store_db

        deadline = time.monotonic() + self.lock_timeout_s
        # One writer at a time in this process; the wait counts against the lock timeout.
        if not self._write_lock.acquire(timeout=self.lock_timeout_s):
            raise StoreLocked("another request of this receiver holds the store")
        try:
            left = max(0.05, deadline - time.monotonic())
            with store_db.writer(self.db_path, lock_timeout_s=left) as con:
                return store_otlp_request(con, got.request, self.opts, location=self.url,
                                          rejected=got.rejected)
        finally:
            self._write_lock.release()


def inflate_bounded(body: bytes | bytearray, encoding: str, limit: int = MAX_BODY_BYTES, *,
                    reserve: Callable[[int], bool] | None = None) -> bytes | None:
    """A ``gzip`` or ``deflate`` body decompressed to at most ``limit`` bytes; None when it
    would be larger (a 64 MiB gzip of zeros is 64 GiB: never held whole).

    Args:
        reserve: called with each 1 MiB piece's size before it is kept (the receiver's
            in-flight bound); False stops with a 503.

    Raises:
        zlib.error: not gzip/zlib data, or cut short.
        _Refuse: ``reserve`` said no (503).
    """
    # wbits 31: a gzip member; 15: a zlib stream (HTTP "deflate", RFC 9110 8.4.1.2)
    d = zlib.decompressobj(31 if encoding == "gzip" else 15)
    out = bytearray()
    data: bytes | bytearray = body
    while True:
        piece = d.decompress(data, _PIECE)
        data = d.unconsumed_tail
        if len(out) + len(piece) > limit:
            return None
        if piece and reserve is not None and not reserve(len(piece)):
            raise _Refuse(503, "receiver holds its bound of body bytes, retry", retry_after=True)
        out += piece
        if d.eof or not (piece or data):
            break
    if not d.eof:
        raise zlib.error("compressed data cut short")
    return bytes(out)


def _status_body(message: str, is_json: bool) -> bytes:
    """A ``google.rpc.Status`` body (message only: field 2, a string) in the request's
    encoding. Written by hand: its generated class lives in googleapis-common-protos, which
    ``opentelemetry-proto`` does not require."""
    if is_json:
        import json

        return json.dumps({"message": message}).encode()
    raw = message.encode()
    n, varint = len(raw), bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        varint.append(b | (0x80 if n else 0))
        if not n:
            break
    return b"\x12" + bytes(varint) + raw
