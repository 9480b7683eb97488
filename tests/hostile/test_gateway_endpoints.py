"""Every POST endpoint of the gateway under the generated attacks (``targets.GATEWAY_TARGETS``
x ``payloads``: whole bodies that are not one JSON object, deep nesting, numbers past every
range, huge and control-character strings), against one real gateway (uvicorn, the real
loopback upstream, real HTTP): never a 5xx, never a traceback in the answer or the log, a JSON
error naming the field, and the gateway still serving. Then the exact answers of issue 27 #4:
admin bodies ``[]``, ``null``, ``"acme"``, a non-string principal, 100,000-deep JSON; a
trusted-proxy epoch header of ``²`` or 5,000 digits; ``from_epoch`` of ``"x"``, 1.5, NaN, -1. Then the generated refusals: an admin body with a
repeated key, a key its endpoint does not take, an id holding a control character (400 naming
it, nothing changed); an identity header repeated or an epoch header present but empty (400
naming it, on every endpoint that reads them)."""

from __future__ import annotations

import json
import logging
import socket

import httpx
import pytest

from tests.gateway_support import (
    ADMIN_TOKEN,
    CHAT,
    RunningGateway,
    gateway_config,
    headers_for,
    loopback_upstream,
)
from tests.hostile.payloads import HUGE, identity_header_attacks
from tests.hostile.targets import GATEWAY_TARGETS, IDENTITY_HEADERS

CASES = [(path, case, raw) for path, t in GATEWAY_TARGETS.items() for case, raw in t.cases()]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    d = tmp_path_factory.mktemp("gw-endpoints")
    with loopback_upstream() as (app, _control):
        g = RunningGateway(gateway_config(d, app.url, trusted_proxies=["127.0.0.1/32"]))
        yield g
        g.stop()


def _headers(path: str) -> dict[str, str]:
    h = ({"authorization": f"Bearer {ADMIN_TOKEN}"} if GATEWAY_TARGETS[path].admin
         else headers_for("acme"))
    return {**h, "content-type": "application/json"}


@pytest.mark.parametrize("path, case, raw", CASES,
                         ids=[f"{p}:{c}" for p, c, _ in CASES])
def test_no_endpoint_answers_5xx_or_a_traceback(gw, path, case, raw, caplog):
    with caplog.at_level(logging.ERROR):
        r = httpx.post(gw.url + path, content=raw, headers=_headers(path), timeout=60)
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert "Traceback" not in r.text and "Internal Server Error" not in r.text
    if path.startswith("/admin") and r.status_code >= 400 and r.status_code != 409:
        err = r.json()["error"]
        assert err["code"] in ("bad_request", "too_large", "unknown_tenant"), err
        assert "r" * 100 not in err["message"]  # the value is never quoted
    if path.startswith("/v1") and r.status_code in (400, 413):
        assert r.json()["error"]["code"] in ("bad_request", "too_large")
        assert "r" * 100 not in r.text
    assert [rec.getMessage()[:200] for rec in caplog.records
            if rec.levelno >= logging.ERROR] == []


def test_after_the_attacks_a_normal_request_is_served(gw):
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers_for("acme"),
                   timeout=30)
    assert r.status_code == 200


def _admin(gw, path: str, content: bytes) -> httpx.Response:
    return httpx.post(gw.url + path, content=content, timeout=30,
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"})


@pytest.mark.parametrize("content", [b"[]", b"null", b'"acme"', b"7", b"true"])
@pytest.mark.parametrize("path", ["/admin/revoke", "/admin/bypass"])
def test_an_admin_body_that_is_not_an_object_is_a_400(gw, path, content):
    r = _admin(gw, path, content)
    assert r.status_code == 400
    assert r.json()["error"] == {"message": 'admin body must be a JSON object, e.g. '
                                            '{"tenant": "..."}', "type": "gateway_error",
                                 "code": "bad_request"}


def test_a_deep_or_broken_admin_body_is_a_400(gw):
    r = _admin(gw, "/admin/revoke", b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "admin body is JSON nested deeper than 64 levels"
    r = _admin(gw, "/admin/revoke", b'{"tenant": "acme"')
    assert r.status_code == 400 and r.json()["error"]["message"] == "admin body must be JSON"
    r = _admin(gw, "/admin/revoke", b'{"tenant": "\xff"}')
    assert r.status_code == 400 and r.json()["error"]["message"] == "admin body must be JSON"
    r = _admin(gw, "/admin/revoke", json.dumps({"tenant": "r" * HUGE}).encode())
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"


@pytest.mark.parametrize("principal", [5, True, [], {}, ""])
def test_a_principal_that_is_not_a_string_is_a_400(gw, principal):
    r = _admin(gw, "/admin/revoke", json.dumps({"tenant": "acme",
                                                "principal": principal}).encode())
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "principal must be a non-empty string"


@pytest.mark.parametrize("from_epoch", [b'"x"', b"1.5", b"NaN", b"-1", b"true", b"1e999",
                                        str(2**63).encode()])
def test_a_from_epoch_that_is_not_an_epoch_is_a_400_naming_it(gw, from_epoch):
    r = _admin(gw, "/admin/revoke", b'{"tenant": "acme", "from_epoch": ' + from_epoch + b"}")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("from_epoch must be an integer from 0")
    # a real compare-and-set still answers: the epoch it saw moved -> 409
    state = _admin(gw, "/admin/revoke", b'{"tenant": "globex"}')
    assert state.status_code == 200
    now = state.json()["authorization_epoch"]
    moved = _admin(gw, "/admin/revoke", b'{"tenant": "globex", "from_epoch": %d}' % (now - 1))
    assert moved.status_code == 409


@pytest.mark.parametrize("epoch", ["²", "9" * 5000, "1.5", "-1", "+1", "1 2", "١", "0x1",
                                   "9" * 19])
def test_a_trusted_proxy_epoch_header_that_is_not_ascii_digits_is_a_400(gw, epoch):
    h = {"x-prefixscope-tenant": "acme", "x-prefixscope-auth-epoch": epoch}
    # httpx encodes header values as ASCII (latin-1 for str): send the raw bytes
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30,
                   headers={k: v.encode("utf-8") for k, v in h.items()})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": "x-prefixscope-auth-epoch: must be an authorization epoch: 1 to 18 ASCII "
                   "digits", "type": "gateway_error", "code": "bad_request"}
    m = httpx.get(gw.url + "/v1/models", timeout=30,
                  headers={k: v.encode("utf-8") for k, v in h.items()})
    assert m.status_code == 400


