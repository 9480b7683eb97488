"""``prefixscope dashboard --port P`` on a port another process listens on: a usage error
naming the port, before anything says the dashboard is on it (the new-user check of session 11
saw "dashboard on http://127.0.0.1:8611" and then Streamlit's "Port 8611 is not available")."""

from __future__ import annotations

import socket
import subprocess

from tests.dashboard_support import PREFIXSCOPE


def test_a_busy_port_is_refused_before_the_dashboard_says_it_serves(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run([PREFIXSCOPE, "dashboard", "--port", str(port), "--db",
                              str(tmp_path / "x.duckdb")], capture_output=True, text=True,
                             timeout=60)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "dashboard on http" not in res.stdout
    assert f"--port {port}: the port is in use on 127.0.0.1 (another dashboard?)" in res.stderr
    assert "Traceback" not in res.stderr
