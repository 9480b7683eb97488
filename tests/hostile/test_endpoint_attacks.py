"""Every HTTP endpoint of :data:`tests.hostile.targets.ENDPOINTS` against every request of
:func:`tests.hostile.payloads.http_attacks` (issue 27 build: the attack's classes as generators):
an allowed status within 10 s although the client never closes its side, one log line at most
per refused client and no traceback, and a good request answered right after."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.hostile.payloads import http_attacks
from tests.hostile.targets import ENDPOINTS

CASES = [pytest.param(name, cid, raw, allowed, id=f"{name}:{cid}")
         for name, ep in ENDPOINTS.items()
         for cid, raw, allowed in http_attacks(ep.path, ep.ctype, ep.good_body())]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One running server per endpoint for the module, with its log lines."""
    running = {}
    for name, ep in ENDPOINTS.items():
        lines: list[str] = []
        port, stop = ep.start(tmp_path_factory.mktemp(name), lines.append)
        running[name] = (port, stop, lines)
    yield running
    for _, stop, _ in running.values():
        stop()


@pytest.mark.parametrize("name,cid,raw,allowed", CASES)
def test_endpoint_attack(name, cid, raw, allowed, servers, capfd):
    ep = ENDPOINTS[name]
    port, _, lines = servers[name]
    before = len(lines)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(raw)
        except OSError:
            pass  # refused while sending: the answer is still read
        s.settimeout(10)
        got = b""
        try:
            while b"\r\n" not in got and (chunk := s.recv(4096)):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    assert time.monotonic() - started < 10, f"no answer within 10 s: {got[:100]!r}"
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.") else None
    assert status in allowed, got[:300]
    assert len(lines) - before <= 1, lines[before:]
    # a log line names the client and a fixed reason, never what the client sent
    for ln in lines[before:]:
        assert ln.split(" ")[1].startswith("127.0.0.1") or ln.startswith("client 127.0.0.1"), ln
        assert "aaaaaaaa" not in ln and "\\x" not in ln and "x16" not in ln, ln
    good = httpx.post(f"http://127.0.0.1:{port}{ep.path}", content=ep.good_body(), timeout=30,
                      headers={"Content-Type": ep.ctype})
    assert good.status_code == ep.good_status, good.text
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err


def test_every_endpoint_meets_every_attack_kind():
    kinds = {p.values[1] for p in CASES}
    assert len(CASES) == len(ENDPOINTS) * len(kinds) >= 16
