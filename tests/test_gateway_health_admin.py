"""The gateway's startup, health and admin answers against real loopback upstreams (real HTTP
both sides): what `candidate_tokens_basis` says without tokenizing (a miss is exact, a
candidate an upper bound, /v1/messages included), a dead or unreachable upstream shown at
start, in /health and to the client (503/502 ``upstream_error``, not 404 ``unknown_model``),
an unknown tenant refused by /admin/revoke, a stopped public generation reported at restart."""

from __future__ import annotations

import json

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
