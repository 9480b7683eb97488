"""The gateway holds bounded memory under 300 slow and 12 huge clients at once (issue 27,
"every server bounds what it holds"), and serves a normal request meanwhile.

The real ``prefixscope gateway --config`` runs in its own process (its RSS read from
``/proc/PID/status``) in front of the loopback upstream. At once, on 127.0.0.1:

- 300 slow clients: each opens a connection and trickles a header line a second (slowloris);
- 6 huge-header clients: one header value that never ends, 16 MiB offered each (the attack of
  issue 27 #4 took the gateway from 88 to 424 MB with 20 of them);
- 6 huge-body clients: a declared 64 MiB body sent as fast as loopback allows.

Bounded: every client stops after :data:`RUN_S` seconds or when the gateway closes it; the
test ends within about a minute. Asserted: peak RSS below :data:`RSS_BOUND_MB` (measured on a
2-core machine at load 4.2: 81 MB at start, 101 MB peak; without the header bound, 203 MB
and no 431), every huge
client refused (431 / 413), every slow client closed with a 408 within the header deadline,
and a normal chat request answered 200 while all of this is under way.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx

from tests.gateway_support import CHAT, headers_for, loopback_upstream, start_gateway_cli

RSS_BOUND_MB = 160
SLOW, HUGE_HEADER, HUGE_BODY = 300, 6, 6
RUN_S = 20.0
HEADER_TIMEOUT_S = 4.0


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _first_line(s: socket.socket, limit_s: float) -> bytes:
    """The first bytes the gateway answers before closing (b"" if it closed silently)."""
    s.settimeout(1.0)
    out, t0 = b"", time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            b = s.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not b:
            break
        out += b
    return out


def test_300_slow_and_12_huge_clients_hold_rss_under_the_bound(tmp_path):
    with loopback_upstream() as (app, _control):
        proc, url = start_gateway_cli(
            tmp_path, app.url, f"client_header_timeout_s = {HEADER_TIMEOUT_S}\n"
            "client_body_timeout_s = 10.0\nmax_header_bytes = 65536\n"
            f'log_dir = "{tmp_path / "logs"}"\n')
        port = int(url.rsplit(":", 1)[1])
        try:
            base_mb = _rss_mb(proc.pid)
            stop = threading.Event()
            peak = {"mb": base_mb}
            results: dict[str, list] = {"slow": [], "header": [], "body": []}

            def sample() -> None:
                while not stop.is_set():
                    peak["mb"] = max(peak["mb"], _rss_mb(proc.pid))
                    time.sleep(0.05)

            def slow_all() -> None:
                socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(SLOW)]
                for s in socks:
                    s.setblocking(False)
                    s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                t0 = time.monotonic()
                i = 0
                while time.monotonic() - t0 < HEADER_TIMEOUT_S + 2 and not stop.is_set():
                    for s in socks:
                        try:
                            s.send(b"X-s%d: v\r\n" % i)
                        except OSError:
                            pass
                    i += 1
                    time.sleep(1.0)
                for s in socks:
                    s.setblocking(True)
                    results["slow"].append(_first_line(s, 5)[:12])
                    s.close()

            def huge(kind: str) -> None:
                s = socket.create_connection(("127.0.0.1", port))
                reader = {"out": b""}

                def read() -> None:
                    reader["out"] = _first_line(s, RUN_S)

                r = threading.Thread(target=read, daemon=True)
                r.start()
                try:
                    if kind == "header":
                        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-big: ")
                    else:
                        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                  b"Authorization: Bearer key-acme-0123456789\r\n"
                                  b"Content-Length: %d\r\n\r\n" % (64 << 20))
                    t0 = time.monotonic()
                    for _ in range(256 if kind == "header" else 1024):
                        if time.monotonic() - t0 > RUN_S:
                            break
                        s.sendall(b"a" * 65536)
                except OSError:
                    pass
                r.join(RUN_S + 5)
                results[kind].append(reader["out"][:12])
                s.close()

            threads = [threading.Thread(target=sample, daemon=True),
                       threading.Thread(target=slow_all, daemon=True)]
            threads += [threading.Thread(target=huge, args=("header",), daemon=True)
                        for _ in range(HUGE_HEADER)]
            threads += [threading.Thread(target=huge, args=("body",), daemon=True)
                        for _ in range(HUGE_BODY)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                           timeout=30)
            served = r.status_code
            for t in threads[1:]:
                t.join(RUN_S + 30)
            stop.set()
            threads[0].join(5)
            after = httpx.post(url + "/v1/chat/completions", json=CHAT,
                               headers=headers_for("acme"), timeout=30).status_code
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"gateway RSS: {base_mb:.0f} MB at start, peak {peak['mb']:.0f} MB "
          f"({SLOW} slow + {HUGE_HEADER + HUGE_BODY} huge clients)")
    assert served == 200 and after == 200
    assert peak["mb"] < RSS_BOUND_MB, peak
    assert len(results["slow"]) == SLOW and all(
        x.startswith(b"HTTP/1.1 408") for x in results["slow"]), set(results["slow"])
    assert results["header"] == [b"HTTP/1.1 431"] * HUGE_HEADER, results["header"]
    assert results["body"] == [b"HTTP/1.1 413"] * HUGE_BODY, results["body"]
