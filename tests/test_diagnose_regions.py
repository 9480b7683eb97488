"""Issue 26, items 2 and 3 and its "Done when", on two logs the project had never seen
(``tests/diagnose_logs.py``: a RAG support assistant and a coding agent), each with its ground
truth measured by construction: the same log written with one breaker removed, replayed
through the exact model (bundled tiny tokenizer, block size 16, unbounded cache)."""

from __future__ import annotations

import json

import pytest

from prefixscope.replay.diagnose import DiagnoseSpec, replay_totals
from prefixscope.replay.diagnose_fix import diagnose, prefill_saved
from prefixscope.replay.layouts import Layout, same_content
from tests.diagnose_logs import AGENT_BREAKERS, RAG_BREAKERS, agent_log, rag_log

#: What each constructed breaker is called by diagnose.
KIND_OF = {"docs": "changing_region", "account": "fields", "reply": "reply_resent",
           "timestamp": "timestamp", "tool_date": "tool_description",
           "truncate": "history_rewritten"}
#: The breakers a layout can fix (move a line); the others need a client change.
LAYOUT_FIXABLE = {"rag": ("account",), "agent": ("timestamp",)}
LOGS = {"rag": (rag_log, RAG_BREAKERS), "agent": (agent_log, AGENT_BREAKERS)}


def _spec(path) -> DiagnoseSpec:
    return DiagnoseSpec(trace=str(path))


@pytest.fixture(scope="module", params=["rag", "agent"])
def case(request, tmp_path_factory):
    """(name, path, diagnosis, ground truth {breaker: cached tokens recovered by removing it
    alone}, recorded summary, the summary with every layout-fixable breaker removed)."""
    name = request.param
    write, names = LOGS[name]
    d = tmp_path_factory.mktemp(name)
    path = write(d / "log.jsonl")
    recorded = replay_totals(_spec(path))
    truth = {b: replay_totals(_spec(write(d / f"without-{b}.jsonl", without=[b]))).cached_tokens
             - recorded.cached_tokens for b in names}
    fixed = replay_totals(_spec(write(d / "fixable-removed.jsonl", without=LAYOUT_FIXABLE[name])))
    return name, path, diagnose(_spec(path)), truth, recorded, fixed


def test_the_ground_truth_of_the_two_logs(case):
    """The numbers the checks below rest on (one run; the logs are deterministic)."""
    name, _, d, truth, recorded, fixed = case
    if name == "rag":
        # The documents block costs most; the account line next; the re-sent replies cost
        # nothing alone (the documents before them break every history anyway).
        assert (recorded.prompt_tokens, recorded.cached_tokens) == (47_667, 17_488)
        assert truth == {"docs": 17_984, "account": 5_232, "reply": 0}
    else:
        assert (recorded.prompt_tokens, recorded.cached_tokens) == (77_676, 1_312)
        assert truth == {"timestamp": 72_096, "tool_date": 0, "truncate": 0}
    assert d.summary == recorded


def test_the_top_breaker_is_the_one_whose_removal_recovers_the_most(case):
    _, _, d, truth, _, _ = case
    assert d.breakers[0].kind == KIND_OF[max(truth, key=truth.get)]
    # Its lost tokens are the counterfactual (this region stable, everything else as
    # recorded), within 10% of the ground truth.
    assert d.breakers[0].measured
    assert d.breakers[0].lost_tokens == pytest.approx(truth[max(truth, key=truth.get)], rel=0.1)


def test_every_breaker_costing_5_percent_of_the_missed_tokens_is_reported(case):
    _, _, d, truth, recorded, _ = case
    missed = recorded.prompt_tokens - recorded.cached_tokens
    reported = {b.kind: b for b in d.breakers}
    for name, gain in truth.items():
        if gain >= 0.05 * missed:
            b = reported[KIND_OF[name]]
            assert b.lost_tokens == pytest.approx(gain, rel=0.1)
    # and the ones hidden behind them are found at level 2
    assert {KIND_OF[n] for n in truth} <= set(reported)


