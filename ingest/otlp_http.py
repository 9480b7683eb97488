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
3. A body that is not an OTLP trace request -> 400 (not retryable); a span with a bad usage
   attribute is quarantined and reported in ``partial_success.rejected_spans``; the others are
   stored and the answer is 200.
4. The response body is an ``ExportTraceServiceResponse`` in the request's encoding.

One write at a time (a lock in this process): DuckDB allows one writer per file, and each
request opens the store, commits and closes it (``store/db.py`` rule 1), so the dashboard can
read between requests. The stdlib ``http.server`` (threading) is enough for a collector's few
concurrent exports.
"""

from __future__ import annotations

import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from prefixscope.core.errors import StoreLocked
from prefixscope.ingest.genai_spans import OtlpDecodeError, decode_json, decode_protobuf
from prefixscope.ingest.otlp import SpanOptions, StoredRequest, store_otlp_request

#: Largest accepted body after decompression (the collector's default batch is far smaller).
MAX_BODY_BYTES = 64 << 20


@dataclass
class ReceiverStats:
    """Counters of a running receiver (read by tests and the CLI's closing line)."""

    requests: int = 0
    spans_added: int = 0
    spans_duplicate: int = 0
    spans_rejected: int = 0
    busy_503: int = 0
    busy_429: int = 0
    bad_400: int = 0


class OtlpReceiver:
    """An OTLP/HTTP trace receiver writing into the DuckDB file ``db_path``.

    Args:
        db_path: the store (opened per request, closed after commit).
        host, port: where to listen (port 0: any free port; see :attr:`port`).
        opts: how spans become rows.
        lock_timeout_s: how long one request waits for the store's lock before 503.
        retry_after_s: the ``Retry-After`` seconds sent with 429 and 503.
        max_pending: requests that may wait for the write lock before 429.
        log: one line per answered request that was not a plain 200 (default: stderr).
    """

    def __init__(self, db_path: str, *, host: str = "127.0.0.1", port: int = 4318,
                 opts: SpanOptions = SpanOptions(), lock_timeout_s: float = 2.0,
                 retry_after_s: int = 1, max_pending: int = 8,
                 log: Callable[[str], None] | None = None):
        self.db_path = db_path
        self.opts = opts
        self.lock_timeout_s = lock_timeout_s
        self.retry_after_s = retry_after_s
        self.max_pending = max_pending
        self.stats = ReceiverStats()
        self._write_lock = threading.Lock()
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 (stdlib signature)
                return  # one line per problem instead (receiver._log)

            def do_POST(self):  # noqa: N802 (stdlib name)
                receiver._handle(self)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]

    @property
    def url(self) -> str:
        """The traces endpoint, ``http://host:port/v1/traces``."""
        return f"http://{self.host}:{self.port}/v1/traces"

    def serve_forever(self) -> None:
        """Answer requests until :meth:`shutdown` (from another thread) or KeyboardInterrupt."""
        self._server.serve_forever(poll_interval=0.2)

    def start(self) -> threading.Thread:
        """Serve in a daemon thread; returns it."""
        t = threading.Thread(target=self.serve_forever, name="otlp-receiver", daemon=True)
        t.start()
        return t

    def shutdown(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ one request

    def _reply(self, h: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str,
               retry_after: bool = False) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        if retry_after:
            h.send_header("Retry-After", str(self.retry_after_s))
        h.end_headers()
        h.wfile.write(body)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        ctype = (h.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        is_json = ctype == "application/json"
        out_type = "application/json" if is_json else "application/x-protobuf"
        chunked = "chunked" in (h.headers.get("Transfer-Encoding") or "").lower()
        try:
            length = int(h.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if chunked:
            body = _read_chunked(h.rfile)
            length = len(body) if body is not None else MAX_BODY_BYTES + 1
        else:
            body = h.rfile.read(length) if 0 < length <= MAX_BODY_BYTES else b""
        if path != "/v1/traces":
            self._reply(h, 404, b"only /v1/traces is received here\n", "text/plain")
            return
        if length < 0 or length > MAX_BODY_BYTES:
            self.stats.bad_400 += 1
            h.close_connection = True  # the rest of the body is not read
            self._reply(h, 413 if length > 0 else 400, b"bad Content-Length\n", "text/plain")
            return
        if length == 0 and not chunked:
            self.stats.bad_400 += 1
            self._reply(h, 411, b"Content-Length required\n", "text/plain")
            return
        if ctype not in ("application/json", "application/x-protobuf"):
            self._reply(h, 415, b"Content-Type must be application/x-protobuf or "
                                b"application/json\n", "text/plain")
            return
        try:
            enc = (h.headers.get("Content-Encoding") or "").strip().lower()
            if enc in ("gzip", "deflate"):
                body = inflate_bounded(body, enc)
                if body is None:  # a gzip bomb: the bound holds after decompression too
                    self.stats.bad_400 += 1
                    self._reply(h, 413, b"body larger than 64 MiB after decompression\n",
                                "text/plain")
                    return
            req = decode_json(body) if is_json else decode_protobuf(body)
        except (OtlpDecodeError, OSError, EOFError, zlib.error) as exc:
            self.stats.bad_400 += 1
            self._log(f"400 {h.client_address[0]}: {exc}")
            self._reply(h, 400, _status_body(str(exc), is_json), out_type)
            return

        with self._pending_lock:
            if self._pending >= self.max_pending:
                self.stats.busy_429 += 1
                busy = True
            else:
                self._pending += 1
                busy = False
        if busy:
            self._log(f"429 {h.client_address[0]}: {self.max_pending} requests already waiting")
            self._reply(h, 429, _status_body("too many requests waiting", is_json), out_type,
                        retry_after=True)
            return
        try:
            stored = self._store(req)
        except StoreLocked as exc:
            self.stats.busy_503 += 1
            self._log(f"503 {h.client_address[0]}: {exc}")
            self._reply(h, 503, _status_body("store locked, retry", is_json), out_type,
                        retry_after=True)
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
            self._log(f"200 {h.client_address[0]}: {resp.partial_success.error_message}")
        payload = (json_format.MessageToJson(resp).encode() if is_json
                   else resp.SerializeToString())
        self._reply(h, 200, payload, out_type)

    def _store(self, req) -> StoredRequest:
        from prefixscope.store import db as store_db

        deadline = time.monotonic() + self.lock_timeout_s
        # One writer at a time in this process; the wait counts against the lock timeout.
        if not self._write_lock.acquire(timeout=self.lock_timeout_s):
            raise StoreLocked("another request of this receiver holds the store")
        try:
            left = max(0.05, deadline - time.monotonic())
            with store_db.writer(self.db_path, lock_timeout_s=left) as con:
                return store_otlp_request(con, req, self.opts, location=self.url)
        finally:
            self._write_lock.release()


def inflate_bounded(body: bytes, encoding: str, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """A ``gzip`` or ``deflate`` body decompressed to at most ``limit`` bytes; None when it
    would be larger (a 64 MiB gzip of zeros is 64 GiB: never held whole).

    Raises:
        zlib.error: not gzip/zlib data, or cut short.
    """
    # wbits 31: a gzip member; 15: a zlib stream (HTTP "deflate", RFC 9110 8.4.1.2)
    d = zlib.decompressobj(31 if encoding == "gzip" else 15)
    out = d.decompress(body, limit + 1)
    if len(out) > limit:
        return None
    out += d.flush()
    if len(out) > limit:
        return None
    if not d.eof:
        raise zlib.error("compressed data cut short")
    return out


def _read_chunked(rfile) -> bytes | None:
    """An HTTP/1.1 chunked body (RFC 9112 section 7.1), or None past :data:`MAX_BODY_BYTES`
    or when malformed."""
    parts, total = [], 0
    while True:
        line = rfile.readline(1024)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            return None
        if size == 0:
            while rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                pass  # trailer fields
            return b"".join(parts)
        total += size
        if total > MAX_BODY_BYTES:
            return None
        parts.append(rfile.read(size))
        rfile.readline(8)  # CRLF after the chunk


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
