"""Layout language v2 (docs/replay.md#layouts): each transform on real request bodies, the file
schema errors, and a transform's effect through the exact model on the aider capture."""

from __future__ import annotations

import json

import pytest

from prefixscope.core.errors import ConfigError
from prefixscope.replay.layouts import Layout, granularity_seconds, load_layout, select_messages
from prefixscope.replay.diagnose import DiagnoseSpec, replay_totals
from tests.replay_io_support import AIDER_TRACE

BODY = {"model": "m", "messages": [
    {"role": "system", "content": "Session: 4f1c9a\nYou are a bot.\nNow: 2024-08-05T13:47:12Z"},
    {"role": "user", "content": "first at 13:47"},
    {"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"z": 1, "y": {"d": 1, "c": 2}}'},
    {"role": "user", "content": "second"}]}


def _apply(*transforms: dict) -> dict:
    return Layout.model_validate({"name": "t", "transforms": list(transforms)}).apply(BODY)


def _contents(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"]]


def test_selectors():
    msgs = BODY["messages"]
    assert select_messages(msgs, "system") == [0]
    assert select_messages(msgs, "user") == [1, 4]
    assert select_messages(msgs, "first_user") == [1]
    assert select_messages(msgs, "last_user") == [4]
    assert select_messages(msgs, "tool") == [3]
    assert select_messages(msgs, -1) == [4]
    assert select_messages(msgs, 9) == []


def test_remove_lines():
    out = _apply({"type": "remove_lines", "pattern": "^Session:"})
    assert _contents(out)[0] == "You are a bot.\nNow: 2024-08-05T13:47:12Z"
    assert _contents(BODY)[0].startswith("Session:")  # input unchanged


def test_replace_with_a_fixed_placeholder_and_a_group():
    out = _apply({"type": "replace", "pattern": r"^(Session: ).*$", "with": r"\1<session>",
                  "in": "system"})
    assert _contents(out)[0].split("\n")[0] == "Session: <session>"
    assert _contents(out)[1:] == _contents(BODY)[1:]


@pytest.mark.parametrize("g,system,user", [
    ("1h", "Now: 2024-08-05T13:00:00Z", "first at 13:00"),
    ("15m", "Now: 2024-08-05T13:45:00Z", "first at 13:45"),
    ("1d", "Now: 2024-08-05T00:00:00Z", "first at 00:00"),
])
def test_round_times(g, system, user):
    out = _apply({"type": "round_times", "granularity": g})
    assert _contents(out)[0].split("\n")[2] == system
    assert _contents(out)[1] == user


def test_granularity_forms():
    assert granularity_seconds("30s") == 30 and granularity_seconds("2h") == 7200
    with pytest.raises(ValueError):
        granularity_seconds("an hour")


@pytest.mark.parametrize("to,index,text", [
    ("first_user_end", 1, "first at 13:47\nSession: 4f1c9a"),
    ("last_user_end", 4, "second\nSession: 4f1c9a"),
    ("first_user_start", 1, "Session: 4f1c9a\nfirst at 13:47"),
    ("last_message_end", 4, "second\nSession: 4f1c9a"),
])
def test_move_lines_destinations(to, index, text):
    out = _apply({"type": "move_lines", "pattern": "^Session:", "to": to})
    assert _contents(out)[index] == text
    assert not _contents(out)[0].startswith("Session")


def test_move_lines_from_a_user_message_to_the_system_prompt():
    out = _apply({"type": "move_lines", "pattern": "at 13", "from": "first_user",
                  "to": "system_end"})
    assert _contents(out)[0].endswith("\nfirst at 13:47") and _contents(out)[1] == ""


def test_canonical_json_of_tool_messages_and_call_arguments():
    out = _apply({"type": "canonical_json"})
    assert _contents(out)[3] == '{"y": {"c": 2, "d": 1}, "z": 1}'
    assert json.loads(out["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 1}
    assert out["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 1}'


def test_bad_files_name_the_field(tmp_path):
    p = tmp_path / "l.yaml"
    p.write_text("name: x\ntransforms:\n  - {type: replace, pattern: 'a(', with: b}\n")
    with pytest.raises(ConfigError, match="transforms.0.replace.pattern"):
        load_layout(p)
    p.write_text("name: x\ntransforms:\n  - {type: remove_lines, pattern: a, in: everybody}\n")
    with pytest.raises(ConfigError, match="unknown message selector"):
        load_layout(p)
    p.write_text("name: x\ntransforms:\n  - {type: round_times, granularity: soon}\n")
    with pytest.raises(ConfigError, match="granularity"):
        load_layout(p)


def test_a_v2_layout_through_the_exact_model_on_aider():
    """Dropping the date line entirely shares the system prompt across days, like moving it."""
    base = replay_totals(DiagnoseSpec(trace=str(AIDER_TRACE)))
    removed = replay_totals(DiagnoseSpec(trace=str(AIDER_TRACE)), layout=Layout.model_validate(
        {"name": "no-date", "transforms": [{"type": "remove_lines",
                                            "pattern": "^- Current date: "}]}))
    rounded = replay_totals(DiagnoseSpec(trace=str(AIDER_TRACE)), layout=Layout.model_validate(
        {"name": "x", "transforms": [{"type": "round_times", "granularity": "1h"}]}))
    assert removed.hit_rate > 0.94 > base.hit_rate
    assert rounded.cached_tokens == base.cached_tokens  # dates alone are not rounded
