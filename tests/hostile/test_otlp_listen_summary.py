"""``ingest otlp --listen`` as a real subprocess: its text summary counts the 400s it answered,
and Ctrl-C when idle (no write in progress) does not claim that a transaction was rolled back."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listen_summary_counts_400s_and_idle_ctrl_c_wording(tmp_path):
    port = _free_port()
    errlog, outlog = tmp_path / "l.err", tmp_path / "l.out"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("prefixscope")), "ingest", "otlp", "--listen",
         f"127.0.0.1:{port}", "--db", str(tmp_path / "o.duckdb")],
        stdout=open(outlog, "wb"), stderr=open(errlog, "wb"))
    try:
        deadline = time.monotonic() + 60
        while "receiving OTLP/HTTP traces" not in errlog.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, errlog.read_text()
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/v1/traces"
        codes = [httpx.post(url, content=body, headers={"Content-Type": "application/json"},
                            timeout=30).status_code
                 for body in (b"{bad", b"[1]", b'{"resourceSpans": 3}')]
        assert codes == [400, 400, 400]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    out, err = outlog.read_text(), errlog.read_text()
    assert out == (f"{url}: 0 exports stored, 0 requests added, 0 already stored, 0 spans "
                   "quarantined; answered 400 3, 503 0 and 429 0 times\n")
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted (Ctrl-C): what was committed before is kept")
    assert "the transaction in progress was rolled back" not in err
    assert "if there was one" in last
