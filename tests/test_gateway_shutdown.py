"""Graceful shutdown of ``prefixscope gateway`` (the real CLI in a subprocess, a real SIGTERM,
the loopback upstream): a stream still running at ``shutdown_grace_s`` ends with an SSE
``gateway_shutdown`` event and a clean end of the response, a request still waiting for its
answer gets ``503 gateway_shutdown``; their decision records say ``gateway_shutdown``, the logs
are flushed, the process ends (by the SIGTERM, as uvicorn re-raises it) with no traceback and no uvicorn task cancellation.
Stderr says when the grace starts (requests and streams in flight, its length) and when it ends
(how many were cut at the deadline)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.gateway_support import (
    CHAT,
    headers_for,
    loopback_upstream,
    read_jsonl,
    start_gateway_cli,
)

PREFIXSCOPE = str(Path(sys.executable).parent / "prefixscope")
GRACE_S = 2.0


def _start(tmp_path: Path, upstream_url: str) -> tuple[subprocess.Popen, str]:
    return start_gateway_cli(
        tmp_path, upstream_url,
        f'log_dir = "{tmp_path / "logs"}"\nfsync_interval_s = 5.0\n'
        f'shutdown_grace_s = {GRACE_S}\nread_timeout_s = 60\n')


def _sigterm_during(tmp_path, control, body: dict) -> tuple[httpx.Response, float, str]:
    proc, url = _start(tmp_path, control_url := control[0].url)
    result: dict = {}
    try:
        def client() -> None:
            result["r"] = httpx.post(url + "/v1/chat/completions", json=body,
                                     headers=headers_for("acme"), timeout=60)

        t = threading.Thread(target=client)
        t.start()
        deadline = time.monotonic() + 30
        while not control[1].requests:  # the request reached the upstream
            assert time.monotonic() < deadline, control_url
            time.sleep(0.05)
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        took = time.monotonic() - t0
        # uvicorn re-raises the signal it caught once shut down: the exit is "killed by
        # SIGTERM", as a service manager expects of a process it stopped
        assert proc.wait(timeout=60) == -signal.SIGTERM
        return result["r"], took, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _assert_shutdown_lines(stderr: str, *, streams: int) -> None:
    """One line when the grace starts, one when it ends, in that order, nothing between."""
    lines = [ln for ln in stderr.splitlines() if "shut" in ln]
    assert len(lines) == 2, stderr
    assert lines[0] == (f"prefixscope gateway: shutting down: 1 request(s) in flight "
                        f"({streams} stream(s)), up to {GRACE_S:g} s (shutdown_grace_s)")
    m = re.fullmatch(r"prefixscope gateway: shut down after (\d+\.\d) s: 1 request\(s\) ended "
                     r"at the deadline \(gateway_shutdown\), the others finished; logs flushed",
                     lines[1])
    assert m, lines[1]
    assert GRACE_S * 0.9 <= float(m.group(1)) < GRACE_S + 4


def test_a_stream_past_the_grace_period_ends_with_a_shutdown_event(tmp_path):
    with loopback_upstream() as (app, control):
        control.stream_delay_s = 4.0  # 4 events 4 s apart: 16 s, far past the grace period
        r, took, stderr = _sigterm_during(tmp_path, (app, control), dict(CHAT, stream=True))
    assert r.status_code == 200
    events = [e for e in r.content.split(b"\n\n") if e]
    last = json.loads(events[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "gateway_shutdown"
    assert f"shutdown_grace_s ({GRACE_S:g} s)" in last["error"]["message"]
    assert GRACE_S * 0.9 <= took < GRACE_S + 4
    assert "Traceback" not in stderr and "Cancel" not in stderr, stderr
    _assert_shutdown_lines(stderr, streams=1)
    decisions = read_jsonl(tmp_path / "logs" / "decisions.jsonl")
    assert [d["error"] for d in decisions] == ["gateway_shutdown"]


def test_a_request_still_waiting_at_the_deadline_gets_a_503(tmp_path):
    with loopback_upstream() as (app, control):
        control.mode = "hang"
        r, took, stderr = _sigterm_during(tmp_path, (app, control), CHAT)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "gateway_shutdown"
    assert GRACE_S * 0.9 <= took < GRACE_S + 4
    assert "Traceback" not in stderr and "Cancel" not in stderr, stderr
    _assert_shutdown_lines(stderr, streams=0)
    decisions = read_jsonl(tmp_path / "logs" / "decisions.jsonl")
    assert [d["error"] for d in decisions] == ["gateway_shutdown"]
