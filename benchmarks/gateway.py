"""What the gateway adds: latency p50/p99 and requests/s through the gateway vs direct, same run.

Two upstreams:

1. a minimal loopback upstream (a raw ASGI app under uvicorn in its own process, answering a
   chat completion stream of 8 events plus the usage chunk at once), so the gateway's own cost
   is what differs;
2. the real vLLM CPU server with the tiny model (``tests/vllm_support.py``; skipped with
   ``--no-vllm``).

For each upstream the same client (httpx, asyncio, one process) sends the same streaming chat
requests at the same concurrency, alternating rounds direct / through the gateway (a separate
``prefixscope gateway`` process, mode ``tenant``, in-process store), so both see the same machine
load. Latency = request sent to the last byte of the stream. Added latency = percentile through
the gateway minus the same percentile direct. Targets (issue 15): added p99 <= 5 ms at 64
concurrent streams, throughput >= 0.7x direct.

    .venv/bin/python benchmarks/gateway.py                 # both upstreams
    .venv/bin/python benchmarks/gateway.py --no-vllm --requests 4000

Prints a table and one JSON line (``GATEWAY_BENCH {...}``) with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
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


# --------------------------------------------------------------------------- the upstream

def upstream_app():
    """A raw ASGI app: /v1/models, /version, /metrics and a fixed chat completion stream."""
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                     "root": "/m", "parent": None}]}).encode()
    chunk = (b'data: {"id":"c","object":"chat.completion.chunk","model":"' + MODEL.encode()
             + b'","choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n')
    usage = (b'data: {"id":"c","object":"chat.completion.chunk","model":"' + MODEL.encode()
             + b'","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":8,'
             b'"prompt_tokens_details":{"cached_tokens":64}}}\n\n')
    metrics = b'vllm:cache_config_info{block_size="32",cache_dtype="auto"} 1.0\n'

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        if path == "/v1/chat/completions":
            asked = b'"include_usage": true' in body or b'"include_usage":true' in body
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for _ in range(8):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if asked:
                await send({"type": "http.response.body", "body": usage, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        out = {"/v1/models": models, "/version": b'{"version":"0.32.0+cpu"}',
               "/metrics": metrics}.get(path, b"{}")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})

    return app


def serve_upstream(port: int) -> None:
    import uvicorn

    uvicorn.run(upstream_app(), host="127.0.0.1", port=port, log_level="warning",
                access_log=False)


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


def start_gateway(upstream: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    from prefixscope.gateway.auth import key_digest

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "hmac.key").write_text(os.urandom(32).hex())
    (workdir / "keys.toml").write_text(f'[[key]]\nsha256 = "{key_digest(API_KEY)}"\n'
                                       'tenant = "bench"\n')
    port = free_port()
    (workdir / "gateway.toml").write_text(
        f'[gateway]\nupstreams = ["{upstream}"]\nport = {port}\nmode = "tenant"\n'
        f'hmac_key_file = "{workdir / "hmac.key"}"\napi_keys_file = "{workdir / "keys.toml"}"\n'
        f'log_dir = "{workdir / "logs"}"\nread_timeout_s = 120.0\npool_size = 256\n')
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefixscope"), "gateway",
                             "--config", str(workdir / "gateway.toml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health")
    return proc, url


# --------------------------------------------------------------------------- the client

def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def round_trip(base: str, *, n: int, concurrency: int, body: dict, headers: dict
                     ) -> tuple[list[float], float, int]:
    """n streaming requests with ``concurrency`` in flight; (latencies s, wall s, failures)."""
    import httpx

    lat: list[float] = []
    fails = 0
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        async def one():
            nonlocal fails
            async with sem:
                t0 = time.perf_counter()
                try:
                    async with client.stream("POST", base + "/v1/chat/completions", json=body,
                                             headers=headers) as r:
                        async for _ in r.aiter_raw():
                            pass
                        ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    lat.append(time.perf_counter() - t0)
                else:
                    fails += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t0
    return lat, wall, fails


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(name: str, direct: str, gateway: str, *, n: int, concurrency: int, rounds: int,
            body: dict, gateway_pid: int) -> dict:
    headers = {"authorization": f"Bearer {API_KEY}"}
    # warm both paths (connections, discovery)
    asyncio.run(round_trip(direct, n=concurrency, concurrency=concurrency, body=body,
                           headers=headers))
    asyncio.run(round_trip(gateway, n=concurrency, concurrency=concurrency, body=body,
                           headers=headers))
    res = {"direct": ([], 0.0, 0), "gateway": ([], 0.0, 0)}
    gw_cpu = 0.0
    for _ in range(rounds):
        for label, base in (("direct", direct), ("gateway", gateway)):
            c0 = cpu_s(gateway_pid)
            lat, wall, fails = asyncio.run(round_trip(base, n=n // rounds,
                                                      concurrency=concurrency, body=body,
                                                      headers=headers))
            if label == "gateway":
                gw_cpu += cpu_s(gateway_pid) - c0
            a, w, f = res[label]
            res[label] = (a + lat, w + wall, f + fails)
    out = {"upstream": name, "requests": n, "concurrency": concurrency, "rounds": rounds,
           "gateway_cpu_ms_per_request": round(gw_cpu * 1000 / max(1, len(res["gateway"][0])),
                                               3)}
    for label, (lat, wall, fails) in res.items():
        out[label] = {"p50_ms": round(pct(lat, 0.5) * 1000, 2),
                      "p99_ms": round(pct(lat, 0.99) * 1000, 2),
                      "req_per_s": round(len(lat) / wall, 1), "failures": fails}
    out["added_p50_ms"] = round(out["gateway"]["p50_ms"] - out["direct"]["p50_ms"], 2)
    out["added_p99_ms"] = round(out["gateway"]["p99_ms"] - out["direct"]["p99_ms"], 2)
    out["throughput_ratio"] = round(out["gateway"]["req_per_s"] / out["direct"]["req_per_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=3200, help="loopback: requests per path")
    ap.add_argument("--concurrency", type=int, default=64, help="streams in flight")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per path")
    ap.add_argument("--no-vllm", action="store_true", help="skip the real CPU server")
    ap.add_argument("--vllm-requests", type=int, default=96)
    ap.add_argument("--vllm-concurrency", type=int, default=8)
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    load_before = os.getloadavg()
    results = []
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    body = {"model": MODEL, "stream": True, "max_tokens": 8,
            "messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "Say something short."}]}
    try:
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(port)]))
        up = f"http://127.0.0.1:{port}"
        wait_http(up + "/v1/models")
        gw, gw_url = start_gateway(up, tmp / "loopback")
        procs.append(gw)
        results.append(compare("loopback", up, gw_url, n=args.requests,
                               concurrency=args.concurrency, rounds=args.rounds, body=body,
                               gateway_pid=gw.pid))
        if not args.no_vllm:
            from tests.vllm_support import ServerConfig, start_server

            server = start_server(ServerConfig(kv_events=False, log_requests=False),
                                  log_dir=tmp / "vllm")
            try:
                gw2, gw2_url = start_gateway(server.base_url, tmp / "vllm-gw")
                procs.append(gw2)
                results.append(compare("vllm-cpu", server.base_url, gw2_url,
                                       n=args.vllm_requests, concurrency=args.vllm_concurrency,
                                       rounds=2, body=body, gateway_pid=gw2.pid))
            finally:
                server.stop()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    load_after = os.getloadavg()
    print(f"{'upstream':10} {'conc':>4} {'path':8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
    for r in results:
        for label in ("direct", "gateway"):
            d = r[label]
            print(f"{r['upstream']:10} {r['concurrency']:>4} {label:8} {d['p50_ms']:>8.2f} "
                  f"{d['p99_ms']:>8.2f} {d['req_per_s']:>8.1f}")
        print(f"{'':10} {'':>4} added p50 {r['added_p50_ms']:+.2f} ms, p99 "
              f"{r['added_p99_ms']:+.2f} ms, throughput {r['throughput_ratio']:.2f}x direct, "
              f"gateway CPU {r['gateway_cpu_ms_per_request']:.2f} ms/request")
    print("GATEWAY_BENCH " + json.dumps({"results": results, "cpus": os.cpu_count(),
                                         "loadavg_before": [round(x, 2) for x in load_before],
                                         "loadavg_after": [round(x, 2) for x in load_after]}))


if __name__ == "__main__":
    main()
