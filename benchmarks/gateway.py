"""What the gateway adds: latency p50/p99, requests/s and CPU per request, through the gateway vs
direct to the same upstream, in the same run.

Three processes, each measured on its own:

- **upstream**: a minimal HTTP/1.1 server on raw asyncio (uvloop), keep-alive, answering
  ``/v1/chat/completions`` at once with a chunked SSE stream of 8 content events (+ the usage
  event when ``stream_options.include_usage`` is set) and the vLLM discovery routes; so what
  differs between the two paths is the gateway's own cost;
- **client**: raw asyncio (uvloop) too: ``--concurrency`` keep-alive connections, each sending
  its next streaming request as soon as the previous answer's last byte arrived (a closed
  loop of that many streams in flight); latency = request written to the last byte read;
- **gateway**: ``prefixscope gateway`` (mode ``tenant``, in-process store, logs on; with
  ``--workers N`` N worker processes on a real ``redis-server``).

With 2 or more CPUs the processes are pinned (``os.sched_setaffinity``): the gateway on its own
CPU(s), the client and the upstream on the others, the same layout for both paths. Rounds
alternate direct / through the gateway so both see the same machine load. Reported per path:
p50/p99 latency, requests/s, and CPU milliseconds per request of each process (user+system from
``/proc``: the figures that do not depend on what else the machine runs). Added latency =
percentile through the gateway minus the same percentile direct; throughput ratio = requests/s
through the gateway / direct. Targets (issue 15): added p99 <= 5 ms at 64 concurrent streams,
throughput >= 0.7x direct.

In a closed loop the latency of a path is concurrency / its throughput (Little's law), so at 64
streams the added latency is set by how many requests/s the gateway's CPU can do: the
"saturated floor" printed for the at-once upstream is concurrency x gateway CPU ms/request /
its CPUs: what that many requests queued in the gateway cost when nothing else limits the loop.
The **paced** run (``--paced-gap-ms``, default 20: the upstream sends its 8 events 20 ms apart,
a 160 ms stream like an engine decoding 50 tokens/s) is the one for the issue's targets: 64
streams open at once, as a real deployment has them, instead of 64 back-to-back request loops
against an upstream that answers in microseconds. Its 64 closed loops start together and every
stream lasts exactly 160 ms, so they stay in phase: every 160 ms the gateway gets 64 requests in
one wave (the **synchronised worst case**). ``--stagger`` adds the paced run with desynchronised
arrivals, as a deployment's clients arrive: an **open loop** (requests start on a schedule, not
when earlier answers end) at ``concurrency / stream length`` requests/s, which keeps that many
streams open on average (Little's law; 64 / 0.16 s = 400/s). ``--arrivals poisson`` (default:
exponential gaps, the process of vLLM's ``benchmark_serving.py --request-rate``) and/or
``constant`` (evenly spaced, k6 ``constant-arrival-rate``, wrk2 ``-R``). Both paths get the same
seeded schedule per round; latency runs from the scheduled start (no coordinated omission); an
open loop does not slow down when the path falls behind, so an overloaded gateway shows as more
open streams (reported per path: time-weighted mean and maximum over the steady window) and a
growing latency, not as fewer requests.

    .venv/bin/python benchmarks/gateway.py                 # loopback (1 and 64 streams) + vLLM
    .venv/bin/python benchmarks/gateway.py --no-vllm       # loopback only
    .venv/bin/python benchmarks/gateway.py --no-vllm --workers 2
    .venv/bin/python benchmarks/gateway.py --no-vllm --stagger --arrivals poisson constant

Prints a table and one JSON line (``GATEWAY_BENCH {...}``) with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "tiny-llama-random"
API_KEY = "bench-key-0123456789"
BODY = {"model": MODEL, "stream": True, "max_tokens": 8,
        "messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Say something short."}]}


def _loop():
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


# --------------------------------------------------------------------------- the upstream

def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Upstream(asyncio.Protocol):
    """Minimal HTTP/1.1: Content-Length request bodies, keep-alive, answers written at once."""

    CHUNK = (b'data: {"id":"c","object":"chat.completion.chunk","model":"' + MODEL.encode()
             + b'","choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n')
    USAGE = (b'data: {"id":"c","object":"chat.completion.chunk","model":"' + MODEL.encode()
             + b'","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":8,'
             b'"prompt_tokens_details":{"cached_tokens":64}}}\n\n')
    HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    STREAM = HEAD + _chunk(CHUNK) * 8
    DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    STATIC = {
        b"/v1/models": json.dumps({"object": "list", "data": [
            {"id": MODEL, "object": "model", "root": "/m", "parent": None}]}).encode(),
        b"/version": b'{"version":"0.32.0+cpu"}',
        b"/metrics": b'vllm:cache_config_info{block_size="32",cache_dtype="auto"} 1.0\n',
    }

    def connection_made(self, transport) -> None:
        self.t = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            n = 0
            i = head.lower().find(b"content-length:")
            if i >= 0:
                n = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0
                             else len(head)])
            if len(self.buf) < end + 4 + n:
                return
            body = self.buf[end + 4:end + 4 + n]
            self.buf = self.buf[end + 4 + n:]
            path = head.split(b" ", 2)[1]
            if path == b"/v1/chat/completions":
                usage = b'"include_usage":true' in body or b'"include_usage": true' in body
                tail = (_chunk(self.USAGE) if usage else b"") + self.DONE
                if not GAP_S:
                    self.t.write(self.STREAM + tail)
                    continue
                # paced like a decoding engine: one event every GAP_S seconds
                loop = asyncio.get_running_loop()
                self.t.write(self.HEAD)
                one = _chunk(self.CHUNK)
                for i in range(8):
                    loop.call_later(GAP_S * (i + 1), self._write, one)
                loop.call_later(GAP_S * 8, self._write, tail)
            else:
                out = self.STATIC.get(path, b"{}")
                self.t.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(out), out))


    def _write(self, data: bytes) -> None:
        if not self.t.is_closing():
            self.t.write(data)


GAP_S = 0.0  # set in the upstream process (--serve-upstream PORT GAP_MS)


def serve_upstream(port: int, gap_ms: float) -> None:
    global GAP_S
    GAP_S = gap_ms / 1000
    loop = _loop()
    server = loop.run_until_complete(loop.create_server(_Upstream, "127.0.0.1", port,
                                                        backlog=4096))
    try:
        loop.run_forever()
    finally:
        server.close()


# --------------------------------------------------------------------------- the client

def _request(host_port: str) -> bytes:
    body = json.dumps(BODY).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json"
            b"\r\nauthorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
            % (host_port.encode(), API_KEY.encode(), len(body), body))


async def _read_answer(reader: asyncio.StreamReader) -> bytes | None:
    """One answer: a chunked stream ("0\\r\\n\\r\\n" ends it) or a Content-Length body (an
    error); None when the connection closed first."""
    buf = b""
    while True:
        data = await reader.read(65536)
        if not data:
            return None
        buf += data
        if buf.endswith(b"\r\n0\r\n\r\n"):
            return buf
        h = buf.find(b"\r\n\r\n")
        if h > 0 and b"content-length:" in buf[:h].lower():
            i = buf.lower().find(b"content-length:")
            n = int(buf[i + 15:buf.find(b"\r\n", i)])
            if len(buf) >= h + 4 + n:
                return buf


async def _one_connection(host: str, port: int, req: bytes, until: list[int], lat: list[float],
                          fails: list[int], spans: list[tuple[float, float]]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while until[0] > 0:
            until[0] -= 1
            t0 = time.perf_counter()
            writer.write(req)
            buf = await _read_answer(reader)
            if buf is None:
                fails[0] += 1
                return
            t1 = time.perf_counter()
            spans.append((t0, t1))
            if buf.startswith(b"HTTP/1.1 200"):
                lat.append(t1 - t0)
            else:
                fails[0] += 1
    finally:
        writer.close()


def run_load(base: str, n: int, concurrency: int
             ) -> tuple[list[float], float, int, list[tuple[float, float]]]:
    """n streaming requests over ``concurrency`` keep-alive connections (a closed loop);
    returns (latencies s, wall s, failures, (start, end) perf_counter s of every answer)."""
    host, port = base.removeprefix("http://").split(":")
    req = _request(f"{host}:{port}")
    lat: list[float] = []
    fails = [0]
    until = [n]
    spans: list[tuple[float, float]] = []
    async def all_connections() -> None:
        await asyncio.gather(*(_one_connection(host, int(port), req, until, lat, fails, spans)
                               for _ in range(concurrency)))

    loop = _loop()
    try:
        t0 = time.perf_counter()
        loop.run_until_complete(all_connections())
        wall = time.perf_counter() - t0
    finally:
        loop.close()
    return lat, wall, fails[0], spans


# --------------------------------------------------------------------------- open-loop arrivals

def arrival_schedule(n: int, rate_per_s: float, process: str = "poisson", seed: int = 0
                     ) -> list[float]:
    """Start offsets (s from the run's start, ascending, the first 0.0) of n requests arriving
    at ``rate_per_s`` on average, independent of when earlier answers end (an open loop).

    ``poisson``: exponentially distributed gaps (mean 1 / rate), seeded, so a direct round and
    a gateway round with the same seed get the same schedule; the arrival process of vLLM's
    ``benchmarks/benchmark_serving.py --request-rate`` (burstiness 1) and of open-loop load
    generators (Schroeder et al., "Open versus closed", NSDI 2006). ``constant``: gaps of
    exactly 1 / rate, as k6's ``constant-arrival-rate`` executor and wrk2's ``-R`` start them.
    Raises ValueError for a rate <= 0 or an unknown process."""
    import random

    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    if process not in ("poisson", "constant"):
        raise ValueError(f"process must be poisson or constant, got {process!r}")
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate_per_s) if process == "poisson" else 1.0 / rate_per_s
    return out


def open_streams(spans: list[tuple[float, float]],
                 window: tuple[float, float] | None = None) -> tuple[float, int]:
    """(time-weighted mean, maximum) number of requests in flight; spans are (start, end) in
    seconds, an end exactly at another's start counts as closed first. Over ``window`` (lo, hi)
    when given and not empty (for an open loop: after the first stream length, until the last
    arrival, leaving out ramp-up and drain), else from the first start to the last end.
    (0.0, 0) for no spans."""
    if not spans:
        return 0.0, 0
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    if window is not None and window[1] > window[0]:
        lo, hi = window
    busy = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)
    events = sorted([(e, -1) for _, e in spans] + [(s, 1) for s, _ in spans])
    cur = peak = 0
    for t, d in events:
        cur += d
        if lo <= t <= hi or window is None:
            peak = max(peak, cur)
    return (busy / (hi - lo) if hi > lo else float(len(spans))), peak


async def _open_loop(host: str, port: int, req: bytes, offsets: list[float], pool: int,
                     lat: list[float], fails: list[int], spans: list[tuple[float, float]],
                     extra: list[int]) -> float:
    """Send one request at each offset on an idle keep-alive connection (``pool`` of them opened
    before the clock starts; one more opened when none is idle, counted in ``extra``); latency
    runs from the scheduled start (so a late send counts, no coordinated omission) to the last
    byte. Returns the wall seconds from the first scheduled start to the last answer."""
    idle = [await asyncio.open_connection(host, port) for _ in range(pool)]

    async def one(at: float) -> None:
        if idle:
            reader, writer = idle.pop()
        else:
            extra[0] += 1
            reader, writer = await asyncio.open_connection(host, port)
        writer.write(req)
        buf = await _read_answer(reader)
        t1 = time.perf_counter()
        if buf is None:
            fails[0] += 1
            writer.close()
            return
        spans.append((at, t1))
        if buf.startswith(b"HTTP/1.1 200"):
            lat.append(t1 - at)
        else:
            fails[0] += 1
        idle.append((reader, writer))

    start = time.perf_counter() + 0.01
    tasks = []
    for off in offsets:
        delay = start + off - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(start + off)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    for _, writer in idle:
        writer.close()
    return wall


def run_arrivals(base: str, offsets: list[float], pool: int
                 ) -> tuple[list[float], float, int, list[tuple[float, float]]]:
    """Streaming requests started at ``offsets`` (s, from ``arrival_schedule``), an open loop;
    returns (latencies s from the scheduled start, wall s, failures, (start, end) spans) like
    ``run_load``."""
    host, port = base.removeprefix("http://").split(":")
    req = _request(f"{host}:{port}")
    lat: list[float] = []
    fails, extra = [0], [0]
    spans: list[tuple[float, float]] = []
    loop = _loop()
    try:
        wall = loop.run_until_complete(_open_loop(host, int(port), req, offsets, pool, lat,
                                                  fails, spans, extra))
    finally:
        loop.close()
    return lat, wall, fails[0], spans


# --------------------------------------------------------------------------- processes

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def start_gateway(upstream: str, workdir: Path, *, workers: int = 1, store: str = "memory",
                  trace: Path | None = None, exe: str | None = None
                  ) -> tuple[subprocess.Popen, str]:
    """``prefixscope gateway`` on ``upstream`` (or, with ``trace``, the instrumented one of
    ``benchmarks/gateway_trace.py`` writing its trace there when stopped)."""
    from prefixscope.gateway.auth import key_digest

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "hmac.key").write_text(os.urandom(32).hex())
    (workdir / "keys.toml").write_text(f'[[key]]\nsha256 = "{key_digest(API_KEY)}"\n'
                                       'tenant = "bench"\n')
    port = free_port()
    (workdir / "gateway.toml").write_text(
        f'[gateway]\nupstreams = ["{upstream}"]\nport = {port}\nmode = "tenant"\n'
        f'hmac_key_file = "{workdir / "hmac.key"}"\napi_keys_file = "{workdir / "keys.toml"}"\n'
        f'log_dir = "{workdir / "logs"}"\nread_timeout_s = 120.0\npool_size = 256\n'
        + (f'workers = {workers}\nstore = "{store}"\n' if workers > 1 else ""))
    cmd = ([sys.executable, str(ROOT / "benchmarks" / "gateway_trace.py"),
            str(workdir / "gateway.toml"), str(trace)] if trace is not None
           else [exe or str(Path(sys.executable).parent / "prefixscope"), "gateway",
                 "--config", str(workdir / "gateway.toml")])
    proc = subprocess.Popen(cmd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health")
    return proc, url


def tree_pids(pid: int) -> list[int]:
    """A process and its descendants (the gateway's workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        todo.extend(int(k) for k in kids)
    return out


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of processes (Linux /proc)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def pin(pids: list[int], cpus: set[int]) -> None:
    for p in pids:
        try:
            os.sched_setaffinity(p, cpus)
        except OSError:
            pass


def realtime(pids: list[int], on: bool) -> None:
    """Every thread of ``pids`` to SCHED_FIFO priority 10 (``on``) or back to SCHED_OTHER:
    the machine's other processes (SCHED_OTHER) can then no longer keep them waiting for a
    CPU, so the run measures the gateway, not the machine's load (``--realtime``; root or
    CAP_SYS_NICE; the kernel's RT throttling still leaves 5% of each CPU to the others)."""
    policy, param = ((os.SCHED_FIFO, os.sched_param(10)) if on
                     else (os.SCHED_OTHER, os.sched_param(0)))
    for p in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        for t in tids:
            try:
                os.sched_setscheduler(t, policy, param)
            except OSError:
                pass


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


#: Collections in this process (the client) while a round is measured: generation -> (count,
#: longest ms). A full collection here walks every object of the client and stalls every
#: request in flight, whichever path it measures (round 5 in docs/benchmarks-history.md).
CLIENT_GC: dict[int, list] = {}
_gc_t0 = [0.0, False]  # start of the running collection, measuring now


def _client_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_t0[0] = time.perf_counter()
    elif _gc_t0[1]:
        ms = (time.perf_counter() - _gc_t0[0]) * 1000
        c = CLIENT_GC.setdefault(info["generation"], [0, 0.0])
        c[0] += 1
        c[1] = max(c[1], ms)


gc.callbacks.append(_client_gc)
CLIENT_GC_ON = False  # --client-gc: leave the client's collector on during the rounds


def compare(name: str, direct: str, gateway: str, *, n: int, concurrency: int, rounds: int,
            upstream_pids: list[int], gateway_pid: int, gateway_cpus: int,
            arrivals: str = "closed", stream_s: float = 0.0,
            baseline: tuple[str, int] | None = None) -> dict:
    """Alternating rounds direct / gateway; latencies, rates and CPU per request.

    ``baseline``: (URL, pid) of a second gateway (``--baseline-gateway``, another install,
    e.g. the main branch before a change), measured as a third path in the same rounds:
    ``out["baseline"]``, its added latencies and CPU per request beside this one's.

    ``arrivals``: ``closed`` (``concurrency`` back-to-back request loops, all starting at once:
    with an upstream of fixed stream length they stay in phase, the synchronised worst case) or
    ``poisson`` / ``constant`` (open loop at ``concurrency / stream_s`` requests/s, so that
    ``concurrency`` streams of ``stream_s`` seconds are open on average by Little's law; round
    r uses the same seeded schedule on both paths)."""
    paths = [("direct", direct, gateway_pid), ("gateway", gateway, gateway_pid)]
    if baseline is not None:
        paths.append(("baseline", baseline[0], baseline[1]))
    for _, base, _ in paths:  # warm connections, discovery, the registry
        run_load(base, concurrency * 2, concurrency)
    acc = {p: {"lat": [], "wall": 0.0, "fails": 0, "busy": 0.0, "peak": 0,
               "cpu": {"client": 0.0, "upstream": 0.0, "gateway": 0.0}}
           for p, _, _ in paths}
    rate = concurrency / stream_s if arrivals != "closed" else 0.0
    for r in range(rounds):
        offsets = (arrival_schedule(n // rounds, rate, arrivals, seed=r)
                   if arrivals != "closed" else [])
        for label, base, pid in paths:  # direct: the gateway's idle CPU
            gw_pids = tree_pids(pid)
            # the client's own collector off while a round is measured (collected before it):
            # a full collection of the client stalls every request in flight for 20-40 ms
            gc.collect()
            if not CLIENT_GC_ON:
                gc.disable()
            _gc_t0[1] = True
            c0 = (time.process_time(), cpu_s(upstream_pids), cpu_s(gw_pids))
            try:
                if arrivals == "closed":
                    lat, wall, fails, spans = run_load(base, n // rounds, concurrency)
                else:
                    lat, wall, fails, spans = run_arrivals(base, offsets, pool=concurrency * 2)
            finally:
                c1 = (time.process_time(), cpu_s(upstream_pids), cpu_s(gw_pids))
                _gc_t0[1] = False
                gc.enable()
            a = acc[label]
            if label == "gateway":
                a.setdefault("spans", []).extend(spans)
            a["lat"] += lat
            a["wall"] += wall
            a["fails"] += fails
            window = None
            if offsets:  # steady state: after the first stream length, until the last arrival
                t0 = min(t for t, _ in spans) if spans else 0.0
                window = (t0 + stream_s, t0 + offsets[-1])
            mean_open, peak = open_streams(spans, window)
            a["busy"] += mean_open * wall
            a["peak"] = max(a["peak"], peak)
            for k, x0, x1 in zip(("client", "upstream", "gateway"), c0, c1, strict=True):
                a["cpu"][k] += x1 - x0
    out = {"upstream": name, "requests_per_path": n, "concurrency": concurrency,
           "rounds": rounds, "arrivals": arrivals}
    if rate:
        out["offered_req_per_s"] = round(rate, 1)
    for label, a in acc.items():
        done = max(1, len(a["lat"]))
        out[label] = {"p50_ms": round(pct(a["lat"], 0.5) * 1000, 2),
                      "p99_ms": round(pct(a["lat"], 0.99) * 1000, 2),
                      "req_per_s": round(len(a["lat"]) / a["wall"], 1), "failures": a["fails"],
                      "open_streams_mean": round(a["busy"] / a["wall"], 1),
                      "open_streams_max": a["peak"],
                      "cpu_ms_per_request": {k: round(v * 1000 / done, 3)
                                             for k, v in a["cpu"].items()}}
    out["added_p50_ms"] = round(out["gateway"]["p50_ms"] - out["direct"]["p50_ms"], 2)
    out["added_p99_ms"] = round(out["gateway"]["p99_ms"] - out["direct"]["p99_ms"], 2)
    out["throughput_ratio"] = round(out["gateway"]["req_per_s"] / out["direct"]["req_per_s"], 3)
    if baseline is not None:
        out["baseline_added_p50_ms"] = round(out["baseline"]["p50_ms"] - out["direct"]["p50_ms"], 2)
        out["baseline_added_p99_ms"] = round(out["baseline"]["p99_ms"] - out["direct"]["p99_ms"], 2)
        out["baseline_throughput_ratio"] = round(out["baseline"]["req_per_s"]
                                                 / out["direct"]["req_per_s"], 3)
        out["baseline_gateway_cpu_ms_per_request"] = out["baseline"]["cpu_ms_per_request"]["gateway"]
    out["_gateway_spans"] = acc["gateway"].get("spans", [])
    gw_ms = out["gateway"]["cpu_ms_per_request"]["gateway"]
    out["gateway_cpu_ms_per_request"] = gw_ms
    out["gateway_bound_floor_ms"] = round(concurrency * gw_ms / gateway_cpus, 2)
    return out


def trace_report(trace: dict, results: list[dict], spans: dict[str, list]) -> None:
    """Print, per paced run, the event-loop stalls of the gateway (``benchmarks/gateway_trace.py``)
    that its slowest 1% of requests went through, and what happened during each: the loop
    thread's own CPU, other threads' CPU, run-queue wait (waiting for a CPU), collections, log
    batches, new connections."""
    lags = trace["lags"]

    def during(kind: str, lo: float, hi: float) -> list:
        return [e for e in trace[kind] if lo - 0.001 <= (e[0] if isinstance(e, list) else e) <= hi]

    for r in results:
        key = f"{r['upstream']}-{r['arrivals']}"
        sp = spans.get(key) or []
        if not r["upstream"].startswith("paced") or not sp:
            continue
        lo, hi = min(s for s, _ in sp), max(e for _, e in sp)
        mine = [x for x in lags if lo <= x["t"] <= hi]
        lat = sorted(e - s for s, e in sp)
        p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
        slow = [(s, e) for s, e in sp if e - s >= p99]
        hit = {id(x): x for s, e in slow for x in mine
               if x["t"] < e and x["t"] + 0.001 + x["lag_ms"] / 1000 > s}
        print(f"trace {key}: {len(mine)} loop lags > 2 ms during the gateway rounds "
              f"(> 5 ms: {sum(x['lag_ms'] > 5 for x in mine)}, > 10 ms: "
              f"{sum(x['lag_ms'] > 10 for x in mine)}, sum {sum(x['lag_ms'] for x in mine):.1f} "
              f"ms); gc {len(during('gc', lo, hi))} collections "
              f"({sum(g[1] for g in during('gc', lo, hi)):.1f} ms), log batches "
              f"{len(during('drains', lo, hi))} (slowest "
              f"{max([d[1] for d in during('drains', lo, hi)] or [0]):.1f} ms), upstream connects "
              f"{len(during('upstream_connects', lo, hi))}, accepts {len(during('accepts', lo, hi))}"
              f"; slowest 1%: {len(slow)} requests >= {p99 * 1000:.1f} ms met {len(hit)} of them")
        for x in sorted(mine, key=lambda x: -x["lag_ms"])[:8]:
            a, b = x["t"], x["t"] + 0.001 + x["lag_ms"] / 1000
            g = during("gc", a, b)
            d = during("drains", a, b)
            print(f"  lag {x['lag_ms']:7.1f} ms at +{a - lo:7.3f} s: loop thread CPU "
                  f"{x['loop_cpu_ms']:.1f} ms, all threads {x['proc_cpu_ms']:.1f} ms, run-queue "
                  f"wait {x['runqueue_wait_ms']:.1f} ms, faults {x['major_faults']} major "
                  f"{x['minor_faults']} minor, switches {x['voluntary_switches']} voluntary "
                  f"{x['involuntary_switches']} involuntary, steal {x['steal_ticks']}; gc {[(q[2], q[1]) for q in g]}, log "
                  f"batches {[(q[2], q[3], q[1]) for q in d]}, upstream connects "
                  f"{len(during('upstream_connects', a, b))}, accepts "
                  f"{len(during('accepts', a, b))}; slow requests in it "
                  f"{sum(1 for s, e in slow if s < b and e > a)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve-upstream", type=float, nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=6400, help="loopback: requests per path")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64],
                    help="loopback: streams in flight (one comparison each)")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per path")
    ap.add_argument("--paced-gap-ms", type=float, default=20.0,
                    help="paced loopback upstream: ms between its 8 events (0: skip that run)")
    ap.add_argument("--paced-concurrency", type=int, default=64)
    ap.add_argument("--paced-requests", type=int, default=3200)
    ap.add_argument("--stagger", action="store_true",
                    help="paced run also with desynchronised open-loop arrivals (--arrivals) at "
                         "the rate that keeps --paced-concurrency streams open on average")
    ap.add_argument("--arrivals", nargs="+", choices=("poisson", "constant"),
                    default=["poisson"],
                    help="with --stagger: poisson (exponential gaps, as vLLM's "
                         "benchmark_serving) and/or constant (k6 constant-arrival-rate, wrk2 -R)")
    ap.add_argument("--workers", type=int, default=1,
                    help="gateway worker processes (more than 1: a redis-server is started)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    ap.add_argument("--no-vllm", action="store_true", help="skip the real CPU server")
    ap.add_argument("--baseline-gateway", metavar="PREFIXSCOPE",
                    help="the prefixscope executable of another install (e.g. main before a "
                         "change): its gateway is measured as a third path in the same rounds "
                         "(loopback and paced runs)")
    ap.add_argument("--client-gc", action="store_true",
                    help="leave the benchmark client's garbage collector on during the measured "
                         "rounds (before round 5 it was; its full collections stall the client)")
    ap.add_argument("--realtime", action="store_true",
                    help="paced runs: client, upstream and gateway on SCHED_FIFO (root), so "
                         "the machine's other processes cannot hold them off a CPU")
    ap.add_argument("--no-loopback", action="store_true",
                    help="skip the at-once loopback rows (paced runs and vLLM only)")
    ap.add_argument("--trace", type=Path, metavar="DIR",
                    help="run the paced gateway instrumented (benchmarks/gateway_trace.py: "
                         "loop lags, gc, log batches, new connections), write the trace and "
                         "the request spans to DIR and print which stalls the slowest "
                         "requests met")
    ap.add_argument("--vllm-requests", type=int, default=96)
    ap.add_argument("--vllm-concurrency", type=int, default=8)
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(int(args.serve_upstream[0]), args.serve_upstream[1])
        return
    global CLIENT_GC_ON
    CLIENT_GC_ON = args.client_gc
    ncpu = len(os.sched_getaffinity(0))
    pinned = ncpu >= 2 and not args.no_pin
    cpus = sorted(os.sched_getaffinity(0))
    gw_cpus = set(cpus[len(cpus) // 2:]) if pinned else set(cpus)
    rest = set(cpus[:len(cpus) // 2]) if pinned else set(cpus)
    if pinned:
        pin([os.getpid()], rest)
    load_before = os.getloadavg()
    results = []
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    redis = None
    try:
        store = "memory"
        if args.workers > 1:
            from tests.gateway_support import RedisServer

            redis = RedisServer(tmp / "redis")
            store = redis.url
            if pinned:
                pin([redis.proc.pid], rest)
        baseline: list = [None]  # (URL, pid) of the --baseline-gateway of the current upstream

        def loopback(gap_ms: float, label: str, trace: Path | None = None
                     ) -> tuple[subprocess.Popen, str, subprocess.Popen, str]:
            port = free_port()
            up_proc = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(port),
                                        str(gap_ms)])
            procs.append(up_proc)
            up = f"http://127.0.0.1:{port}"
            wait_http(up + "/v1/models")
            gw, gw_url = start_gateway(up, tmp / label, workers=args.workers, store=store,
                                       trace=trace)
            procs.append(gw)
            if pinned:
                pin([up_proc.pid], rest)
                pin(tree_pids(gw.pid), gw_cpus)
            if args.baseline_gateway:
                bl, bl_url = start_gateway(up, tmp / f"{label}-baseline", workers=args.workers,
                                           store=store, exe=args.baseline_gateway)
                procs.append(bl)
                if pinned:
                    pin(tree_pids(bl.pid), gw_cpus)
                baseline[0] = (bl_url, bl.pid)
            return up_proc, up, gw, gw_url

        up_proc, up, gw, gw_url = loopback(0.0, "loopback")
        for conc in ([] if args.no_loopback else args.concurrency):
            results.append(compare("loopback", up, gw_url, n=args.requests, concurrency=conc,
                                   rounds=args.rounds, upstream_pids=[up_proc.pid],
                                   gateway_pid=gw.pid, gateway_cpus=len(gw_cpus),
                                   baseline=baseline[0]))
        if args.paced_gap_ms > 0:
            trace_file = None
            if args.trace is not None:
                args.trace.mkdir(parents=True, exist_ok=True)
                trace_file = args.trace / "gateway-trace.json"
            up_proc, up, gw, gw_url = loopback(args.paced_gap_ms, "paced", trace_file)
            rt_pids = [os.getpid(), up_proc.pid, *tree_pids(gw.pid),
                       *(tree_pids(baseline[0][1]) if baseline[0] else []),
                       *([redis.proc.pid] if redis is not None else [])]
            if args.realtime:
                realtime(rt_pids, True)
            results.append(compare(f"paced{args.paced_gap_ms:g}", up, gw_url,
                                   n=args.paced_requests, concurrency=args.paced_concurrency,
                                   rounds=args.rounds, upstream_pids=[up_proc.pid],
                                   gateway_pid=gw.pid, gateway_cpus=len(gw_cpus),
                                   baseline=baseline[0]))
            for process in (args.arrivals if args.stagger else []):
                results.append(compare(f"paced{args.paced_gap_ms:g}", up, gw_url,
                                       n=args.paced_requests,
                                       concurrency=args.paced_concurrency, rounds=args.rounds,
                                       upstream_pids=[up_proc.pid], gateway_pid=gw.pid,
                                       gateway_cpus=len(gw_cpus), arrivals=process,
                                       stream_s=8 * args.paced_gap_ms / 1000,
                                       baseline=baseline[0]))
            if args.realtime:
                realtime(rt_pids, False)
        if not args.no_vllm:
            from tests.vllm_support import ServerConfig, start_server

            server = start_server(ServerConfig(kv_events=False, log_requests=False),
                                  log_dir=tmp / "vllm")
            try:
                gw2, gw2_url = start_gateway(server.base_url, tmp / "vllm-gw",
                                             workers=args.workers, store=store)
                procs.append(gw2)
                if pinned:
                    pin(tree_pids(gw2.pid), gw_cpus)
                results.append(compare("vllm-cpu", server.base_url, gw2_url,
                                       n=args.vllm_requests, concurrency=args.vllm_concurrency,
                                       rounds=2, upstream_pids=tree_pids(server.proc.pid),
                                       gateway_pid=gw2.pid, gateway_cpus=len(gw_cpus)))
            finally:
                server.stop()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
        if redis is not None:
            redis.stop()
    load_after = os.getloadavg()
    spans = {f"{r['upstream']}-{r['arrivals']}": r.pop("_gateway_spans") for r in results}
    if args.trace is not None:
        (args.trace / "spans.json").write_text(json.dumps(spans))
        trace_report(json.loads((args.trace / "gateway-trace.json").read_text()), results,
                     spans)
    layout = (f"gateway on CPU {sorted(gw_cpus)}, client+upstream on CPU {sorted(rest)}"
              if pinned else "not pinned")
    if args.realtime:
        layout += "; paced runs on SCHED_FIFO"
    print(f"{ncpu} CPUs ({layout}); gateway workers {args.workers}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; client collections during "
          f"the rounds (generation: count, longest ms) "
          f"{ {g: (c, round(ms, 1)) for g, (c, ms) in sorted(CLIENT_GC.items())} }")
    print(f"{'upstream':9} {'arrivals':8} {'conc':>4} {'path':8} {'p50 ms':>9} {'p99 ms':>9} "
          f"{'req/s':>8} {'open mean/max':>13} {'CPU ms/req: client':>19} {'upstream':>9} "
          f"{'gateway':>8}")
    for r in results:
        for label in ("direct", "gateway", "baseline"):
            if label not in r:
                continue
            d = r[label]
            c = d["cpu_ms_per_request"]
            opened = f"{d['open_streams_mean']:.1f}/{d['open_streams_max']}"
            print(f"{r['upstream']:9} {r['arrivals']:8} {r['concurrency']:>4} {label:8} "
                  f"{d['p50_ms']:>9.2f} {d['p99_ms']:>9.2f} {d['req_per_s']:>8.1f} "
                  f"{opened:>13} {c['client']:>19.3f} {c['upstream']:>9.3f} {c['gateway']:>8.3f}")
        kind = ""
        if r["upstream"].startswith("paced"):
            kind = (" [synchronised waves: the worst case]" if r["arrivals"] == "closed"
                    else f" [open loop, {r['offered_req_per_s']:g} req/s offered]")
        print(f"{'':9} {'':8} {'':>4} added p50 {r['added_p50_ms']:+.2f} ms, p99 "
              f"{r['added_p99_ms']:+.2f} ms, throughput {r['throughput_ratio']:.2f}x direct; "
              f"gateway CPU {r['gateway_cpu_ms_per_request']:.3f} ms/request"
              + (f", saturated floor {r['gateway_bound_floor_ms']:.2f} ms"
                 if r["upstream"] == "loopback" and r["concurrency"] > 1 else "") + kind)
        if "baseline" in r:
            print(f"{'':9} {'':8} {'':>4} baseline: added p50 {r['baseline_added_p50_ms']:+.2f} ms, "
                  f"p99 {r['baseline_added_p99_ms']:+.2f} ms, throughput "
                  f"{r['baseline_throughput_ratio']:.2f}x; gateway CPU "
                  f"{r['baseline_gateway_cpu_ms_per_request']:.3f} ms/request (this one "
                  f"{r['gateway_cpu_ms_per_request']:.3f})")
    print("GATEWAY_BENCH " + json.dumps({"results": results, "cpus": ncpu, "pinned": pinned,
                                         "workers": args.workers,
                                         "realtime": args.realtime,
                                         "client_gc": {str(g): c for g, c in CLIENT_GC.items()},
                                         "loadavg_before": [round(x, 2) for x in load_before],
                                         "loadavg_after": [round(x, 2) for x in load_after]}))


if __name__ == "__main__":
    main()
