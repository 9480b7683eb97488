"""Prompt layouts: file schema, each transform, and their effect through the simulator."""

from __future__ import annotations

import pytest

from prefixscope.core.errors import ConfigError, SourceUnavailable
from prefixscope.replay.layouts import Layout, load_layout
from prefixscope.replay.sim import simulate
from prefixscope.replay.traces import read_trace
from prefixscope.replay.types import SimConfig
from tests.replay_io_support import (
    AIDER_TRACE,
    LAYOUT_DATE_AT_END,
    LAYOUT_DATE_FIRST_USER,
    LAYOUT_TOOLS,
    write_lines,
)

SYSTEM = "You are a bot.\n- Current date: 2024-08-05\nRules follow.\nBe brief."


def _chat(*users_and_replies: str) -> dict:
    msgs = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(users_and_replies):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": msgs}


def test_shipped_layout_files_load():
    assert load_layout(LAYOUT_DATE_AT_END).name == "date-at-end"
    assert load_layout(LAYOUT_DATE_FIRST_USER).transforms[0].to == "first_user_end"
    tools = load_layout(LAYOUT_TOOLS)
    assert [t.type for t in tools.transforms] == ["sort_tools", "canonical_tool_json"]


def test_move_lines_to_the_end_of_the_last_user_message():
    body = _chat("first", "reply", "second")
    out = load_layout(LAYOUT_DATE_AT_END).apply(body)
    assert out["messages"][0]["content"] == "You are a bot.\nRules follow.\nBe brief."
    assert out["messages"][3]["content"] == "second\n\n- Current date: 2024-08-05"
    assert out["messages"][1]["content"] == "first"
    assert body["messages"][0]["content"] == SYSTEM  # the input is not changed


def test_move_lines_to_the_first_user_message():
    out = load_layout(LAYOUT_DATE_FIRST_USER).apply(_chat("first", "reply", "second"))
    assert out["messages"][1]["content"] == "first\n\n- Current date: 2024-08-05"
    assert out["messages"][3]["content"] == "second"


def test_move_lines_without_a_match_or_a_user_message_leaves_the_request_as_is():
    layout = Layout.model_validate({"name": "x", "transforms": [
        {"type": "move_lines", "pattern": "^Request-Id: "}]})
    body = _chat("q")
    assert layout.apply(body) == body
    only_system = {"messages": [{"role": "system", "content": SYSTEM}]}
    assert load_layout(LAYOUT_DATE_AT_END).apply(only_system) == only_system


def test_sort_tools_and_canonical_tool_json():
    body = {"messages": [{"role": "user", "content": "u"}], "tools": [
        {"type": "function", "function": {"name": "zeta", "parameters": {"type": "object",
                                                                          "properties": {}}}},
        {"function": {"parameters": {"properties": {"b": 1, "a": 2}, "type": "object"},
                      "name": "alpha"}, "type": "function"}]}
    out = load_layout(LAYOUT_TOOLS).apply(body)
    assert [t["function"]["name"] for t in out["tools"]] == ["alpha", "zeta"]
    assert list(out["tools"][0]) == ["function", "type"]
    assert list(out["tools"][0]["function"]["parameters"]["properties"]) == ["a", "b"]


def test_canonical_tool_json_gives_the_same_tokens_whatever_the_key_order(tmp_path):
    schema_a = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    schema_b = {"required": ["q"], "properties": {"q": {"type": "string"}}, "type": "object"}
    lines = [{"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "search", "parameters": s}}]}
        for s in (schema_a, schema_b)]
    path = write_lines(tmp_path / "t.jsonl", lines)
    a, b = read_trace(path, format="chat").requests
    assert a.prompt_token_ids != b.prompt_token_ids
    a, b = read_trace(path, format="chat", layout=load_layout(LAYOUT_TOOLS)).requests
    assert a.prompt_token_ids == b.prompt_token_ids


def test_layout_file_errors_name_the_file_and_field(tmp_path):
    with pytest.raises(SourceUnavailable):
        load_layout(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntransforms:\n  - type: move_lines\n    pattern: '(['\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: transforms\.0\.move_lines\.pattern"):
        load_layout(bad)
    unknown = tmp_path / "u.toml"
    unknown.write_text('name = "x"\n[[transforms]]\ntype = "shuffle"\n')
    with pytest.raises(ConfigError, match=r"u\.toml: transforms\.0"):
        load_layout(unknown)
    extra = tmp_path / "e.yaml"
    extra.write_text("name: x\ncolour: red\n")
    with pytest.raises(ConfigError, match="colour"):
        load_layout(extra)
    (tmp_path / "l.json").write_text("{}")
    with pytest.raises(ConfigError, match=".yaml, .yml or .toml"):
        load_layout(tmp_path / "l.json")


def test_layouts_apply_only_to_chat_traces(tmp_path):
    from prefixscope.core.errors import UsageError

    path = write_lines(tmp_path / "t.jsonl", [{"prompt_token_ids": [1, 2], "t": 0}])
    with pytest.raises(UsageError, match="chat-request traces only"):
        read_trace(path, layout=load_layout(LAYOUT_DATE_AT_END))


def _hit_rate(layout, output_tokens="trace") -> float:
    reqs = read_trace(AIDER_TRACE, format="chat", output_tokens=output_tokens,
                      layout=load_layout(layout) if layout else None).requests
    run = simulate(reqs, SimConfig(block_size=16))
    for _ in run:
        pass
    return run.summary().hit_rate


def test_date_layouts_on_the_aider_trace_through_the_simulator():
    # The date line sits near the top of the system prompt and changes every day.
    # Moving it to the LAST user message shares the system prompt across days, but moves the
    # date inside the history at the next turn, so the previous prompt and its cached reply stop
    # being a prefix; moving it to the FIRST user message keeps both.
    as_recorded = _hit_rate(None)
    last_user = _hit_rate(LAYOUT_DATE_AT_END)
    first_user = _hit_rate(LAYOUT_DATE_FIRST_USER)
    assert round(as_recorded, 3) == 0.869
    assert round(last_user, 3) == 0.729
    assert round(first_user, 3) == 0.936
    # without cached replies (no decode blocks), moving the date to the end helps
    assert _hit_rate(None, "0") < _hit_rate(LAYOUT_DATE_AT_END, "0")
