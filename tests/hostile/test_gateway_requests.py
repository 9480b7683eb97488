"""Hostile requests to the gateway's proxy routes (a real gateway in uvicorn in front of the
real loopback upstream, real HTTP): JSON nested past the ingester's depth bound, a
non-boolean ``stream`` / ``stream_options``, a number past the double range (``1e999``:
valid JSON, said as such, not "not valid JSON"), an unexpected exception inside the handler, and
the response headers (each of ``date`` and ``server`` once)."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from prefixscope.gateway.app import Faults
from tests.gateway_support import (
    CHAT,
    RunningGateway,
    gateway_config,
    headers_for,
    loopback_upstream,
    read_jsonl,
)


@pytest.fixture
def upstream():
    with loopback_upstream() as app_and_control:
        yield app_and_control


def _decisions(tmp_path):
    return read_jsonl(tmp_path / "logs" / "decisions.jsonl")


def _client_errors(gw, code: str) -> float:
    return gw.gw.metrics.client_errors.labels(code)._value.get()


DEEP = {
    # the new user's two files: 100,000 nested lists, and the same inside a valid request
    "deep_list": b"[" * 100_000 + b"]" * 100_000,
    "deep_in_obj": (b'{"model":"tiny-llama-random","messages":[{"role":"user","content":"x"}],'
                    b'"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    # 65 levels: past the bound by one (an object and 64 lists)
    "deep_65": (b'{"model":"tiny-llama-random","messages":[{"role":"user","content":"x"}],'
                b'"x":' + b"[" * 64 + b"]" * 64 + b"}"),
}


@pytest.mark.parametrize("case", sorted(DEEP))
def test_deeply_nested_json_is_a_400_recorded_and_counted(tmp_path, upstream, case):
    app, control = upstream
    gw = RunningGateway(gateway_config(tmp_path, app.url))
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", content=DEEP[case], timeout=30,
                       headers={**headers_for("acme"), "content-type": "application/json"})
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == "bad_request"
        assert r.json()["error"]["message"] == "body is JSON nested deeper than 64 levels"
        assert _client_errors(gw, "bad_request") == 1
        assert control.requests == []
    finally:
        gw.stop()
    d = _decisions(tmp_path)
    assert len(d) == 1 and d[0]["error"] == "bad_request"


def test_brackets_inside_strings_do_not_count_as_depth(tmp_path, upstream):
    app, control = upstream
    gw = RunningGateway(gateway_config(tmp_path, app.url))
    try:
        body = dict(CHAT, messages=[{"role": "user", "content": "[{" * 5000}])
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers_for("acme"),
                       timeout=30)
        assert r.status_code == 200 and len(control.requests) == 1
    finally:
        gw.stop()
    assert [x.get("error") for x in _decisions(tmp_path)] == [None]


@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"1.5e400"])
def test_a_number_past_the_double_range_is_a_400_that_says_so(tmp_path, upstream, number):
    app, control = upstream
    gw = RunningGateway(gateway_config(tmp_path, app.url))
    body = (b'{"model":"tiny-llama-random","messages":[{"role":"user","content":"x"}],'
            b'"temperature":' + number + b'}')
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", content=body, timeout=30,
                       headers={**headers_for("acme"), "content-type": "application/json"})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "bad_request"
        assert r.json()["error"]["message"] == (
            "body has a number out of range (its magnitude is above 1.8e308, the largest "
            "finite double)")
        assert number.decode() not in r.text
        assert _client_errors(gw, "bad_request") == 1
        assert control.requests == []
    finally:
        gw.stop()
    d = _decisions(tmp_path)
    assert len(d) == 1 and d[0]["error"] == "bad_request"


@pytest.mark.parametrize("patch, message", [
    ({"stream": "yes"}, "stream: must be a boolean"),
    ({"stream": 1}, "stream: must be a boolean"),
    ({"stream": True, "stream_options": "yes"}, "stream_options: must be an object"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage: must be a boolean"),
])
def test_a_stream_flag_that_is_not_a_boolean_is_a_400(tmp_path, upstream, patch, message):
    app, control = upstream
    gw = RunningGateway(gateway_config(tmp_path, app.url))
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", json=dict(CHAT, **patch),
                       headers=headers_for("acme"), timeout=30)
        assert r.status_code == 400
        assert r.json()["error"] == {"message": message, "type": "gateway_error",
                                     "code": "bad_request"}
        assert control.requests == []
        # null is what vLLM's defaults are: passed
        ok = httpx.post(gw.url + "/v1/chat/completions",
                        json=dict(CHAT, stream=None, stream_options=None),
                        headers=headers_for("acme"), timeout=30)
        assert ok.status_code == 200 and len(control.requests) == 1
    finally:
        gw.stop()
    assert [x.get("error") for x in _decisions(tmp_path)] == ["bad_request", None]


def test_an_unexpected_exception_is_a_json_500_and_one_escaped_log_line(tmp_path, upstream,
                                                                       caplog):
    app, control = upstream

    async def boom(ns: str) -> None:  # a bug inside the handler; its text quotes the prompt
        raise RuntimeError('PROMPT-SECRET "Hello?"\nsecond line')

    gw = RunningGateway(gateway_config(tmp_path, app.url),
                        faults=Faults(between_lookup_and_permit=boom))
    try:
        with caplog.at_level(logging.ERROR, logger="prefixscope.gateway"):
            r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT,
                           headers=headers_for("acme"), timeout=30)
        assert r.status_code == 500
        assert r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        assert err["code"] == "internal_error" and "RuntimeError" in err["message"]
        assert "PROMPT-SECRET" not in r.text and "Traceback" not in r.text
        assert gw.admin("/admin/state")["permits_in_flight"] == 0
    finally:
        gw.stop()
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "prefixscope.gateway"]
    assert len(lines) == 1
    assert "\n" not in lines[0] and "PROMPT-SECRET" not in lines[0]
    assert "RuntimeError" in lines[0] and "app.py:" in lines[0]
    d = _decisions(tmp_path)
    assert len(d) == 1 and d[0]["error"] == "internal_error"


def test_each_response_has_one_date_and_one_server_header(tmp_path, upstream):
    app, _ = upstream
    gw = RunningGateway(gateway_config(tmp_path, app.url))
    try:
        for body in (CHAT, dict(CHAT, stream=True)):
            r = httpx.post(gw.url + "/v1/chat/completions", json=body,
                           headers=headers_for("acme"), timeout=30)
            assert r.status_code == 200
            names = [k.lower() for k, _ in r.headers.raw]
            assert names.count(b"date") == 1 and names.count(b"server") == 1, names
        r = httpx.get(gw.url + "/v1/models", headers=headers_for("acme"), timeout=30)
        names = [k.lower() for k, _ in r.headers.raw]
        assert names.count(b"date") == 1 and names.count(b"server") == 1, names
        assert json.loads(r.content)["data"][0]["id"] == CHAT["model"]
    finally:
        gw.stop()
