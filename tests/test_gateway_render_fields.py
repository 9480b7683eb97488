"""Every field that can change the tokens is part of the identity (issue 27 #2).

``prefixscope.core.identity.RENDER_FIELDS`` is the one list of request fields besides the
prompt and the tools that can change the token sequence vLLM builds (``documents``,
``chat_template_kwargs``, ``add_generation_prompt``...). Per field (parametrized over the list,
so a field added there is covered here or the test of :data:`VALUES` fails):

- through the live gateway (mode ``public``, a real loopback upstream, real HTTP): two tenants
  whose requests differ only in that field never share a PUBLIC salt, even when the inventory
  approves both variants; with only the messages approved, a request that sets it is not
  PUBLIC at all (the seed of the cross-tenant probe of the issue: approved messages with
  another tenant's guessed ``documents`` got the PUBLIC salt);
- through the replay model of the gateway (``replay/gateway.py``): the same requests give the
  same scopes, decisions and the same partition of salts as the live gateway (differential);
- ``/tokenize``: the field reaches the upstream's ``/tokenize`` body, or the request gets no
  token ids (candidate tokens stay an upper bound), never ids that ignore it.
"""

from __future__ import annotations

import json

import httpx
import pytest

from prefixscope.core.identity import (
    RENDER_FIELDS,
    PublicInventory,
    message_digest,
    render_digest,
)
from prefixscope.gateway.tokens import tokenize_request
from tests.gateway_support import (
    CHAT,
    TENANTS,
    RunningGateway,
    gateway_config,
    headers_for,
    loopback_upstream,
    read_jsonl,
)

#: Two values of each render field (a, b); absent is the third variant.
VALUES = {
    "chat_template": ("{{ messages }}", "{{ messages }}{{ documents }}"),
    "chat_template_kwargs": ({"enable_thinking": True}, {"enable_thinking": False}),
    "documents": ([{"title": "q3", "text": "guess one"}], [{"title": "q3", "text": "guess two"}]),
    "add_generation_prompt": (True, False),
    "continue_final_message": (False, True),
    "add_special_tokens": (False, True),
    "reasoning_effort": ("low", "high"),
    "tool_choice": ("auto", "required"),
    "response_format": ({"type": "text"}, {"type": "json_object"}),
    "mm_processor_kwargs": ({"num_crops": 4}, {"num_crops": 16}),
    "media_io_kwargs": ({"video": {"num_frames": 8}}, {"video": {"num_frames": 16}}),
    "truncate_prompt_tokens": (100, 200),
    "truncation_side": ("left", "right"),
    "prompt_embeds": ("AAAAAAAA", "BBBBBBBB"),
    "thinking": ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}),
}


def test_every_render_field_has_test_values():
    assert set(VALUES) == set(RENDER_FIELDS) and len(RENDER_FIELDS) == len(set(RENDER_FIELDS))


def _messages(field: str, tag: str = "") -> list[dict]:
    """Approved messages of their own per field (no lookup crosses fields) and ``tag``."""
    return [{"role": "system", "content": f"You are terse ({field}{tag})."},
            {"role": "user", "content": "Hello?"}]


def _body(field: str, variant: int | None, tag: str = "") -> dict:
    body = dict(CHAT, messages=_messages(field, tag))
    if variant is not None:
        body[field] = VALUES[field][variant]
    return body


def _inventory_lines(render_too: bool) -> str:
    lines = []
    for f in RENDER_FIELDS:
        for tag in ("", "/diff", "/diff0", "/diff1"):
            lines += [f"sha256:{message_digest(m)}\n" for m in _messages(f, tag)]
        if render_too:
            lines += [f"sha256:{render_digest(_body(f, v))}\n" for v in (0, 1)]
    return "".join(lines)


@pytest.fixture(scope="module")
def upstream():
    with loopback_upstream() as app_and_control:
        yield app_and_control


