"""``prefixscope gateway --workers N``: N processes on one port share the registry, the
authorization epochs and the permit gate through a real redis-server; the in-process store is
refused with more than one worker; /metrics sums every worker; SIGTERM stops them all with
their logs flushed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prefixscope.core.errors import ConfigError
from prefixscope.gateway.config import load_gateway_config
from prefixscope.gateway.server import check_workers, worker_config
from tests.gateway_support import (
    ADMIN_TOKEN,
    CHAT,
    RedisServer,
    headers_for,
    loopback_upstream,
    read_jsonl,
    start_gateway_cli,
    write_secrets,
)
PREFIXSCOPE = str(Path(sys.executable).parent / "prefixscope")


def test_more_than_one_worker_needs_the_shared_store(tmp_path):
    secrets = write_secrets(tmp_path / "secrets")
    cfg = load_gateway_config(None, upstreams=["http://127.0.0.1:9"], workers=2, **secrets)
    with pytest.raises(ConfigError, match="workers > 1 needs store"):
        check_workers(cfg)
    r = subprocess.run([PREFIXSCOPE, "gateway", "--upstream", "http://127.0.0.1:9",
                        "--workers", "2", "--hmac-key-file", secrets["hmac_key_file"]],
                       capture_output=True, text=True, timeout=120,
                       env={"PATH": str(Path(sys.executable).parent)})
    assert r.returncode != 0
    assert "workers > 1 needs store" in r.stderr + r.stdout
    w1 = worker_config(cfg.model_copy(update={"store": "redis://127.0.0.1:1/0"}), 1)
    assert (w1.log_dir, w1.instance) == (str(Path("logs/gateway") / "worker-1"), "gateway-w1")


def _workers(pid: int) -> list[int]:
    """The spawned worker processes (not multiprocessing's resource tracker)."""
    kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def test_two_workers_share_registry_gate_and_metrics_in_redis(tmp_path):
    with loopback_upstream() as (app, _), RedisServer(tmp_path / "redis") as redis:
        _two_workers(tmp_path, app.url, redis.url)


def _two_workers(tmp_path, upstream_url: str, redis_url: str) -> None:
    proc = None
    try:
        logs = tmp_path / "logs"
        proc, url = start_gateway_cli(
            tmp_path, upstream_url,
            f'store = "{redis_url}"\nworkers = 2\nlog_dir = "{logs}"\nfsync_interval_s = 0.05\n')
        deadline = time.monotonic() + 120
        assert len(_workers(proc.pid)) == 2
        # /health may come from the first worker up: wait until both have built their gateway
        # (each opens its logs then), so a loaded machine cannot leave one still starting.
        while not all((logs / f"worker-{i}" / "decisions.jsonl").exists() for i in (0, 1)):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "a gateway worker did not open its logs"
            time.sleep(0.2)
        h = headers_for("acme")

        def post() -> None:  # a new connection each time: any worker may take it
            with httpx.Client(timeout=20) as c:
                assert c.post(url + "/v1/chat/completions", json=CHAT, headers=h
                              ).status_code == 200

        post()                            # writes the object (miss)
        for _ in range(10):
            post()                        # found by whichever worker: accept
        r = httpx.post(url + "/admin/revoke", json={"tenant": "acme"}, timeout=20,
                       headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 200
        for _ in range(5):
            post()                        # the new epoch everywhere: one reject (sent
            #                                 isolated, registers nothing), a miss, accepts
        text = httpx.get(url + "/metrics", timeout=20).text
        assert ('prefixscope_gateway_requests_total{endpoint="chat",scope="TENANT",status="2xx"}'
                ' 16.0') in text
        assert 'prefixscope_gateway_decisions_total{decision="accept",reason="none"} 13.0' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        decisions = sorted((d for p in sorted(logs.glob("worker-*/decisions.jsonl"))
                            for d in read_jsonl(p) if d["record"] == "decision"),
                           key=lambda d: d["ts_unix_s"])
        assert {p.parent.name for p in logs.glob("worker-*/decisions.jsonl")} == {
            "worker-0", "worker-1"}
        assert [(d["decision"], d["first_mismatch"]) for d in decisions] == (
            [("miss", None)] + [("accept", None)] * 10 + [("reject", "authorization_epoch")]
            + [("miss", None)] + [("accept", None)] * 3)
        usage = [u for p in logs.glob("worker-*/usage.jsonl") for u in read_jsonl(p)]
        assert len(usage) == 16
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