def test_the_suggested_layout_reaches_90_percent_of_the_layout_fixable_hit_rate(case):
    name, path, d, _, recorded, fixed = case
    assert {b.kind for b in d.breakers if b.fixable} == {KIND_OF[n] for n in LAYOUT_FIXABLE[name]}
    assert d.what_if.hit_rate >= 0.9 * fixed.hit_rate
    # The headline is the net prefill saved, never below the recorded trace.
    assert d.prefill_saved == prefill_saved(recorded, d.what_if) > 0
    assert d.what_if.hit_rate > recorded.hit_rate


def test_no_suggestion_changes_what_any_request_says(case):
    """Every request keeps its content under the suggested layout and under each breaker's
    own transforms: the same lines, tools and tool calls, only moved."""
    _, path, d, _, _, _ = case
    layouts = [d.suggested_layout] + [
        Layout.model_validate({"name": "one", "transforms": b.transforms})
        for b in d.breakers if b.transforms]
    bodies = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    moved = 0
    for layout in layouts:
        for body in bodies:
            after = layout.apply(body)
            assert same_content(body, after)
            moved += after != body
    assert moved >= len(bodies)  # the layouts do move something in every request


def test_each_breaker_has_its_kind_place_and_fix(case):
    name, _, d, _, _, _ = case
    if name == "agent":
        by = {b.kind: b for b in d.breakers}
        ts, tool, hist = by["timestamp"], by["tool_description"], by["history_rewritten"]
        assert (ts.level, ts.position.line, ts.requests, ts.fixable) == (1, 2, 41, True)
        assert ts.transforms[0]["type"] == "move_lines"
        assert (tool.level, tool.position.tool_name, tool.position.schema_key, tool.fixable) == \
            (2, "search_docs", "description", False)
        assert tool.client_fix["measured"] and tool.client_fix["prefill_saved_tokens"] > 0
        assert (hist.level, hist.fixable, hist.measured) == (2, False, False)
        assert hist.client_fix["change"].startswith("stop rewriting older turns")
        return
    region, account, reply = d.breakers
    # One region, not dozens of one-line entries: the documents between "Retrieved
    # documents:" and "End of documents." (lines 25-29), in the 18 requests that are not the
    # first of a conversation (those 5 break earlier, at the account line; 1 is the first).
    assert (region.kind, region.level, region.position.line, region.requests) == \
        ("changing_region", 1, 25, 18)
    assert account.requests == 5
    assert region.detail == "lines 25 to 29 change" and not region.fixable
    assert region.client_fix["change"].startswith("put the changing block")
    assert region.client_fix["measured"] and region.client_fix["prefill_saved_tokens"] > 0
    # A line with two changing fields: one breaker listing both, fixed by a move.
    assert (account.kind, account.position.line, account.fields) == ("fields", 2, ("number", "value"))
    assert account.fixable and account.transforms[0]["pattern"] == "^Account: "
    assert account.as_dict()["what"] == "several values on one line that change"
    # The re-sent replies (whitespace collapsed in 3 of 6 conversations), behind the region.
    assert (reply.kind, reply.level, reply.position.role) == ("reply_resent", 2, "assistant")
    assert reply.detail == "the client re-sent the model's reply with its whitespace collapsed"
    assert not reply.fixable and reply.client_fix["change"].startswith(
        "send earlier replies back verbatim")
    assert reply.client_fix["prefill_saved_tokens"] == pytest.approx(reply.lost_tokens, rel=0.1)


def test_the_cli_prints_the_net_prefill_headline(cli, tmp_path):
    path = rag_log(tmp_path / "rag.jsonl")
    code, out, _ = cli(["diagnose", path, "--out", tmp_path / "o", "--json"])
    assert code == 0
    doc = json.loads(out)
    w = doc["what_if"]
    assert w["prefill_saved_tokens"] == (doc["prompt_tokens"] - doc["cached_tokens"]) - (
        w["prompt_tokens"] - w["cached_tokens"])
    assert not w["rewrites_prompt"] and not doc["allow_rewrites"]
    assert [b["kind"] for b in doc["breakers"]] == ["changing_region", "fields", "reply_resent"]
    code, out, _ = cli(["diagnose", path, "--out", tmp_path / "p"])
    assert f"suggested layout (moves content only): saves {w['prefill_saved_tokens']:,} " \
           "prefill tokens" in out


