"""The upstream HTTP/1.1 client of the hot path: keep-alive connections on raw asyncio with
httptools' C response parser (what uvicorn parses requests with).

The gateway sends one kind of request upstream (``POST`` a JSON body, read a JSON answer or an
SSE stream), so this client does only that, with the costs of a general client left out (per
request: no cookie jar, no tracing hooks, no header multidicts, no timer per received chunk).
Measured against aiohttp on the paced benchmark (``docs/benchmarks.md``).

- **Pool**: at most ``limit`` connections over all upstreams; an idle keep-alive connection
  is reused (newest first) unless the upstream closed it or it has been idle for
  ``keepalive_s``; a request waits for a free slot at most ``connect_timeout_s``.
- **Timeouts**: ``connect_timeout_s`` for the slot and the TCP connect, ``read_timeout_s``
  between any two reads (the answer's head and each body read): :class:`TimeoutError`.
- **TLS**: ``https://`` upstreams are verified against the system's CAs (or the given
  ``ssl_context``); a failed handshake is ``upstream_error``.
- **Errors**: :class:`UpstreamError` with ``kind`` ``upstream_error`` (cannot connect) or
  ``upstream_dropped`` (the connection closed or the answer could not be parsed before its
  end). A connection is reused only after an answer read to its end with keep-alive.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

import httptools


class UpstreamError(Exception):
    """A failed upstream request: ``kind`` is ``upstream_error`` (no connection) or
    ``upstream_dropped`` (the connection ended or broke the protocol before the answer's end)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class UpstreamResponse:
    """One answer: ``status``, ``raw_headers`` (name, value bytes as received), ``content``
    (the body as it arrives: ``iter_any``, ``at_eof``; aiohttp-shaped), :meth:`read`,
    :meth:`release` (the connection back to the pool when the answer was read to its end),
    :meth:`close` (drop the connection; a waiting read ends with ``upstream_dropped``).

    No reference cycle is made per request (``content`` is the response itself, not an
    object pointing back at it): what a request allocates is freed by reference counting,
    so the cyclic garbage collector has nothing to find (``docs/benchmarks.md``, gateway
    round 5: a young collection was ~3 ms on the event loop)."""

    __slots__ = ("status", "raw_headers", "_conn", "_chunks", "_eof", "_exc",
                 "_waiter", "_head", "_keep_alive", "_done", "_timeout")

    def __init__(self, conn: _Conn, timeout: float) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._conn = conn
        self._chunks: list[bytes] = []
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._head: asyncio.Future = conn.loop.create_future()
        self._keep_alive = False
        self._done = False
        self._timeout = timeout

    @property
    def content(self) -> UpstreamResponse:
        """The body as it arrives (:meth:`iter_any`, :meth:`at_eof`): the response itself."""
        return self

    def at_eof(self) -> bool:
        """The answer ended and everything received was read."""
        return self._eof and not self._chunks

    async def iter_any(self):
        """Each piece of the body as received (several received pieces joined when they
        were waiting together)."""
        while True:
            data = await self._next()
            if not data:
                return
            yield data

    # ---- fed by the connection
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._eof:
            return
        self._exc = exc
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: a failed head is raised by post()
        self._wake()

    # ---- read by the gateway
    async def _wait(self, fut: asyncio.Future) -> None:
        loop = self._conn.loop
        timer = loop.call_later(self._timeout, _expire, fut)
        try:
            await fut
        finally:
            timer.cancel()

    async def _next(self) -> bytes:
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            self._waiter = self._conn.loop.create_future()
            try:
                await self._wait(self._waiter)
            finally:
                self._waiter = None
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        return data

    async def read(self) -> bytes:
        """The whole body (waits for its end)."""
        out = []
        while True:
            data = await self._next()
            if not data:
                return b"".join(out)
            out.append(data)

    def release(self) -> None:
        """Give the connection back (answer read to its end, keep-alive) or close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._eof and self._exc is None and self._keep_alive and not self._chunks:
            conn.pool._put(conn)
        else:
            conn.pool._drop(conn)

    def close(self) -> None:
        """Drop the connection now (a read waiting on it ends with ``upstream_dropped``)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.pool._drop(conn)
        self._fail(UpstreamError("upstream_dropped", "closed by the gateway"))

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(self, *exc) -> None:
        self.release()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError("upstream read timeout"))


