"""Running the gateway for tests and benchmarks: in a uvicorn server on a free loopback port
(:class:`RunningGateway`), a minimal loopback upstream (:func:`loopback_upstream_app`: the
vLLM routes the gateway uses, with usage chunks, and switches to hang or drop mid-stream), a
real ``redis-server`` on a loopback port (:class:`RedisServer`), keys and key files."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from prefixscope.gateway.app import Faults
from prefixscope.gateway.auth import key_digest
from prefixscope.gateway.config import GatewayConfig, load_gateway_config
from prefixscope.gateway.server import build_gateway, make_server

TENANTS = {"acme": "key-acme-0123456789", "globex": "key-globex-0123456789"}
ADMIN_TOKEN = "admin-token-0123456789abcdef"
MODEL = "tiny-llama-random"  # the loopback upstream's model
CHAT = {"model": MODEL, "messages": [{"role": "system", "content": "You are terse."},
                                     {"role": "user", "content": "Hello?"}], "max_tokens": 4}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_secrets(d: Path, *, stale_epoch_for: str | None = None) -> dict[str, str]:
    """HMAC key, API key file (one key per tenant in :data:`TENANTS`, plus ``<tenant>-stale``
    issued at epoch 1 when asked), admin token; returns their paths."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "hmac.key").write_bytes(os.urandom(32).hex().encode())
    lines = []
    for tenant, key in TENANTS.items():
        lines.append(f'[[key]]\nsha256 = "{key_digest(key)}"\ntenant = "{tenant}"\n')
        if tenant == stale_epoch_for:
            lines.append(f'[[key]]\nsha256 = "{key_digest(key + "-stale")}"\ntenant = "{tenant}"'
                         f'\nepoch = 1\n')
    (d / "keys.toml").write_text("\n".join(lines))
    (d / "admin.token").write_text(ADMIN_TOKEN)
    return {"hmac_key_file": str(d / "hmac.key"), "api_keys_file": str(d / "keys.toml"),
            "admin_token_file": str(d / "admin.token")}


def gateway_config(tmp_path: Path, upstream_url: str, **over) -> GatewayConfig:
    """A gateway config for tests: secrets written to ``tmp_path/secrets``, logs in
    ``tmp_path/logs`` (flushed every 50 ms), tenant mode on a free port, ``upstream_url`` the
    only upstream; ``over`` replaces or adds any key."""
    opts = dict(upstreams=[upstream_url], port=0, mode="tenant", log_dir=str(tmp_path / "logs"),
                fsync_interval_s=0.05)
    if "hmac_key_file" not in over:
        opts.update(write_secrets(tmp_path / "secrets"))
    return load_gateway_config(None, **{**opts, **over})


class RunningGateway:
    """The gateway served by uvicorn in a thread; ``stop()`` is a graceful shutdown."""

    def __init__(self, cfg: GatewayConfig, *, faults: Faults | None = None) -> None:
        self.cfg = cfg
        self.gw = build_gateway(cfg, faults=faults)
        self.port = cfg.port or free_port()
        # the server `prefixscope gateway` runs (uvloop, the header deadline, the connection
        # cap, the shutdown grace), on a loopback port
        self.server = make_server(self.gw, cfg.model_copy(update={"host": "127.0.0.1",
                                                                  "port": self.port}))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 60) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "gateway did not stop"

    def admin(self, path: str, body: dict | None = None) -> dict:
        r = httpx.request("GET" if path == "/admin/state" else "POST", self.url + path,
                          json=body, headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                          timeout=10)
        r.raise_for_status()
        return r.json()