def test_a_trusted_proxy_epoch_header_of_digits_is_read(gw):
    h = {"x-prefixscope-tenant": "acme", "x-prefixscope-auth-epoch": "1"}
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=h, timeout=30)
    assert r.status_code == 200


# ------------------------------------------------- repeated keys, unknown keys, control chars

REFUSED = [(path, case, raw, key) for path, t in GATEWAY_TARGETS.items()
           for case, raw, key in t.refused_cases()]


@pytest.mark.parametrize("path, case, raw, key", REFUSED,
                         ids=[f"{p}:{c}" for p, c, _, _ in REFUSED])
def test_an_admin_body_with_a_repeated_or_unknown_key_or_a_control_character_is_a_400(
        gw, path, case, raw, key):
    before = _admin_state(gw)
    r = _admin(gw, path, raw)
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] == "bad_request" and key in err["message"], err
    assert _admin_state(gw) == before  # nothing changed: no epoch bumped, no flag set


def _admin_state(gw) -> dict:
    r = httpx.get(gw.url + "/admin/state", timeout=30,
                  headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    return {k: v for k, v in r.json().items() if k in ("cache_epoch", "public_stopped",
                                                        "bypass")}


def test_a_repeated_tenant_key_revokes_neither_tenant(gw):
    r = _admin(gw, "/admin/revoke", b'{"tenant": "acme", "tenant": "globex"}')
    assert r.status_code == 400
    assert r.json()["error"]["message"] == 'admin body repeats the key "tenant": each key once'
    r = _admin(gw, "/admin/cache-epoch/bump", b'{"tenant": "acme"}')
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ('admin body has an unknown key "tenant" '
                                            '(/admin/cache-epoch/bump takes no keys)')
    r = _admin(gw, "/admin/revoke", b'{"tenant": "a\\u0000b", "force": true}')
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("tenant holds a control character")


# ------------------------------------------------- identity headers: repeated, present-empty

HEADER_CASES = [(path, case, hdrs, name) for path, t in GATEWAY_TARGETS.items() if not t.admin
                for case, hdrs, name in identity_header_attacks(
                    IDENTITY_HEADERS, {"x-prefixscope-tenant": "acme"})]


@pytest.mark.parametrize("path, case, hdrs, name", HEADER_CASES,
                         ids=[f"{p}:{c}" for p, c, _, _ in HEADER_CASES])
def test_a_repeated_or_empty_identity_header_is_a_400_naming_it(gw, path, case, hdrs, name):
    body = json.dumps(GATEWAY_TARGETS[path].body).encode()
    status, err = _raw(gw, "POST", path, [("content-type", b"application/json"), *hdrs], body)
    assert status == 400, (status, err)
    assert err["code"] == "bad_request" and err["message"].startswith(name + ":"), err
    status, err = _raw(gw, "GET", "/v1/models", hdrs, b"")
    assert status == 400 and err["message"].startswith(name + ":"), (status, err)


def _raw(gw, method: str, path: str, headers: list[tuple[str, bytes]], body: bytes
         ) -> tuple[int, dict]:
    """One request over a raw socket, the headers sent exactly as given (httpx refuses a
    blank value): the status and the JSON error."""
    head = [f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()]
    head += [k.encode() + b": " + v + b"\r\n" for k, v in headers]
    head.append(b"Content-Length: %d\r\n\r\n" % len(body))
    with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as s:
        s.sendall(b"".join(head) + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    status = int(out.split(b" ", 2)[1])
    return status, json.loads(out.split(b"\r\n\r\n", 1)[1]).get("error", {})


def test_two_tenant_headers_never_pick_one(gw):
    h = [("x-prefixscope-tenant", b"acme"), ("x-prefixscope-tenant", b"globex")]
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=h, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ("x-prefixscope-tenant: repeated: an identity "
                                            "header must appear once")
    # one of each is served; an absent epoch stays "current"
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=h[:1], timeout=30)
    assert r.status_code == 200


def test_an_empty_epoch_header_is_never_current(gw):
    h = [("x-prefixscope-tenant", b"acme"), ("x-prefixscope-auth-epoch", b"")]
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=h, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ("x-prefixscope-auth-epoch: must be an "
                                            "authorization epoch: 1 to 18 ASCII digits")
