"""The gateway's upstream client (``gateway/upstream_client.py``) against real TCP servers on
raw asyncio: keep-alive reuse, ``Connection: close``, chunked and Content-Length bodies, a
garbage answer, a connection cut mid-body, the read timeout between reads, the pool limit and
its wait bounded by the connect timeout, an unreachable upstream, an https upstream (trusted
and not)."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from prefixscope.gateway.upstream_client import UpstreamError, UpstreamPool
from tests.alerts_support import self_signed_cert

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
CHUNKED = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
           b"\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")


async def _server(answer, tls: ssl.SSLContext | None = None):
    """A server calling ``answer(request_bytes, writer)`` for each request; returns (server,
    base URL, list of connection counts)."""
    conns = []

    async def handle(reader, writer):
        conns.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                req = head + await reader.readexactly(n)
                if await answer(req, writer) == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    return server, f"{'https' if tls else 'http'}://127.0.0.1:{port}", conns


def _run(coro):
    return asyncio.run(coro)


def test_keep_alive_reuse_chunked_and_connection_close():
    async def main():
        async def answer(req, w):
            if b"/close" in req:
                w.write(OK.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1))
                await w.drain()
                return "close"
            w.write(CHUNKED if b"/chunked" in req else OK)
            await w.drain()

        server, base, conns = await _server(answer)
        pool = UpstreamPool(limit=4, connect_timeout_s=1, read_timeout_s=1)
        for _ in range(3):
            r = await pool.post(base, "/json", b"{}", {"content-type": "application/json"})
            assert r.status == 200 and await r.read() == b"{}"
            assert (b"content-type", b"application/json") in r.raw_headers
            r.release()
        r = await pool.post(base, "/chunked", b"{}", {})
        assert [c async for c in r.content.iter_any()] in ([b"hello world"],
                                                           [b"hello", b" world"])
        assert r.content.at_eof()
        r.release()
        assert len(conns) == 1  # one connection for all four
        r = await pool.post(base, "/close", b"{}", {})
        assert await r.read() == b"{}"
        r.release()
        r = await pool.post(base, "/json", b"{}", {})
        assert await r.read() == b"{}"
        r.release()
        assert len(conns) == 2  # the closed one was not reused
        await pool.close()
        server.close()

    _run(main())


def test_garbage_cut_body_and_read_timeout():
    async def main():
        async def answer(req, w):
            if b"/garbage" in req:
                w.write(b"SMTP ready\r\n\r\n")
            elif b"/cut" in req:
                w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
                await w.drain()
                return "close"
            elif b"/stall" in req:
                w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
                await w.drain()
                await asyncio.sleep(5)
            await w.drain()

        server, base, _ = await _server(answer)
        pool = UpstreamPool(limit=4, connect_timeout_s=1, read_timeout_s=0.3)
        with pytest.raises(UpstreamError) as e:
            await pool.post(base, "/garbage", b"{}", {})
        assert e.value.kind == "upstream_dropped"
        r = await pool.post(base, "/cut", b"{}", {})
        with pytest.raises(UpstreamError) as e:
            await r.read()
        assert e.value.kind == "upstream_dropped"
        r.release()
        r = await pool.post(base, "/stall", b"{}", {})
        it = r.content.iter_any()
        assert await it.__anext__() == b"abc"
        with pytest.raises(TimeoutError):
            await it.__anext__()
        r.release()
        assert pool._open == 0  # every failed connection gave its slot back
        await pool.close()
        server.close()

    _run(main())


def test_pool_limit_waits_at_most_the_connect_timeout_and_unreachable_is_an_error():
    async def main():
        gate = asyncio.Event()

        async def answer(req, w):
            await gate.wait()
            w.write(OK)
            await w.drain()

        server, base, conns = await _server(answer)
        pool = UpstreamPool(limit=1, connect_timeout_s=0.3, read_timeout_s=5)
        first = asyncio.ensure_future(pool.post(base, "/a", b"{}", {}))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):  # the only connection is busy
            await pool.post(base, "/b", b"{}", {})
        second = asyncio.ensure_future(pool.post(base, "/c", b"{}", {}))
        await asyncio.sleep(0.05)
        gate.set()
        r = await first
        assert await r.read() == b"{}"
        r.release()  # the waiting request gets this connection
        r = await second
        assert await r.read() == b"{}"
        r.release()
        assert len(conns) == 1
        await pool.close()
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamError) as e:
            await UpstreamPool(limit=1, connect_timeout_s=1, read_timeout_s=1).post(
                base, "/x", b"{}", {})
        assert e.value.kind == "upstream_error"

    _run(main())


def test_https_upstream_verified(tmp_path):
    cert, key = self_signed_cert(tmp_path)

    async def main():
        async def answer(req, w):
            w.write(OK)
            await w.drain()

        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(cert, key)
        server, base, _ = await _server(answer, server_ctx)
        trusting = UpstreamPool(limit=2, connect_timeout_s=2, read_timeout_s=2,
                                ssl_context=ssl.create_default_context(cafile=str(cert)))
        r = await trusting.post(base, "/v1/chat/completions", b"{}", {})
        assert r.status == 200 and await r.read() == b"{}"
        r.release()
        await trusting.close()
        with pytest.raises(UpstreamError) as e:  # the system's CAs do not know this certificate
            await UpstreamPool(limit=2, connect_timeout_s=2, read_timeout_s=2).post(
                base, "/v1/chat/completions", b"{}", {})
        assert e.value.kind == "upstream_error"
        server.close()

    _run(main())
