"""One scenario per typical breaker of the product brief: each must be named as its kind at
the right message and line (real tokenizer, real chat template, the exact cache model)."""

from __future__ import annotations

import json
import uuid

import pytest

from prefixscope.replay.diagnose import DiagnoseSpec, attribution_pass
from prefixscope.replay.diagnose_fix import diagnose

# A long stable instruction block (about 40 blocks of 16 tokens).
STABLE = "\n".join(
    f"Rule {i}: answer questions about the {w} module with short, correct code examples."
    for i, w in enumerate(["json", "os", "re", "pathlib", "typing", "asyncio", "sqlite3",
                           "logging", "argparse", "datetime", "decimal", "heapq"], start=1))
QUESTIONS = [f"How do I use feature number {i} of the standard library, in detail?"
             for i in range(12)]
NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi"]


def _tool(name: str, description: str = "A tool.") -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": f"The path {name} works on."},
            "limit": {"type": "integer", "description": "How many lines at most."}},
            "required": ["path"]}}}


TOOLS = [_tool(n, f"{n} does one thing with the files of the repository, carefully.")
         for n in ("read_file", "write_file", "list_dir", "search", "run_tests")]


def _write(tmp_path, bodies: list[dict]) -> str:
    path = tmp_path / "trace.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, b in enumerate(bodies):
            rec = {"request_id": b.pop("request_id", f"r{i}"), "t": float(i), "output_tokens": 0,
                   **b}
            fh.write(json.dumps(rec) + "\n")
    return str(path)


