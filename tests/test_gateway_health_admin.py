"""The gateway's startup, health and admin answers against real loopback upstreams (real HTTP
both sides): what `candidate_tokens_basis` says without tokenizing (a miss is exact, a
candidate an upper bound, /v1/messages included), a dead or unreachable upstream shown at
start, in /health and to the client (503/502 ``upstream_error``, not 404 ``unknown_model``),
an unknown tenant refused by /admin/revoke, a stopped public generation reported at restart."""

from __future__ import annotations


import httpx
import pytest
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.gateway_support import (
    CHAT,
    MODEL,
    RunningApp,
    RunningGateway,
    UpstreamControl,
    gateway_config,
    headers_for,
    loopback_upstream_app,
    read_jsonl,
)


def _upstream_with_messages() -> RunningApp:
    """The loopback upstream plus an Anthropic-shaped ``/v1/messages`` (vLLM's route)."""
    app = loopback_upstream_app(UpstreamControl())

    async def messages(request):
        await request.json()
        return JSONResponse({"id": "msg-1", "type": "message", "role": "assistant",
                             "model": MODEL, "content": [{"type": "text", "text": "ok"}],
                             "stop_reason": "end_turn",
                             "usage": {"input_tokens": 100, "output_tokens": 4}})

    app.router.routes.append(Route("/v1/messages", messages, methods=["POST"]))
    return RunningApp(app)


@pytest.fixture
def upstream():
    app = _upstream_with_messages()
    yield app
    app.stop()


def _decisions(tmp_path) -> list[dict]:
    return [d for d in read_jsonl(tmp_path / "logs" / "decisions.jsonl")
            if d.get("record") == "decision"]


def test_without_tokenize_a_miss_is_exact_and_a_candidate_an_upper_bound(tmp_path, upstream):
    gw = RunningGateway(gateway_config(tmp_path, upstream.url))
    assert gw.cfg.tokenize == "off"
    msgs = {"model": MODEL, "max_tokens": 4, "system": "You answer in French.",
            "messages": [{"role": "user", "content": "Hello?"}]}
    try:
        for _ in range(2):
            r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT,
                           headers=headers_for("acme"), timeout=10)
            assert r.status_code == 200, r.text
        for _ in range(2):
            r = httpx.post(gw.url + "/v1/messages", json=msgs, headers=headers_for("acme"),
                           timeout=10)
            assert r.status_code == 200, r.text
    finally:
        gw.stop()
    got = [(d["decision"], d["candidate_tokens_basis"], d["candidate_cached_tokens"])
           for d in _decisions(tmp_path)]
    # chat: a miss (0, exactly), then the same prompt accepted: the writer's 100 prompt tokens
    # floored to the 32-token block below 100 = 96, an upper bound; /v1/messages the same
    assert got == [("miss", "exact", 0), ("accept", "upper_bound", 96),
                   ("miss", "exact", 0), ("accept", "upper_bound", 96)]


def _dead_url() -> str:
    from tests.gateway_support import free_port
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_a_dead_upstream_shows_at_start_in_health_and_to_the_client(tmp_path, capsys):
    dead = _dead_url()
    gw = RunningGateway(gateway_config(tmp_path, dead))
    try:
        err = capsys.readouterr().err
        assert "prefixscope gateway: listening on http://127.0.0.1:" in err
        assert f"upstream {dead}: UNREACHABLE: {dead} could not be reached" in err
        r = httpx.get(gw.url + "/health", timeout=10)
        assert r.status_code == 503
        h = r.json()
        assert h["status"] == "unhealthy" and h["models"] == []
        assert [(u["url"], u["ok"]) for u in h["upstreams"]] == [(dead, False)]
        assert "could not be reached" in h["upstreams"][0]["error"]
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                       timeout=10)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "upstream_error"
        assert f"{dead} could not be reached" in r.json()["error"]["message"]
    finally:
        gw.stop()
    assert [d["error"] for d in _decisions(tmp_path)] == ["upstream_error"]