def _public_gateway(tmp_path, upstream_url, render_too: bool) -> RunningGateway:
    inv = tmp_path / "inventory.txt"
    inv.write_text(_inventory_lines(render_too))
    return RunningGateway(gateway_config(tmp_path, upstream_url, mode="public",
                                         inventory_file=str(inv)))


@pytest.fixture(scope="module")
def approved(tmp_path_factory, upstream):
    """A public-mode gateway whose inventory approves every field's messages and both render
    variants of each field."""
    d = tmp_path_factory.mktemp("approved")
    gw = _public_gateway(d, upstream[0].url, render_too=True)
    yield gw, d
    gw.stop()


@pytest.fixture(scope="module")
def messages_only(tmp_path_factory, upstream):
    """The same, approving the messages only."""
    d = tmp_path_factory.mktemp("messages-only")
    gw = _public_gateway(d, upstream[0].url, render_too=False)
    yield gw, d
    gw.stop()


def _send(gw: RunningGateway, control, tenant: str, body: dict) -> tuple[str, dict]:
    """(salt sent upstream, request id) of one request (its decision record is read from
    the log, flushed every 50 ms: :func:`_decision`)."""
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers_for(tenant),
                   timeout=30)
    assert r.status_code == 200, r.text
    rid = r.headers["x-prefixscope-request-id"]
    return control.requests[-1]["cache_salt"], rid


def _decision(d, rid: str, timeout_s: float = 10) -> dict:
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        for rec in read_jsonl(d / "logs" / "decisions.jsonl"):
            if rec.get("request_id") == rid:
                return rec
        assert time.monotonic() < deadline, f"no decision record for {rid}"
        time.sleep(0.05)


@pytest.mark.parametrize("field", RENDER_FIELDS)
def test_requests_differing_only_in_a_render_field_never_share_a_public_salt(
        field, approved, upstream):
    gw, d = approved
    _, control = upstream
    # acme and globex: absent, a, b; then globex repeats acme's exact request
    sent = {}
    for tenant, variant in (("acme", None), ("acme", 0), ("acme", 1), ("globex", 1)):
        salt, rid = _send(gw, control, tenant, _body(field, variant))
        sent[(tenant, variant)] = (salt, _decision(d, rid))
    salts = {k: v[0] for k, v in sent.items()}
    scopes = {k: v[1]["scope"] for k, v in sent.items()}
    assert set(scopes.values()) == {"PUBLIC"}, scopes  # every variant approved
    assert len({salts[("acme", v)] for v in (None, 0, 1)}) == 3, salts
    # the detector works: the same approved request of another tenant does share the salt
    assert salts[("globex", 1)] == salts[("acme", 1)]
    assert sent[("globex", 1)][1]["decision"] == "accept"


@pytest.mark.parametrize("field", RENDER_FIELDS)
def test_a_render_field_off_the_inventory_is_not_public(field, messages_only, upstream):
    gw, d = messages_only
    _, control = upstream
    plain_salt, plain = _send(gw, control, "acme", _body(field, None))
    salt_a, rid_a = _send(gw, control, "acme", _body(field, 0))
    salt_b, rid_b = _send(gw, control, "globex", _body(field, 0))
    assert _decision(d, plain)["scope"] == "PUBLIC"
    assert _decision(d, rid_a)["scope"] == "TENANT" and _decision(d, rid_b)["scope"] == "TENANT"
    assert len({plain_salt, salt_a, salt_b}) == 3  # a guess of another tenant's value: no share


@pytest.mark.parametrize("field", RENDER_FIELDS)
def test_tokenize_carries_each_render_field_or_gives_no_ids(field):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for v in (0, 1):
        body = _body(field, v)
        if field == "tool_choice":  # vLLM renders tool_choice only beside tools
            body["tools"] = tools
        for endpoint in ("chat", "completions"):
            b = body if endpoint == "chat" else {"model": CHAT["model"], "prompt": "Hello?",
                                                 field: VALUES[field][v]}
            req = tokenize_request(endpoint, b)
            if req is None:
                continue
            assert isinstance(req, dict)
            value = VALUES[field][v]
            carried = req.get(field, (req.get("chat_template_kwargs") or {}).get(field))
            assert carried == value, (endpoint, field, req)
    # the two values never give the same /tokenize body
    a, b = (tokenize_request("chat", dict(_body(field, v), tools=tools)) for v in (0, 1))
    assert a is None or a != b


