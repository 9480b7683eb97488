"""Exact candidate tokens (gateway ``tokenize = "upstream"``) against what the real vLLM CPU
server reports, in shadow and in tenant mode.

For each case a writer W and a request R: through a fresh shadow-mode gateway (everything
forwarded isolated, so vLLM itself caches nothing for them) the decision of R carries the
candidate W and its ``candidate_cached_tokens`` computed from the token ids of both prompts
(``basis = exact``); then, with the engine's prefix cache emptied, W and R are sent directly to
vLLM under one shared ``cache_salt``: vLLM's ``cached_tokens`` of R must equal the gateway's
number. The old upper bound (W's prompt length) is shown to overstate the partial-share case.
In tenant mode the gateway forwards W and R under the tenant's derived salt (a fresh HMAC key:
nothing else is cached under it), so R's ``cached_tokens`` as vLLM reports it through the
gateway must equal R's exact candidate tokens.
"""

from __future__ import annotations

import json
import secrets

import httpx
import pytest

from prefixscope.core.decision_log import candidate_tokens
from tests.gateway_support import RunningGateway, gateway_config, headers_for, read_jsonl
from tests.vllm_support import BLOCK_SIZE, SERVED_MODEL_NAME, TEXTS, ServerConfig, vllm_pool  # noqa: F401

pytestmark = pytest.mark.vllm

_TEXTS = json.loads(TEXTS.read_text())
SYSTEM = _TEXTS["tpl:system"][:1800]
DOC = _TEXTS["doc:acme:issue"][:1500]
OTHER_DOC = _TEXTS["doc:globex:issue"][:1500]


def _chat(*contents: str) -> dict:
    roles = ["system", "user", "assistant", "user"]
    return {"model": SERVED_MODEL_NAME, "max_tokens": 2,
            "messages": [{"role": roles[i], "content": c} for i, c in enumerate(contents)]}


# name: (path, writer, request, whether the old upper bound overstates vLLM's number)
CASES = {
    # same system prompt, different documents: only the shared leading blocks (the writer's
    # length overstates them by the document's blocks)
    "shared_system": ("/v1/chat/completions", _chat(SYSTEM, "Document:\n" + DOC),
                      _chat(SYSTEM, "Document:\n" + OTHER_DOC), True),
    # the same prompt again: every whole block below the last prompt token
    "repeat": ("/v1/chat/completions", _chat(SYSTEM, "Summarise."), _chat(SYSTEM, "Summarise."),
               False),
    # a conversation that diverges only in its last question (inside the last block, so the
    # writer's length was right here too)
    "multi_turn": ("/v1/chat/completions",
                   _chat(SYSTEM, "Document:\n" + DOC, "Noted.", "Who reported it?"),
                   _chat(SYSTEM, "Document:\n" + DOC, "Noted.", "When was it closed?"), False),
    # a completions prompt repeated
    "completions_repeat": ("/v1/completions",
                           {"model": SERVED_MODEL_NAME, "max_tokens": 2, "prompt": DOC},
                           {"model": SERVED_MODEL_NAME, "max_tokens": 2, "prompt": DOC}, False),
}


@pytest.fixture(scope="module")
def server(vllm_pool):  # noqa: F811
    return vllm_pool.get(ServerConfig())


def _usage(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def _through_gateway(tmp_path, server, mode: str, path: str, writer: dict, request: dict
                     ) -> tuple[dict, dict, list[dict]]:
    """W then R through a fresh gateway (``tokenize = "upstream"``) in ``mode``: their usage
    as the gateway answered it, and the decision records."""
    gw = RunningGateway(gateway_config(tmp_path, server.base_url, mode=mode,
                                       tokenize="upstream", read_timeout_s=60.0))
    try:
        h = headers_for("acme")
        w = _usage(httpx.post(gw.url + path, json=writer, headers=h, timeout=120))
        r = _usage(httpx.post(gw.url + path, json=request, headers=h, timeout=120))
    finally:
        gw.stop()
    decisions = [d for d in read_jsonl(tmp_path / "logs" / "decisions.jsonl")
                 if d["record"] == "decision"]
    return w, r, decisions


@pytest.mark.parametrize("case", sorted(CASES))
def test_exact_candidate_tokens_equal_vllm_cached_tokens(tmp_path, server, case):
    path, writer, request, overstated = CASES[case]
    w, r, decisions = _through_gateway(tmp_path, server, "shadow", path, writer, request)
    assert [d["decision"] for d in decisions] == ["miss", "accept"]
    assert [d["candidate_tokens_basis"] for d in decisions] == ["exact", "exact"]
    exact = decisions[1]["candidate_cached_tokens"]

    server.reset_prefix_cache()
    salt = "exact-" + secrets.token_hex(8)
    base = server.base_url
    _usage(httpx.post(base + path, json=dict(writer, cache_salt=salt), timeout=120))
    direct = _usage(httpx.post(base + path, json=dict(request, cache_salt=salt), timeout=120))
    vllm_cached = direct["prompt_tokens_details"]["cached_tokens"]
    assert exact == vllm_cached
    assert vllm_cached > 0
    assert direct["prompt_tokens"] == r["prompt_tokens"]
    upper = candidate_tokens(w["prompt_tokens"], r["prompt_tokens"], BLOCK_SIZE)
    assert (upper > vllm_cached) is overstated  # what the old upper bound said


@pytest.mark.parametrize("case", sorted(CASES))
def test_exact_candidate_tokens_in_tenant_mode_equal_what_vllm_served(tmp_path, server, case):
    path, writer, request, _ = CASES[case]
    _, r, decisions = _through_gateway(tmp_path, server, "tenant", path, writer, request)
    assert [d["decision"] for d in decisions] == ["miss", "accept"]
    assert [d["salt_applied"] for d in decisions] == [True, True]
    assert [d["candidate_tokens_basis"] for d in decisions] == ["exact", "exact"]
    served = r["prompt_tokens_details"]["cached_tokens"]
    assert served > 0
    assert decisions[1]["candidate_cached_tokens"] == served
    assert decisions[1]["accepted_cached_tokens"] == served