def _req(system: str, user: str, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": user}], **extra}


def _top(path: str, **spec) -> dict:
    d = diagnose(DiagnoseSpec(trace=path, output_tokens="0", **spec))
    assert d.breakers, "no breaker found"
    return d.breakers[0].as_dict()


def test_timestamp_on_line_1_of_the_system_prompt(tmp_path):
    bodies = [_req(f"Current time: 2024-08-05T10:{i:02d}:00Z\n{STABLE}", QUESTIONS[i])
              for i in range(8)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["segment"], b["role"], b["message_index"], b["line"]) == \
        ("timestamp", "message", "system", 0, 1)
    assert b["requests"] == 7 and b["distinct_values"] == 7
    assert b["lost_tokens_measured"] and b["lost_tokens"] > 7 * 250
    assert b["fixable"] and b["transforms"][0]["type"] == "move_lines"


def test_session_id_before_the_stable_part(tmp_path):
    bodies = [_req(f"You are a support bot.\nSession: {uuid.UUID(int=i * 7919 + 1)}\n{STABLE}",
                   QUESTIONS[i]) for i in range(6)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["role"], b["line"]) == ("id", "system", 2)


def test_user_name_before_the_stable_part(tmp_path):
    bodies = [_req(f"You are helping {NAMES[i]} today.\n{STABLE}", QUESTIONS[i])
              for i in range(6)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["role"], b["line"]) == ("name", "system", 1)


@pytest.mark.parametrize("change,kind", [
    (lambda i: TOOLS if i % 2 == 0 else [_tool("fetch_url")] + TOOLS, "tools_added"),
    (lambda i: TOOLS if i % 2 == 0 else TOOLS[1:], "tools_removed"),
    (lambda i: TOOLS if i % 2 == 0 else TOOLS[::-1], "tools_reordered"),
])
def test_tools_added_removed_or_reordered(tmp_path, change, kind):
    bodies = [_req("You are a coding agent.", QUESTIONS[i], tools=change(i)) for i in range(8)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["segment"]) == (kind, "tools")
    if kind == "tools_reordered":
        assert b["fixable"] and b["transforms"] == [{"type": "sort_tools"}]
        assert b["lost_tokens_measured"] and b["lost_tokens"] > 0
    else:
        assert not b["fixable"]


def test_tool_description_change_names_the_tool_and_key(tmp_path):
    # Issue 26: a changed description was called tool_schema, and canonical_tool_json (which
    # cannot change a description) was suggested. It is tool_description, a client fix.
    changed = [_tool("read_file", "Reads a file.")] + TOOLS[1:]
    bodies = [_req("You are a coding agent.", QUESTIONS[i],
                   tools=TOOLS if i < 3 else changed) for i in range(6)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["segment"], b["tool"], b["schema_key"]) == \
        ("tool_description", "tools", "read_file", "description")
    assert not b["fixable"] and b["transforms"] == []
    assert b["client_fix"]["change"].startswith("keep the tool's description fixed")


def test_a_changed_tool_schema_is_not_a_key_order(tmp_path):
    """A parameter added to a tool's schema: tool_schema, no layout fix (canonical_tool_json,
    which only sorts keys, is not suggested)."""
    grown = json.loads(json.dumps(TOOLS))
    grown[0]["function"]["parameters"]["properties"]["encoding"] = {"type": "string"}
    bodies = [_req("You are a coding agent.", QUESTIONS[i], tools=TOOLS if i < 3 else grown)
              for i in range(6)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["tool"], b["fixable"], b["transforms"]) == \
        ("tool_schema", "read_file", False, [])
    assert b["client_fix"]["change"] == "keep one version of every tool (a client change)"


def test_instruction_edited_with_one_typo(tmp_path):
    lines = STABLE.split("\n")
    typo = "\n".join(lines[:2] + [lines[2].replace("questions", "qeustions")] + lines[3:])
    bodies = [_req(STABLE if i < 4 else typo, QUESTIONS[i]) for i in range(8)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["role"], b["message_index"], b["line"]) == ("edited_text", "system", 0, 3)
    assert b["requests"] == 1 and not b["fixable"]
    assert b["lost_tokens_measured"] and b["lost_tokens"] > 0


def test_document_changed_near_its_start(tmp_path):
    doc = STABLE.replace("Rule", "Clause")
    doc2 = doc.replace("Clause 2:", "Clause 2 (amended):")
    bodies = [_req("You answer questions about the document.",
                   f"{doc if i < 4 else doc2}\n\nQuestion: {QUESTIONS[i]}") for i in range(8)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["role"], b["message_index"], b["line"]) == ("edited_text", "user", 1, 2)


def test_pages_sent_in_another_order(tmp_path):
    pages = [f"Page {k}: " + STABLE.split("\n")[k] for k in range(6)]
    bodies = [_req("You answer questions about the pages.",
                   "\n".join(pages if i % 2 == 0 else pages[1:] + pages[:1])
                   + f"\n\nQuestion: {QUESTIONS[i]}") for i in range(8)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["role"], b["message_index"], b["line"]) == \
        ("reordered_content", "user", 1, 1)


def test_earlier_turns_summarised(tmp_path):
    u1 = "Please review my module " + STABLE
    a1 = "Here is the review: " + STABLE.replace("Rule", "Finding")
    turns = [
        [{"role": "user", "content": u1}],
        [{"role": "user", "content": u1}, {"role": "assistant", "content": a1},
         {"role": "user", "content": "And the tests?"}],
        [{"role": "user", "content": "Summary of the conversation so far: a module review."},
         {"role": "assistant", "content": "Noted."},
         {"role": "user", "content": "Now the documentation, please."}],
    ]
    bodies = [{"model": "m", "messages": [{"role": "system", "content": "You review code."}] + t}
              for t in turns]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["role"], b["message_index"], b["line"]) == \
        ("history_rewritten", "user", 1, 1)


def test_model_switch(tmp_path):
    bodies = [_req(STABLE, QUESTIONS[i]) for i in range(4)]
    bodies += [dict(_req(STABLE, QUESTIONS[4 + i]), model="other") for i in range(2)]
    path = _write(tmp_path, bodies)
    b = _top(path, scope_by_model=True)
    assert (b["kind"], b["requests"]) == ("model_switch", 1)
    assert not b["fixable"]
    # One shared cache (replay sim's default): the switch costs nothing.
    p = attribution_pass(DiagnoseSpec(trace=path, output_tokens="0"))
    assert not p.groups


