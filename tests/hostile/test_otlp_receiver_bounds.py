"""Issue 27 #3: the OTLP/HTTP receiver bounds what it holds (connections, header bytes, time per
phase, body bytes in flight), reads chunk sizes strictly, logs one line per refused client and
never a traceback, and keeps the good spans of a partly bad export (OTLP partial success).

Each case runs a real :class:`~prefixscope.ingest.otlp_http.OtlpReceiver` on 127.0.0.1 in this
process (small bounds, so the cases are fast) over a real DuckDB file; the load test against
``prefixscope ingest otlp --listen`` with its default bounds is in
``test_otlp_receiver_load.py``."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from prefixscope.ingest import otlp_http
from prefixscope.ingest.genai_spans import decode_json
from prefixscope.ingest.otlp_http import OtlpReceiver
from prefixscope.store import db as store_db


def span(i: int, **attrs) -> dict:
    base = {"gen_ai.usage.input_tokens": {"intValue": str(100 + i)},
            "gen_ai.usage.output_tokens": {"intValue": "5"},
            "gen_ai.response.id": {"stringValue": f"resp-{i}"}}
    base.update(attrs)
    return {"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "chat m",
            "startTimeUnixNano": str(1764590000_000_000_000 + i),
            "endTimeUnixNano": str(1764590001_000_000_000 + i),
            "attributes": [{"key": k, "value": v} for k, v in base.items()]}


def export(*spans: dict) -> bytes:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "svc"}}]},
        "scopeSpans": [{"spans": list(spans)}]}]}).encode()


class Running:
    """A receiver serving in a thread; ``lines`` holds its log lines."""

    def __init__(self, tmp_path, **bounds):
        self.lines: list[str] = []
        self.db = str(tmp_path / "otlp.duckdb")
        self.r = OtlpReceiver(self.db, port=0, log=self.lines.append, **bounds)
        self.thread = self.r.start()

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.r.port), timeout=10)
        return s

    def post(self, body: bytes, ctype: str = "application/json", **kw) -> httpx.Response:
        return httpx.post(self.r.url, content=body, headers={"Content-Type": ctype},
                          timeout=30, **kw)

    def stop(self) -> None:
        self.r.shutdown()
        self.thread.join(10)

    def rows(self) -> list[str]:
        with store_db.reader(self.db) as con:
            return [r[0] for r in con.execute(
                "SELECT request_id FROM requests ORDER BY request_id").fetchall()]


@pytest.fixture
def running(tmp_path):
    made: list[Running] = []

    def make(**bounds) -> Running:
        made.append(Running(tmp_path, **bounds))
        return made[-1]

    yield make
    for m in made:
        m.stop()


def answer(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes (or ``timeout``)."""
    s.settimeout(timeout)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return got


HEAD = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")


def test_a_chunk_size_of_minus_one_is_a_400_not_a_read_to_the_end(running):
    r = running()
    s = r.connect()
    s.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n" + b"x" * 1000)
    started = time.monotonic()
    got = answer(s, timeout=10)  # the client keeps its side open: no EOF ever comes
    assert got.startswith(b"HTTP/1.1 400"), got[:200]
    assert time.monotonic() - started < 5
    assert any("400 127.0.0.1: malformed chunk size" in ln for ln in r.lines)


def test_chunked_body_past_the_body_bound_is_413_while_it_streams(running, monkeypatch):
    monkeypatch.setattr(otlp_http, "MAX_BODY_BYTES", 1 << 20)
    r = running()
    s = r.connect()
    s.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
    sent = 0
    try:
        for _ in range(64):  # 64 chunks of 64 KiB = 4 MiB offered, 1 MiB allowed
            s.sendall(b"10000\r\n" + b" " * 0x10000 + b"\r\n")
            sent += 0x10000
    except OSError:
        pass
    got = answer(s)
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    assert r.r.stats.too_large_413 == 1 and r.r._inflight == 0


def test_content_length_past_the_body_bound_is_413(running):
    r = running()
    s = r.connect()
    s.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % ((64 << 20) + 1))
    assert answer(s).startswith(b"HTTP/1.1 413")


def test_bodies_in_flight_past_the_total_bound_get_503_with_retry_after(running):
    r = running(max_inflight_bytes=1 << 20)
    holder = r.connect()  # 800 KiB announced, half sent: its bytes are held
    holder.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % (800 << 10) + b" " * (400 << 10))
    deadline = time.monotonic() + 10
    while r.r._inflight == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.r._inflight == 800 << 10
    second = r.connect()
    second.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % (800 << 10))
    got = answer(second)
    assert got.startswith(b"HTTP/1.1 503") and b"Retry-After: 1\r\n" in got, got[:300]
    # a small export still fits beside the held body
    ok = r.post(export(span(1)))
    assert ok.status_code == 200
    holder.sendall(b" " * (400 << 10))  # the held body completes (and is no JSON: a 400)
    holder.close()
    assert r.rows() == ["resp-1"]
    assert any("503 127.0.0.1: receiver holds its bound of body bytes" in ln for ln in r.lines)