@pytest.mark.parametrize(("sent", "how"), [
    ("Use  **pip**\n\ninstall x", "with its whitespace collapsed"),
    ("Use **pip**", "truncated"),
    ("Use pip\n\ninstall x", "with its markdown re-rendered"),
    ("Use conda instead", "edited"),
])
def test_how_a_re_sent_reply_differs(sent, how):
    from prefixscope.replay.diagnose import reply_change

    assert reply_change(sent, "Use **pip**\n\ninstall x") == how
    assert reply_change("Use pip.", "<think>plan</think>\nUse pip.") == "with its reasoning stripped"


def test_same_content_allows_moves_and_sorts_only():
    body = {"messages": [{"role": "system", "content": "Rules\nTime: 10:00\nBe brief"},
                         {"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "b"}},
                      {"type": "function", "function": {"name": "a"}}]}
    move = Layout.model_validate({"name": "m", "transforms": [
        {"type": "move_lines", "pattern": "^Time: ", "to": "last_user_end", "separator": "\n\n"},
        {"type": "sort_tools"}]})
    moved = move.apply(body)
    assert moved["messages"][1]["content"] == "hi\n\nTime: 10:00" and same_content(body, moved)
    placeholder = Layout.model_validate({"name": "p", "transforms": [
        {"type": "replace", "pattern": r"\d\d:\d\d", "with": "<time>"}]})
    assert not same_content(body, placeholder.apply(body))


def test_a_move_that_saves_nothing_is_not_suggested(tmp_path):
    """A per-conversation line at the end of a short system prompt: moving it saves no block
    and adds separator tokens to every request (the what-if came out below the recorded hit
    rate). The breaker is reported, its move is not suggested."""
    from tests.diagnose_logs import _write

    records = []
    for c in range(4):
        history: list[dict] = []
        for turn in range(4):
            system = f"You are Helix.\nAccount: {71810 + c} (seat u{c}.k)"
            q = f"Question {turn} of conversation {c}: how do I rotate my API tokens safely?"
            reply = f"Answer {turn}: open the control panel, choose API tokens, rotate. " * 3
            records.append({"request_id": f"c{c}-{turn}", "messages": [
                {"role": "system", "content": system}, *history, {"role": "user", "content": q}],
                "response_text": reply})
            history += [{"role": "user", "content": q}, {"role": "assistant", "content": reply}]
    path = _write(tmp_path / "short.jsonl", records)
    d = diagnose(_spec(path))
    assert d.suggested_layout is None and d.what_if is None
    move = {"type": "move_lines", "pattern": "^Account: ", "to": "first_user_end",
            "from": "first_system", "separator": "\n\n"}
    moved = replay_totals(_spec(path), layout=Layout.model_validate(
        {"name": "m", "transforms": [move]}))
    assert prefill_saved(d.summary, moved) < 0  # the move computes more prompt tokens
    # Offered that move (both targets), the suggestion step replays it and drops it.
    from prefixscope.replay.diagnose_fix import Breaker, _suggest

    b = Breaker(level=1, kind="fields", position=None, requests=15, distinct_values=4,
                lost_tokens=1, measured=True, suggestion="move line 2", fixable=True,
                transforms=[move], neutraliser=None, example_request=None,
                earlier_request=None, detail=None)
    assert _suggest(_spec(path), [b], d.summary, measure=True) == (None, None, 2)
    assert (b.fixable, b.transforms) == (False, [])
    assert b.suggestion.startswith("not suggested: the fix replayed computes no fewer prompt "
                                   "tokens")