def test_long_idle_gap_under_a_small_cache(tmp_path):
    first = _req(STABLE, QUESTIONS[0])
    others = [_req(f"Unrelated assistant number {i}.\n" + STABLE.replace("Rule", f"R{i}"),
                   QUESTIONS[1]) for i in range(6)]
    back = _req(STABLE, QUESTIONS[2])
    path = _write(tmp_path, [first, *others, back])
    b = _top(path, capacity_blocks=120)
    assert (b["kind"], b["requests"]) == ("evicted", 1)
    assert b["lost_tokens_measured"] and b["lost_tokens"] >= 16 * 15
    assert b["suggestion"].startswith("not fixable by layout")


def test_different_salt(tmp_path):
    bodies = [dict(_req(STABLE, QUESTIONS[i]), cache_salt="tenant-a" if i < 3 else "tenant-b")
              for i in range(6)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["requests"]) == ("different_salt", 1)


def test_whitespace_only(tmp_path):
    bodies = [_req(STABLE if i % 2 == 0 else STABLE.replace("\n", " \n", 1), QUESTIONS[i])
              for i in range(6)]
    b = _top(_write(tmp_path, bodies))
    assert (b["kind"], b["role"], b["line"]) == ("whitespace", "system", 1)


def test_reordered_tools_hidden_behind_a_timestamp_is_found_at_level_2(tmp_path):
    bodies = [_req(f"Current time: 2024-08-05T10:{i:02d}:00Z\n{STABLE}", QUESTIONS[i],
                   tools=TOOLS if i % 2 == 0 else TOOLS[::-1]) for i in range(8)]
    d = diagnose(DiagnoseSpec(trace=_write(tmp_path, bodies), output_tokens="0"))
    kinds = [(b.level, b.kind) for b in d.breakers]
    assert kinds[0] == (1, "timestamp")
    assert (2, "tools_reordered") in kinds
    fixes = [t["type"] for t in d.suggested_layout.as_dict()["transforms"]]
    assert fixes == ["move_lines", "sort_tools"]
    assert d.what_if.hit_rate > d.summary.hit_rate + 0.3


def test_a_log_without_any_shared_prefix_says_so(tmp_path):
    bodies = [_req(f"System {i}: " + "x" * (i + 1), f"q{i}") for i in range(3)]
    d = diagnose(DiagnoseSpec(trace=_write(tmp_path, bodies), output_tokens="0"))
    assert d.notes == ["no two requests share a full block: nothing in this trace can be "
                       "served from cache at this block size"]
    assert d.breakers == []


def _conversation_with_a_time_per_request(turns: int) -> list[dict]:
    """One conversation of ``turns`` turns; the system prompt's first line is the time the
    request was sent (a new value every request, as the demo's release adds)."""
    bodies, history = [], []
    for i in range(turns):
        history = history + [{"role": "user", "content": QUESTIONS[i] + " " + STABLE[:200]}]
        system = f"Current time: 2024-08-05T10:{i:02d}:17Z\n{STABLE}"
        bodies.append({"model": "m", "messages": [{"role": "system", "content": system}]
                       + history})
        history = history + [{"role": "assistant", "content": f"Answer {i}: " + STABLE[:300]}]
    return bodies


def test_a_time_that_changes_every_request_moves_to_the_last_user_message(tmp_path):
    # Moved to the end of the first user message it would still change every turn and break
    # the history after it; at the end of the last user message the history stays a prefix.
    path = _write(tmp_path, _conversation_with_a_time_per_request(8))
    d = diagnose(DiagnoseSpec(trace=path, output_tokens="0"))
    top = d.breakers[0]
    assert top.kind == "timestamp" and top.position.line == 1
    assert [t["to"] for t in top.transforms] == ["last_user_end"]
    assert "last user message" in top.suggestion
    assert d.suggested_layout.as_dict()["transforms"][0]["to"] == "last_user_end"
    first = diagnose(DiagnoseSpec(trace=path, output_tokens="0"), measure=False)
    assert first.breakers[0].transforms[0]["to"] == "first_user_end"  # unmeasured: the default
    from prefixscope.replay.diagnose import replay_totals
    from prefixscope.replay.layouts import Layout
    as_first = replay_totals(DiagnoseSpec(trace=path, output_tokens="0"), layout=Layout.model_validate(
        {"name": "f", "transforms": [dict(top.transforms[0], to="first_user_end")]}))
    assert d.what_if.cached_tokens > as_first.cached_tokens