def test_an_upstream_killed_mid_run_turns_health_unhealthy(tmp_path, upstream, capsys):
    gw = RunningGateway(gateway_config(tmp_path, upstream.url))
    try:
        err = capsys.readouterr().err
        assert (f"upstream {upstream.url}: ok, models {MODEL}; runtime vllm 0.32.0+cpu "
                "(runtime digest: GET /version + vllm:cache_config_info of /metrics)") in err
        r = httpx.get(gw.url + "/health", timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert r.json()["upstreams"][0]["ok"] is True
        upstream.stop()
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                       timeout=10)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
        r = httpx.get(gw.url + "/health", timeout=10)  # the failure forced a re-check
        assert r.status_code == 503
        assert r.json()["status"] == "unhealthy"
        assert r.json()["models"] == [MODEL]  # last known, kept for when it comes back
        assert "could not be reached" in r.json()["upstreams"][0]["error"]
    finally:
        gw.stop()


@pytest.mark.parametrize("bad", ["not-a-url", "ftp://host:21", "http://", "http://h:99999"])
def test_an_upstream_that_is_not_a_url_is_a_usage_error(cli, tmp_path, bad):
    code, out, err = cli(["gateway", "--upstream", bad, "--port", "0"])
    assert code == 2
    assert f"error: gateway config: [gateway] upstreams: {bad!r} is not" in err and "is not an http:// or https:// URL" in err
    assert "Traceback" not in err


def _admin(gw: RunningGateway, path: str, body: dict | None = None) -> httpx.Response:
    from tests.gateway_support import ADMIN_TOKEN
    return httpx.post(gw.url + path, json=body, timeout=10,
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"})


def test_revoking_a_tenant_not_in_the_key_file_is_404_unless_forced(tmp_path, upstream):
    gw = RunningGateway(gateway_config(tmp_path, upstream.url))
    try:
        r = _admin(gw, "/admin/revoke", {"tenant": "nonexistent-tenant"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_tenant"
        assert '"force": true' in r.json()["error"]["message"]
        assert _admin(gw, "/admin/revoke", {"tenant": "acme", "force": "yes"}).status_code == 400
        r = _admin(gw, "/admin/revoke", {"tenant": "acme"})
        assert r.status_code == 200 and r.json()["authorization_epoch"] == 2
        r = _admin(gw, "/admin/revoke", {"tenant": "only-via-proxy", "force": True})
        assert r.status_code == 200 and r.json()["authorization_epoch"] == 2
    finally:
        gw.stop()
    events = [d for d in read_jsonl(tmp_path / "logs" / "decisions.jsonl")
              if d.get("record") == "event"]
    assert [e["event"] for e in events] == ["authorization_epoch_bump"] * 2


def test_a_stopped_public_generation_is_a_warning_at_restart(tmp_path, upstream, capsys):
    cfg = gateway_config(tmp_path, upstream.url, mode="public",
                         state_file=str(tmp_path / "state.json"))
    gw = RunningGateway(cfg)
    try:
        assert "warning" not in capsys.readouterr().err
        assert httpx.get(gw.url + "/health", timeout=10).json()["warnings"] == []
        assert _admin(gw, "/admin/public/stop").json() == {"public_stopped": True}
    finally:
        gw.stop()
    gw = RunningGateway(cfg)  # the same state file: PUBLIC stays stopped
    try:
        err = capsys.readouterr().err
        assert ("warning: mode public, but PUBLIC sharing was stopped by an earlier "
                "/admin/public/stop") in err
        h = httpx.get(gw.url + "/health", timeout=10)
        assert h.status_code == 200
        assert h.json()["warnings"][0].startswith("mode public, but PUBLIC sharing was stopped")
    finally:
        gw.stop()


def test_an_upstream_that_is_not_vllm_is_named_unhealthy_not_a_crash(tmp_path, capsys):
    from starlette.applications import Starlette

    async def models(request):
        return JSONResponse(["not", "a", "model", "list"])

    other = RunningApp(Starlette(routes=[Route("/v1/models", models)]))
    try:
        gw = RunningGateway(gateway_config(tmp_path, other.url))
        try:
            assert (f"upstream {other.url}: UNREACHABLE: {other.url}/v1/models is not a JSON "
                    "model list") in capsys.readouterr().err
            r = httpx.get(gw.url + "/health", timeout=10)
            assert r.status_code == 503 and r.json()["status"] == "unhealthy"
        finally:
            gw.stop()
    finally:
        other.stop()