def test_connections_past_the_bound_get_503_and_one_log_line_each(running):
    r = running(max_connections=4, evict_after_s=1000)
    idle = [r.connect() for _ in range(4)]
    deadline = time.monotonic() + 10
    while len(r.r._conns) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    refused = [r.connect() for _ in range(3)]
    for s in refused:
        got = answer(s)
        assert got.startswith(b"HTTP/1.1 503") and b"Retry-After: 1\r\n" in got, got[:300]
    assert [ln for ln in r.lines if ln.startswith("503")] == [
        "503 127.0.0.1: 4 connections open; refused"] * 3
    assert r.r.stats.refused_connections == 3
    for s in idle:
        s.close()


def test_a_new_connection_takes_the_place_of_a_stalled_one(running):
    r = running(max_connections=4, evict_after_s=0.3)
    stalled = [r.connect() for _ in range(4)]
    for s in stalled:
        s.sendall(b"POST /v1/tr")  # and nothing more
    time.sleep(0.6)
    ok = r.post(export(span(2)))  # a good export gets in at once
    assert ok.status_code == 200
    assert r.rows() == ["resp-2"]
    assert any("still sending its headers" in ln for ln in r.lines)


def test_slow_clients_are_closed_after_the_header_and_body_times(running):
    r = running(header_timeout_s=1.0, body_timeout_s=1.0)
    trickle, silent, body = r.connect(), r.connect(), r.connect()
    body.sendall(HEAD + b"Content-Length: 1000\r\n\r\n{")
    started = time.monotonic()
    closed: dict[str, float] = {}

    def drip():
        try:
            for ch in HEAD * 10:  # a byte every 0.1 s: never a whole request in 1 s
                trickle.send(bytes([ch]))
                time.sleep(0.1)
        except OSError:
            pass
    t = threading.Thread(target=drip)
    t.start()
    for name, s in (("silent", silent), ("body", body)):
        got = answer(s, timeout=10)
        closed[name] = time.monotonic() - started
        if name == "body":
            assert got.startswith(b"HTTP/1.1 408"), got[:200]
        else:
            assert got == b""
    t.join(15)
    assert answer(trickle, timeout=10) == b""
    assert time.monotonic() - started < 6
    assert all(v < 4 for v in closed.values()), closed
    assert r.r.stats.closed_slow == 3


def test_headers_past_64_kib_in_all_are_431(running):
    r = running()
    s = r.connect()
    many = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(90))  # 90 KB < 100 headers
    s.sendall(HEAD + many + b"Content-Length: 2\r\n\r\n{}")
    assert answer(s).startswith(b"HTTP/1.1 431")
    assert r.r.stats.headers_431 == 1


def test_a_client_gone_before_its_answer_is_one_line_never_a_traceback(running, capfd):
    r = running()
    for i in range(5):
        s = r.connect()
        body = export(span(10 + i))
        s.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # RST: the answer has nowhere to go
    deadline = time.monotonic() + 20
    while r.r.stats.requests < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "BrokenPipe" not in out + err
    assert r.rows() == [f"resp-{10 + i}" for i in range(5)]  # committed all the same


def _partial(resp: httpx.Response, is_json: bool):
    if is_json:
        return resp.json().get("partialSuccess", {})
    msg = ExportTraceServiceResponse()
    msg.ParseFromString(resp.content)
    return {"rejectedSpans": str(msg.partial_success.rejected_spans),
            "errorMessage": msg.partial_success.error_message}


def test_a_malformed_attribute_rejects_its_span_not_the_export_json(running):
    r = running()
    bad = span(2, **{"gen_ai.usage.input_tokens": {"intValue": "twelve"}})
    resp = r.post(export(span(1), bad, span(3)))
    assert resp.status_code == 200, resp.text
    p = _partial(resp, True)
    assert p["rejectedSpans"] == "1"
    assert p["errorMessage"].startswith(
        "1 span(s) quarantined; first: span 00000000000000000000000000000003/0000000000000003: "
        "resourceSpans[0].scopeSpans[0].spans[1]: not an OTLP span (Failed to parse")
    assert "twelve" not in p["errorMessage"]
    assert r.rows() == ["resp-1", "resp-3"]
    with store_db.reader(r.db) as con:
        (q,) = con.execute("SELECT field, reason FROM quarantine").fetchall()
    assert q[0] == "resourceSpans[0].scopeSpans[0].spans[1]" and "twelve" not in q[1]
    # sent again (an exporter's retry): the good spans land once, the bad one is kept once
    assert r.post(export(span(1), bad, span(3))).status_code == 200
    with store_db.reader(r.db) as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == 1
    assert r.rows() == ["resp-1", "resp-3"]


