"""``prefixscope inventory digest``: the inventory lines it prints and appends are the ones the
gateway approves (a request built from the same messages is PUBLIC on a real gateway in front
of the loopback upstream), a text file is one system message, nothing is appended twice, and
a file of another shape is a usage error."""

from __future__ import annotations

import json

import httpx

from prefixscope.core.identity import PublicInventory, message_digest
from tests.gateway_support import CHAT, RunningGateway, gateway_config, headers_for, \
    loopback_upstream, read_jsonl


def test_appended_lines_make_the_gateway_serve_the_request_as_public(cli, tmp_path):
    body = tmp_path / "request.json"
    body.write_text(json.dumps(CHAT))
    inv = tmp_path / "inventory.txt"
    inv.write_text("# approved prompts\n")
    code, out, err = cli(["inventory", "digest", body, "--append", inv])
    assert code == 0, err
    assert f"{inv}: 2 line(s) added, 0 already there" in out
    want = [f"sha256:{message_digest(m)}" for m in CHAT["messages"]]
    assert [x.split()[0] for x in inv.read_text().splitlines()[1:]] == want
    assert "You are terse." not in out + inv.read_text()  # never the prompt text
    assert PublicInventory.from_file(inv).digests == {w.removeprefix("sha256:") for w in want}
    # again: nothing added twice
    code, out, _ = cli(["inventory", "digest", body, "--append", inv, "--json"])
    assert code == 0
    rows = json.loads(out)
    assert [(r["digest"], r["kind"], r["role"], r["added"]) for r in rows] == [
        (want[0], "message", "system", False), (want[1], "message", "user", False)]
    assert len(inv.read_text().splitlines()) == 3
    with loopback_upstream() as (app, _):
        gw = RunningGateway(gateway_config(tmp_path, app.url, mode="public",
                                           inventory_file=str(inv)))
        try:
            r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT,
                           headers=headers_for("acme"), timeout=10)
            assert r.status_code == 200, r.text
            other = dict(CHAT, messages=[CHAT["messages"][0],
                                         {"role": "user", "content": "Not approved?"}])
            r = httpx.post(gw.url + "/v1/chat/completions", json=other,
                           headers=headers_for("acme"), timeout=10)
            assert r.status_code == 200, r.text
        finally:
            gw.stop()
    scopes = [d["scope"] for d in read_jsonl(tmp_path / "logs" / "decisions.jsonl")
              if d.get("record") == "decision"]
    assert scopes == ["PUBLIC", "TENANT"]


def test_a_text_file_is_one_system_message_and_tools_get_their_own_line(cli, tmp_path):
    prompt = tmp_path / "system.txt"
    prompt.write_text("You are terse.")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    anth = tmp_path / "messages.json"  # a /v1/messages body: system is the first message
    anth.write_text(json.dumps({"model": "m", "system": "You are terse.", "tools": tools,
                                "messages": [{"role": "user", "content": "Hello?"}]}))
    code, out, err = cli(["inventory", "digest", prompt, anth, "--label", "team prompts"])
    assert code == 0, err
    sys_d = message_digest({"role": "system", "content": "You are terse."})
    from prefixscope.core.identity import toolset_digest
    assert out.splitlines() == [
        f"sha256:{sys_d} team prompts", f"sha256:{sys_d} team prompts",
        f"sha256:{message_digest({'role': 'user', 'content': 'Hello?'})} team prompts",
        f"sha256:{toolset_digest(tools)} team prompts"]


def test_a_request_with_render_options_gets_their_line(cli, tmp_path):
    from prefixscope.core.identity import render_digest

    body = {"model": "m", "messages": [{"role": "user", "content": "Hello?"}],
            "documents": [{"title": "t", "text": "public handbook"}],
            "chat_template_kwargs": {"enable_thinking": False}}
    f = tmp_path / "rag.json"
    f.write_text(json.dumps(body))
    code, out, err = cli(["inventory", "digest", f])
    assert code == 0, err
    assert out.splitlines() == [
        f"sha256:{message_digest(body['messages'][0])} rag.json message 0 (user)",
        f"sha256:{render_digest(body)} rag.json render 0 (render options)"]


def test_a_file_of_another_shape_is_a_usage_error(cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "m"}))
    code, _, err = cli(["inventory", "digest", bad])
    assert code == 2
    assert f"{bad}: expected a request body (messages, tools, system)" in err
    broken = tmp_path / "inventory.txt"
    broken.write_text("not-a-digest\n")
    ok = tmp_path / "p.txt"
    ok.write_text("x")
    code, _, err = cli(["inventory", "digest", ok, "--append", broken])
    assert code == 2 and f"{broken}:1: expected 'sha256:<64 lowercase hex>'" in err
    assert broken.read_text() == "not-a-digest\n"