def start_gateway_cli(tmp_path: Path, upstream_url: str, settings: str, *,
                      timeout_s: float = 120) -> tuple[subprocess.Popen, str]:
    """Start the real ``prefixscope gateway --config`` in a subprocess (stderr piped) with a
    fresh port, the secrets of :func:`write_secrets` and the extra ``[gateway]`` TOML lines
    ``settings``; wait until ``/health`` answers 200. Returns (process, base URL); the caller
    stops the process."""
    import sys

    secrets = write_secrets(tmp_path / "secrets")
    port = free_port()
    (tmp_path / "gw.toml").write_text(
        f'[gateway]\nupstreams = ["{upstream_url}"]\nport = {port}\nmode = "tenant"\n'
        + settings + "".join(f'{k} = "{v}"\n' for k, v in secrets.items()))
    exe = str(Path(sys.executable).parent / "prefixscope")
    proc = subprocess.Popen([exe, "gateway", "--config", str(tmp_path / "gw.toml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.2)


def headers_for(tenant: str, *, suffix: str = "") -> dict[str, str]:
    return {"authorization": f"Bearer {TENANTS[tenant]}{suffix}"}


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# --------------------------------------------------------------------------- loopback upstream

class UpstreamControl:
    """Switches of the loopback upstream: ``mode`` = ``ok``, ``hang`` (never answers),
    ``drop`` (a stream closes after two events) or ``stall`` (a stream stops sending after two
    events, connection open); ``requests`` = bodies received."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[dict] = []
        self.stream_delay_s = 0.0


def loopback_upstream_app(control: UpstreamControl, *, model: str = "tiny-llama-random"):
    """A minimal vLLM-shaped upstream (Starlette): fixed answers with usage, SSE streams with
    a final usage chunk when ``stream_options.include_usage`` is set."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": model, "object": "model", "root": "/models/tiny", "parent": None,
             "max_model_len": 4096}]})

    async def version(request):
        return JSONResponse({"version": "0.32.0+cpu"})

    async def metrics(request):
        return PlainTextResponse('vllm:cache_config_info{block_size="32",cache_dtype="auto",'
                                 'prefix_caching_hash_algo="sha256"} 1.0\n')

    async def chat(request):
        body = await request.json()
        control.requests.append(body)
        if control.mode == "hang":
            await asyncio.sleep(3600)
        usage = {"prompt_tokens": 100, "completion_tokens": 4, "total_tokens": 104,
                 "prompt_tokens_details": {"cached_tokens": 64}}
        obj = "chat.completion" if request.url.path.endswith("chat/completions") else "text_completion"
        if not body.get("stream"):
            return JSONResponse({"id": "cmpl-1", "object": obj, "created": 1795960000,
                                 "model": model, "choices": [{"index": 0, "message": {
                                     "role": "assistant", "content": "ok"}}], "usage": usage})

        async def gen():
            for i in range(4):
                if control.stream_delay_s:
                    await asyncio.sleep(control.stream_delay_s)
                yield ("data: " + json.dumps({"id": "cmpl-1", "object": obj + ".chunk",
                                              "choices": [{"index": 0, "delta": {
                                                  "content": f"t{i}"}}]}) + "\n\n").encode()
                if control.mode == "drop" and i == 1:
                    raise RuntimeError("dropped")  # the server aborts the connection
                if control.mode == "stall" and i == 1:
                    await asyncio.sleep(3600)  # the stream stops mid-way, connection open
            if (body.get("stream_options") or {}).get("include_usage"):
                yield ("data: " + json.dumps({"id": "cmpl-1", "object": obj + ".chunk",
                                              "choices": [], "usage": usage}) + "\n\n").encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/version", version),
                             Route("/metrics", metrics),
                             Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/completions", chat, methods=["POST"])])


class RunningApp:
    """Any ASGI app served by uvicorn in a thread on a free loopback port."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="critical", access_log=False,
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@contextmanager
def loopback_upstream(*, model: str = MODEL):
    """``with loopback_upstream() as (app, control):`` the loopback upstream served on a free
    port (:class:`RunningApp`) and its switches; stopped on leaving."""
    control = UpstreamControl()
    app = RunningApp(loopback_upstream_app(control, model=model))
    try:
        yield app, control
    finally:
        control.mode = "ok"
        app.stop()


# --------------------------------------------------------------------------- redis

class RedisServer:
    """A real ``redis-server`` (Debian package) on a free loopback port, no persistence."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server not installed (deploy/bin/install-system-deps.sh)"
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)