class _Conn(asyncio.Protocol):
    """One keep-alive connection; httptools parses the answers."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int, bool]) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: UpstreamResponse | None = None
        self.closed = False
        self.counted_out = False  # its pool slot given back
        self.idle_since = 0.0

    # asyncio callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.resp is None:  # bytes outside an answer: the connection is unusable
            self.closed = True
            self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp = self.resp
            self.closed = True
            self.transport.close()
            if resp is not None:
                resp._fail(UpstreamError("upstream_dropped", f"bad HTTP answer ({exc})"))

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.parser = None  # the parser holds this protocol's callbacks: no cycle left behind
        resp = self.resp
        if resp is not None and not resp._eof:
            resp._fail(UpstreamError("upstream_dropped",
                                     "the upstream closed the connection before the answer's end"))
        self.pool._lost(self)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.resp.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        resp = self.resp
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: an interim answer, the real head follows
            resp.raw_headers = []
            return
        resp.status = status
        resp._keep_alive = self.parser.should_keep_alive()
        if not resp._head.done():
            resp._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        resp._chunks.append(body)
        resp._wake()

    def on_message_complete(self) -> None:
        resp = self.resp
        if resp.status < 200:
            return
        resp._eof = True
        self.resp = None
        if not resp._head.done():
            resp._head.set_result(None)
        resp._wake()


class UpstreamPool:
    """Keep-alive connections to the upstreams (module docstring).

    Args:
        limit: most connections open at once, over all upstreams.
        connect_timeout_s: wait for a free connection and TCP connect (seconds).
        read_timeout_s: wait between two reads of an answer (seconds).
        keepalive_s: an idle connection older than this is closed instead of reused.
        ssl_context: for ``https://`` upstreams (default: the system's trusted CAs,
            ``ssl.create_default_context``).
    """

    def __init__(self, *, limit: int, connect_timeout_s: float, read_timeout_s: float,
                 keepalive_s: float = 4.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int, bool], deque[_Conn]] = {}
        self._open = 0
        self._slot_waiters: deque[asyncio.Future] = deque()
        self._heads: dict[str, tuple[tuple[str, int, bool], bytes]] = {}
        self._closed = False
        self._ssl = ssl_context

    def _target(self, base: str) -> tuple[tuple[str, int, bool], bytes]:
        t = self._heads.get(base)
        if t is None:
            u = urlsplit(base)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise UpstreamError("upstream_error", f"unsupported upstream URL {base!r}")
            tls = u.scheme == "https"
            port = u.port or (443 if tls else 80)
            host = u.hostname if ":" not in u.hostname else f"[{u.hostname}]"
            t = self._heads[base] = ((u.hostname, port, tls),
                                     f"Host: {host}:{port}\r\n".encode("latin-1"))
        return t

    async def post(self, base: str, path: str, body: bytes, headers: dict[str, str]
                   ) -> UpstreamResponse:
        """``POST base+path`` with ``body``; returns once the answer's head arrived.

        Raises:
            UpstreamError: no connection, or the connection ended before the head.
            TimeoutError: no free connection or no connect within ``connect_timeout_s``, or
                no head within ``read_timeout_s``.
        """
        key, host = self._target(base)
        conn = await self._acquire(key)
        resp = UpstreamResponse(conn, self.read_timeout_s)
        conn.resp = resp
        head = [b"POST ", path.encode("latin-1"), b" HTTP/1.1\r\n", host,
                b"Content-Length: ", str(len(body)).encode(), b"\r\n"]
        for k, v in headers.items():
            head += (k.encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n")
        head += (b"\r\n", body)
        conn.transport.write(b"".join(head))
        try:
            await resp._wait(resp._head)
        except BaseException:
            resp.close()
            raise
        return resp

    async def _acquire(self, key: tuple[str, int, bool]) -> _Conn:
        if self._closed:
            raise UpstreamError("upstream_error", "the gateway is shutting down")
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            self._drop(conn)
        deadline = self.loop.time() + self.connect_timeout_s
        while self._open >= self.limit:
            fut = self.loop.create_future()
            self._slot_waiters.append(fut)
            try:
                async with asyncio.timeout_at(deadline):
                    await fut
            except TimeoutError:
                raise TimeoutError("no free upstream connection within the connect timeout"
                                   ) from None
            finally:
                if fut in self._slot_waiters:
                    self._slot_waiters.remove(fut)
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if not conn.closed and time.monotonic() - conn.idle_since < self.keepalive_s:
                    return conn
                self._drop(conn)
        self._open += 1
        try:
            async with asyncio.timeout_at(deadline):
                host, port, tls = key
                if tls and self._ssl is None:
                    self._ssl = ssl.create_default_context()
                _, conn = await self.loop.create_connection(
                    lambda: _Conn(self, key), host, port, ssl=self._ssl if tls else None)
        except TimeoutError:
            self._release_slot()
            raise
        except OSError as exc:
            self._release_slot()
            raise UpstreamError("upstream_error", f"cannot connect ({exc.strerror or exc})"
                                ) from None
        except BaseException:
            self._release_slot()
            raise
        return conn

    def _release_slot(self) -> None:
        self._open -= 1
        while self._slot_waiters:
            fut = self._slot_waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                break

    def _put(self, conn: _Conn) -> None:
        if conn.closed or self._closed:
            self._drop(conn)
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, deque()).append(conn)
        # a waiter for a slot may use this idle connection
        while self._slot_waiters:
            fut = self._slot_waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                break

    def _drop(self, conn: _Conn) -> None:
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.close()
        if not conn.counted_out:
            conn.counted_out = True
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._release_slot()

    def _lost(self, conn: _Conn) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            self._drop(conn)

    async def close(self) -> None:
        """Close every connection (idle ones now; busy ones when their answers are released)."""
        self._closed = True
        for idle in self._idle.values():
            while idle:
                self._drop(idle.pop())
