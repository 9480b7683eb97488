"""Slow, stalled and endless clients against a real gateway (uvicorn with the gateway's own
protocol, ``gateway/server.py``) over raw sockets: headers trickled (slowloris), half-open
connections, a body at a few bytes a second, a Content-Length above the body sent, endless
chunks under and over the size limit, a chunk size past the bound (answered at once), and
the connection cap. Each ends with a 408/413/503
answer and the connection closed within the configured time, never a held connection."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.gateway_support import (
    ADMIN_TOKEN,
    CHAT,
    TENANTS,
    RunningGateway,
    gateway_config,
    headers_for,
    loopback_upstream,
    read_jsonl,
)

BODY = json.dumps(CHAT).encode()
HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TENANTS["acme"].encode() + b"\r\nContent-Type: application/json\r\n")
HEADER_S, BODY_S = 1.0, 1.5


@pytest.fixture
def upstream():
    with loopback_upstream() as app_and_control:
        yield app_and_control


@pytest.fixture
def gw(tmp_path, upstream):
    g = RunningGateway(gateway_config(tmp_path, upstream[0].url, max_body_bytes=4096,
                                      client_header_timeout_s=HEADER_S,
                                      client_body_timeout_s=BODY_S))
    yield g
    g.stop()


def _connect(gw) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=15)
    return s


def _read_to_close(s: socket.socket, limit_s: float = 15) -> bytes:
    """Everything the gateway sends until it closes the connection (fails after limit_s)."""
    out, t0 = b"", time.monotonic()
    while True:
        assert time.monotonic() - t0 < limit_s, f"connection still open: {out[:200]!r}"
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            return out
        if not b:
            return out
        out += b


def _trickle(s: socket.socket, pieces, every_s: float, stop: threading.Event) -> None:
    for p in pieces:
        if stop.is_set():
            return
        try:
            s.sendall(p)
        except OSError:
            return
        time.sleep(every_s)


def _client_errors(gw, code: str) -> float:
    return gw.gw.metrics.client_errors.labels(code)._value.get()


def _decisions(tmp_path):
    return read_jsonl(tmp_path / "logs" / "decisions.jsonl")


def test_slowloris_headers_get_a_408_and_the_connection_closed(gw):
    s = _connect(gw)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    stop = threading.Event()
    t = threading.Thread(target=_trickle, args=(s, [b"X-a%d: b\r\n" % i for i in range(60)],
                                                0.2, stop), daemon=True)
    t0 = time.monotonic()
    t.start()
    out = _read_to_close(s)
    took = time.monotonic() - t0
    stop.set()
    assert out.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in out.lower()
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "client_timeout"
    assert HEADER_S * 0.9 <= took < HEADER_S + 5
    assert _client_errors(gw, "client_timeout") == 1


def test_half_open_connections_are_closed_and_normal_requests_still_served(gw):
    socks = [_connect(gw) for _ in range(200)]
    for s in socks:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                   timeout=10)
    assert r.status_code == 200
    t0 = time.monotonic()
    outs = [_read_to_close(s) for s in socks]
    assert time.monotonic() - t0 < HEADER_S + 10
    assert all(o.startswith(b"HTTP/1.1 408 ") for o in outs)
    assert _client_errors(gw, "client_timeout") == 200
    for s in socks:
        s.close()


@pytest.mark.parametrize("case", ["slow_body", "content_length_short", "chunked_slow"])
def test_a_body_that_does_not_arrive_in_time_is_a_408_with_a_record(tmp_path, gw, case):
    s = _connect(gw)
    stop = threading.Event()
    if case == "slow_body":  # all of it, but 1 byte every 0.1 s (would take 8 s)
        s.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY))
        pieces = [BODY[i:i + 1] for i in range(len(BODY))]
    elif case == "content_length_short":  # claims 1,000 bytes more than it sends, then waits
        s.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % (len(BODY) + 1000) + BODY)
        pieces = []
    else:  # one-byte chunks forever, far under the size limit
        s.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        pieces = [b"1\r\n \r\n"] * 200
    t = threading.Thread(target=_trickle, args=(s, pieces, 0.1, stop), daemon=True)
    t0 = time.monotonic()
    t.start()
    out = _read_to_close(s)
    took = time.monotonic() - t0
    stop.set()
    assert out.startswith(b"HTTP/1.1 408 "), out[:200]
    err = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["code"] == "client_timeout" and "client_body_timeout_s (1.5 s)" in err["message"]
    assert BODY_S * 0.9 <= took < BODY_S + 5
    assert _client_errors(gw, "client_timeout") == 1
    assert gw.admin("/admin/state")["requests_in_flight"] == 0
    gw.stop()
    assert [d["error"] for d in _decisions(tmp_path)] == ["client_timeout"]


def test_an_endless_chunked_body_gets_a_413_and_is_not_read_on(tmp_path, gw):
    s = _connect(gw)
    s.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
    sent = {"bytes": 0, "stopped": None}
    t0 = time.monotonic()

    def flood() -> None:
        chunk = b"10000\r\n" + b"a" * 65536 + b"\r\n"
        try:
            while time.monotonic() - t0 < 20:
                s.sendall(chunk)
                sent["bytes"] += 65536
        except OSError:
            sent["stopped"] = time.monotonic() - t0

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    out = _read_to_close(s)
    t.join(30)
    assert out.startswith(b"HTTP/1.1 413 "), out[:200]
    assert b"connection: close" in out.lower()
    # the gateway closed the connection: the client's sends fail within seconds, not 20 s on
    assert sent["stopped"] is not None and sent["stopped"] < 10, sent
    gw.stop()
    assert [d["error"] for d in _decisions(tmp_path)] == ["too_large"]


@pytest.mark.parametrize("case, sent, statuses", [
    ("2p64", b"10000000000000000\r\n", (400, 413)),
    ("2p64-no-crlf", b"10000000000000000", (400, 413)),
    ("4-gib", b"ffffffff\r\n", (413,)),
    ("4-gib-no-crlf", b"ffffffff", (413,)),
    ("ext", b"ffffffff;name=value\r\n", (413,)),
    ("sum-past", b"1000\r\n" + b"a" * 4096 + b"\r\n1\r\n", (413,)),
    ("admin", b"ffffffff\r\n", (413,)),
])
def test_a_chunk_size_past_the_bound_is_refused_at_once(tmp_path, gw, case, sent, statuses):
    head = HEAD if case != "admin" else (
        b"POST /admin/revoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + ADMIN_TOKEN.encode() + b"\r\nContent-Type: application/json\r\n")
    s = _connect(gw)
    t0 = time.monotonic()
    s.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n" + sent)  # then waits, open
    out = _read_to_close(s)
    took = time.monotonic() - t0
    status = int(out.split(b" ", 2)[1])
    assert status in statuses, out[:300]
    assert took < BODY_S, took  # at once: never the body deadline
    if status == 413:
        err = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]
        assert err["code"] == "too_large" and "past its bound" in err["message"]
        assert b"retry-after: 1" in out.lower()
    # a chunked body within the bound is still served
    body = json.dumps(CHAT).encode()
    s = _connect(gw)
    s.sendall(HEAD + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
              + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    assert _read_to_close(s).startswith(b"HTTP/1.1 200 ")
    gw.stop()
    if status == 413 and case != "admin":
        assert sorted(str(d.get("error")) for d in _decisions(tmp_path)) == ["None",
                                                                           "too_large"]


def test_above_max_connections_a_request_is_a_503_at_once(tmp_path, upstream):
    g = RunningGateway(gateway_config(tmp_path, upstream[0].url, max_connections=4,
                                      client_header_timeout_s=30))
    try:
        held = [_connect(g) for _ in range(4)]
        time.sleep(0.3)  # accepted by the server
        t0 = time.monotonic()
        r = httpx.post(g.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                       timeout=10)
        assert r.status_code == 503 and time.monotonic() - t0 < 5
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while True:
            r = httpx.post(g.url + "/v1/chat/completions", json=CHAT,
                           headers=headers_for("acme"), timeout=10)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r.status_code == 200
    finally:
        g.stop()


# --------------------------------------------------------------------------- bounds (issue 27)

def _status_and_headers(out: bytes) -> tuple[int, dict[str, str]]:
    head = out.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    hdrs = {}
    for line in head[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return int(head[0].split()[1]), hdrs


def test_headers_above_max_header_bytes_get_a_431_and_the_connection_closed(tmp_path, upstream,
                                                                          caplog):
    import logging

    g = RunningGateway(gateway_config(tmp_path, upstream[0].url, max_header_bytes=16384,
                                      client_header_timeout_s=30))
    try:
        s = _connect(g)
        sent = {"bytes": 0}

        def flood() -> None:  # one header value that never ends (16 MiB offered)
            try:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-big: ")
                for _ in range(256):
                    s.sendall(b"a" * 65536)
                    sent["bytes"] += 65536
            except OSError:
                pass

        with caplog.at_level(logging.WARNING, logger="prefixscope.gateway"):
            t = threading.Thread(target=flood, daemon=True)
            t.start()
            out = _read_to_close(s)
            t.join(30)
        status, hdrs = _status_and_headers(out)
        assert status == 431 and hdrs["connection"] == "close" and hdrs["retry-after"] == "1"
        err = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]
        assert err["code"] == "header_too_large" and "max_header_bytes (16,384 bytes)" in err[
            "message"]
        assert not t.is_alive()  # the flood ended: read and dropped, then the close
        assert _client_errors(g, "header_too_large") == 1
        lines = [r.getMessage() for r in caplog.records if "refused client" in r.getMessage()]
        assert len(lines) == 1 and lines[0].endswith(": 431 header_too_large")
        # headers just under the bound, with a body in the same packet, are served
        pad = b"X-pad: " + b"p" * (16384 - 400) + b"\r\n"
        s2 = _connect(g)
        s2.sendall(HEAD + pad + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY)
                   + BODY)
        assert _read_to_close(s2).startswith(b"HTTP/1.1 200 ")
    finally:
        g.stop()


def test_the_connection_cap_answers_503_with_retry_after_at_once(tmp_path, upstream):
    g = RunningGateway(gateway_config(tmp_path, upstream[0].url, max_connections=4,
                                      client_header_timeout_s=30, retry_after_s=7))
    try:
        held = [_connect(g) for _ in range(4)]
        time.sleep(0.3)
        s = _connect(g)
        s.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
        out = _read_to_close(s, limit_s=5)
        status, hdrs = _status_and_headers(out)
        assert status == 503 and hdrs["retry-after"] == "7"
        assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "overloaded"
        assert _client_errors(g, "overloaded") == 1
        for h in held:
            h.close()
    finally:
        g.stop()


def test_bodies_past_max_inflight_body_bytes_are_a_503_overloaded(tmp_path, upstream):
    g = RunningGateway(gateway_config(tmp_path, upstream[0].url, max_body_bytes=4096,
                                      max_inflight_body_bytes=8192, client_body_timeout_s=10))
    try:
        # two clients hold 4,090 body bytes each, unfinished (Content-Length 4,096)
        holders = []
        for _ in range(2):
            h = _connect(g)
            h.sendall(HEAD + b"Content-Length: 4096\r\n\r\n" + b" " * 4090)
            holders.append(h)
        time.sleep(0.5)
        s = _connect(g)
        s.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
        out = _read_to_close(s)
        status, hdrs = _status_and_headers(out)
        assert status == 503 and hdrs["retry-after"] == "1", out[:300]
        err = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]
        assert err["code"] == "overloaded" and "max_inflight_body_bytes (8,192)" in err["message"]
        for h in holders:
            h.close()
        # released when they end: a request is served again
        deadline = time.monotonic() + 10
        while True:
            r = httpx.post(g.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                           timeout=10)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r.status_code == 200
        assert g.gw.body_bytes_in_flight == 0
    finally:
        g.stop()