def test_a_malformed_attribute_rejects_its_span_not_the_export_protobuf(running):
    r = running()
    marked = span(2, **{"k": {"stringValue": "MARKER"}})
    body = decode_json(export(span(1), marked)).SerializeToString()
    body = body.replace(b"MARKER", b"MA\xff\xfeER")  # invalid UTF-8 in a string attribute
    resp = r.post(body, "application/x-protobuf")
    assert resp.status_code == 200
    p = _partial(resp, False)
    assert p["rejectedSpans"] == "1" and "(DecodeError)" in p["errorMessage"]
    assert r.rows() == ["resp-1"]


def test_a_body_that_is_no_export_at_all_is_still_400(running):
    r = running()
    assert r.post(b"\xff\xff\xff\xff", "application/x-protobuf").status_code == 400
    assert r.post(b'{"resourceSpans": 3}').status_code == 400


def test_the_file_exporter_line_keeps_its_good_spans_too(tmp_path, cli):
    """The same rule for ``ingest otlp FILE``: a line with an undecodable span quarantines the
    line (its first problem) and stores the line's good spans."""
    bad = span(2, **{"gen_ai.usage.input_tokens": {"intValue": "twelve"}})
    f = tmp_path / "traces.jsonl"
    f.write_bytes(export(span(1), bad, span(3)) + b"\n" + export(span(4)) + b"\n")
    db = str(tmp_path / "f.duckdb")
    code, out, err = cli(["ingest", "otlp", str(f), "--db", db])
    assert code == 0, err
    with store_db.reader(db) as con:
        rows = [r[0] for r in con.execute(
            "SELECT request_id FROM requests ORDER BY 1").fetchall()]
        q = con.execute("SELECT line, field, reason FROM quarantine").fetchall()
    assert rows == ["resp-1", "resp-3", "resp-4"]
    assert q == [(1, "resourceSpans[0].scopeSpans[0].spans[1]",
                  "not an OTLP span (Failed to parse attributes field)")]


def test_conflicting_content_lengths_are_400_never_the_first(running):
    r = running()
    body = export(span(1))
    with r.connect() as s:
        s.sendall(HEAD + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                  % (len(body), len(body) + 20) + body + b" " * 20)
        got = answer(s)
    assert got.startswith(b"HTTP/1.1 400 "), got[:200]
    assert r.lines == ["400 127.0.0.1: bad Content-Length"], r.lines
    # the same length twice is one length
    body = export(span(2))
    with r.connect() as s:
        s.sendall(HEAD + b"Content-Length: %d\r\nContent-Length: %d\r\nConnection: close\r\n"
                  b"\r\n" % (len(body), len(body)) + body)
        assert answer(s).startswith(b"HTTP/1.1 200 ")
    assert r.rows() == ["resp-2"]


def test_an_unsupported_content_encoding_is_415_naming_it(running):
    r = running()
    body = export(span(1))
    resp = httpx.post(r.r.url, content=body, timeout=30,
                      headers={"Content-Type": "application/json", "Content-Encoding": "br"})
    assert resp.status_code == 415 and "Content-Encoding br is not supported" in resp.text
    assert r.lines == ["415 127.0.0.1: Content-Encoding br is not supported (gzip, deflate or "
                       "none)"], r.lines
    assert httpx.post(r.r.url, content=export(span(2)), timeout=30, headers={
        "Content-Type": "application/json", "Content-Encoding": "identity"}).status_code == 200
    assert r.rows() == ["resp-2"]


def test_log_lines_are_written_whole_under_load(monkeypatch):
    """The default log writes each line with its newline in one call: lines of clients refused
    at once are never glued together."""
    import io

    class Slow(io.StringIO):
        def write(self, text):  # a writer that lets other threads in between calls
            n = 0
            for ch in text:
                n += super().write(ch)
                time.sleep(0)
            return n

    err = Slow()
    monkeypatch.setattr(sys, "stderr", err)
    threads = [threading.Thread(target=lambda i=i: [otlp_http.log_line(
        f"400 127.0.0.{i}: bad request") for _ in range(50)]) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = err.getvalue().split("\n")
    assert lines[-1] == "" and len(lines) == 401
    assert sorted(set(lines[:-1])) == [f"400 127.0.0.{i}: bad request" for i in range(8)]