def test_tokenize_gives_documents_and_reasoning_effort_to_the_template():
    body = dict(CHAT, documents=[{"title": "t", "text": "x"}], reasoning_effort="none",
                chat_template_kwargs={"k": 1})
    req = tokenize_request("chat", body)
    assert req["chat_template_kwargs"] == {"k": 1, "documents": [{"title": "t", "text": "x"}],
                                           "reasoning_effort": "none", "enable_thinking": False}
    assert "documents" not in req and "reasoning_effort" not in req
    assert tokenize_request("chat", dict(CHAT, truncate_prompt_tokens=5)) is None
    assert tokenize_request("chat", dict(CHAT, chat_template_kwargs="x",
                                         documents=[])) is None


# --------------------------------------------------------------------------- differential

def _replay_model(inventory: PublicInventory):
    from prefixscope.replay.gateway import Gateway
    from prefixscope.replay.gateway_trace import TraceHeader

    return Gateway(bytes(range(32)), TraceHeader(model=CHAT["model"]), inventory=inventory)


def _replay(model, rid: str, tenant: str, body: dict) -> tuple[str, str, str]:
    from prefixscope.core.identity import render_options
    from prefixscope.replay.gateway_trace import AuthContext, GatewayRequest

    routed = model.route(GatewayRequest(rid, 0.0, AuthContext(tenant), tuple(body["messages"]),
                                        render=render_options(body)))
    return (routed.decision.scope, routed.decision.decision, routed.trace_request.cache_salt)


def _partition(salts: list[str]) -> list[int]:
    """Each salt's first index: equal lists mean the same requests share salts."""
    return [salts.index(s) for s in salts]


@pytest.mark.parametrize("render_too", [True, False], ids=["approved", "messages-only"])
def test_gateway_and_its_replay_model_agree_on_render_fields(tmp_path, upstream, render_too):
    """The same request sequence through the live gateway and the replay model: per field and
    variant (absent, a, b) a prompt of its own sent by acme, then by globex, then acme's with
    the other variant's messages; the same scopes, decisions and salt partition.

    (The variants do not share messages here: after a version reject the gateway registers
    nothing and the replay model registers the rejected request's objects, a difference
    issue 30 #1 removes; the salt tests above cover shared messages.)"""
    _, control = upstream
    gw = _public_gateway(tmp_path, upstream[0].url, render_too)
    inventory = PublicInventory.from_file(tmp_path / "inventory.txt")
    model = _replay_model(inventory)
    live, replayed = [], []
    try:
        for field in RENDER_FIELDS:
            for v in (None, 0, 1):
                tag = f"/diff{v}" if v is not None else "/diff"
                for i, tenant in enumerate(("acme", "globex")):
                    body = _body(field, v, tag)
                    salt, rid = _send(gw, control, tenant, body)
                    rec = _decision(tmp_path, rid)
                    live.append((rec["scope"], rec["decision"], salt))
                    replayed.append(_replay(model, f"{field}-{v}-{i}", tenant, body))
    finally:
        gw.stop()
    assert [x[:2] for x in live] == [x[:2] for x in replayed]
    assert _partition([x[2] for x in live]) == _partition([x[2] for x in replayed])
    expected = []
    for _field in RENDER_FIELDS:
        for v in (None, 0, 1):
            expected += ([("PUBLIC", "miss"), ("PUBLIC", "accept")] if render_too or v is None
                         else [("TENANT", "miss"), ("TENANT", "miss")])
    assert [x[:2] for x in live] == expected
    assert all(t not in json.dumps(live) for t in TENANTS.values())
