"""prefixscope diagnose as a new user meets it: a support-bot log whose system prompt starts
with a "Current time" line (all in one day, so only the seconds and minutes change) and whose
tool list is reordered in some conversations; hostile first records that format detection
reads (deeply nested, longer than the line bound)."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest

from prefixscope.replay.diagnose import _stable_prefix

TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name.replace('_', ' ')} for the customer's order, "
                                 "with the details the support policy asks for.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}
    for name in ("lookup_order", "refund", "escalate")]
POLICY = "\n".join([
    "You are Ada, the support assistant of Northwind Outfitters.",
    "Be friendly, brief and exact. Never invent order details; use the tools.",
    "Refunds: up to 30 days after delivery, full amount; after that, store credit only.",
    "Shipping: standard 3-5 working days, express 1-2 working days, free above 50 EUR.",
    "Returns: items must be unused and in the original packaging; the label is free.",
    "Escalate to a human when the customer is angry twice or asks for a manager."] * 3)
QUESTIONS = ["Where is my order A-{n}?", "It says delivered but I have nothing. Refund?",
             "OK, please refund it to my card."]


def support_log(path, days: int = 1):
    """24 requests: 8 conversations of 3 turns; line 1 of the system prompt is the time;
    conversations 2 and 5 send the tools in another order."""
    start = datetime.datetime(2026, 11, 30, 9, 0, 0)
    lines, t = [], 0.0
    for c in range(8):
        tools = [TOOLS[2], TOOLS[0], TOOLS[1]] if c % 3 == 2 else TOOLS
        history: list[dict] = []
        for turn in range(3):
            now = start + datetime.timedelta(days=(c * days) // 8, seconds=c * 37 + turn * 11)
            system = f"Current time: {now:%Y-%m-%d %H:%M:%S} UTC\n" + POLICY
            msgs = [{"role": "system", "content": system}] + history + [
                {"role": "user", "content": QUESTIONS[turn].format(n=1000 + c)}]
            reply = f"Thanks, I checked order A-{1000 + c}. Ada, Northwind support."
            lines.append({"t": t, "request_id": f"sup-{c:02d}-{turn}",
                          "conversation": f"sup-{c:02d}", "messages": msgs, "tools": tools,
                          "response_text": reply})
            history = msgs[1:] + [{"role": "assistant", "content": reply}]
            t += 3.0
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def test_support_bot_timestamp_then_reordered_tools(cli, tmp_path):
    trace = support_log(tmp_path / "support.jsonl")
    code, out, _ = cli(["diagnose", trace, "--out", tmp_path / "d", "--json"])
    assert code == 0
    doc = json.loads(out)
    top, second = doc["breakers"][:2]
    assert (top["level"], top["kind"], top["segment"], top["message_index"], top["role"],
            top["line"]) == (1, "timestamp", "message", 0, "system", 1)
    assert top["requests"] == 23
    assert (second["level"], second["kind"], second["segment"]) == (2, "tools_reordered",
                                                                    "tools")
    # The suggested pattern names the stable label only: every request of this log is on
    # 2026-11-30, and a pattern with the date in it would stop matching the next day.
    move = doc["suggested_layout"]["transforms"][0]
    assert (move["type"], move["pattern"]) == ("move_lines", "^Current time: ")
    assert {"type": "sort_tools", "key": "name"} in doc["suggested_layout"]["transforms"]
    assert doc["hit_rate"] < 0.02 and doc["what_if"]["hit_rate"] > 0.85
    code, out, _ = cli(["replay", "sim", trace, "--layout", doc["suggested_layout"]["path"],
                        "--out", tmp_path / "s", "--json"])
    sim = json.loads(out)
    assert (sim["hit_rate"], sim["cached_tokens"]) == (doc["what_if"]["hit_rate"],
                                                       doc["what_if"]["cached_tokens"])


def test_suggested_pattern_still_matches_another_day(cli, tmp_path):
    """The layout suggested on one day's log gives the same hit rate on a log over 8 days."""
    one_day = support_log(tmp_path / "day.jsonl")
    week = support_log(tmp_path / "week.jsonl", days=8)
    code, out, _ = cli(["diagnose", one_day, "--out", tmp_path / "d", "--json"])
    layout = json.loads(out)["suggested_layout"]["path"]
    code, out, _ = cli(["diagnose", week, "--out", tmp_path / "w", "--json"])
    on_week = json.loads(out)["what_if"]
    code, out, _ = cli(["replay", "sim", week, "--layout", layout, "--out", tmp_path / "s",
                        "--json"])
    assert code == 0
    assert json.loads(out)["cached_tokens"] == on_week["cached_tokens"]


@pytest.mark.parametrize(("prefix", "stable"), [
    ("Current time: 2026-11-30 ", "Current time: "),
    ("- Current date: ", "- Current date: "),
    ("Date: Tue, 01 Dec 2026 ", "Date: "),
    ("Now: 2026-11-30T09:", "Now: "),
    ("Session 12 ", "Session "),
    ("Build 42 of ", "Build 42 of "),
    ("Market ", "Market "),
    ("v2 ", "v2 "),
])
def test_stable_prefix_drops_date_and_number_tails(prefix, stable):
    assert _stable_prefix(prefix) == stable


def test_deeply_nested_first_record_is_one_line_not_a_traceback(cli, tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_text('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}\n", encoding="utf-8")
    code, out, err = cli(["diagnose", path, "--out", tmp_path / "o"])
    assert code != 0 and "Traceback" not in err + out
    assert re.search(rf"{re.escape(str(path))}:1: cannot tell the trace format: the first "
                     r"record is JSON nested deeper than 64 levels: give --format", err)


def test_first_record_over_the_line_bound_is_named(cli, tmp_path):
    support = support_log(tmp_path / "support.jsonl").read_text(encoding="utf-8").splitlines()
    big = json.loads(support[0])
    big["messages"][1]["content"] = "x" * (20 << 20)  # over the 16 MiB trace line bound
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps(big) + "\n" + support[1] + "\n", encoding="utf-8")
    code, _, err = cli(["diagnose", path, "--out", tmp_path / "o"])
    assert code != 0
    assert f"{path}:1: cannot tell the trace format: the first record is longer than " \
           "16,777,216 bytes" in err
    code, out, err = cli(["diagnose", path, "--format", "chat", "--out", tmp_path / "o2"])
    assert code == 0
    assert f"{path}:1: line longer than 16,777,216 bytes (16 MiB)" in err
    assert re.match(r"1 requests?, ", out)


def test_a_cache_too_small_for_any_request_says_so(cli, tmp_path):
    trace = support_log(tmp_path / "support.jsonl")
    code, out, _ = cli(["diagnose", trace, "--capacity-blocks", "40", "--out", tmp_path / "o"])
    assert code == 0
    lines = out.splitlines()
    assert lines[1].startswith("every request rejected, not counted: vLLM refuses a request "
                               "that needs more blocks than the cache holds")
    assert "no two requests share a full block" not in out
    code, out, _ = cli(["diagnose", trace, "--capacity-blocks", "54", "--out", tmp_path / "p",
                        "--json"])
    doc = json.loads(out)
    assert 0 < doc["rejected_requests"] < doc["requests"]
    assert doc["notes"][0].startswith(f"{doc['rejected_requests']} of 24 requests rejected")


def test_counts_of_one_are_singular(cli, tmp_path):
    trace = support_log(tmp_path / "support.jsonl")
    code, out, _ = cli(["diagnose", trace, "--out", tmp_path / "o"])
    assert code == 0
    assert "tools: 1 request, 1 value, " in out
    assert "not breakers: 1 request went on with content" in out


def _tokenizer_with(tmp_path, template: bytes):
    import shutil
    from pathlib import Path

    d = tmp_path / "tok"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "tiny-tokenizer", d)
    (d / "chat_template.jinja").write_bytes(template)
    return d


def test_a_template_that_fails_on_some_requests_names_them(cli, tmp_path):
    """A Python error inside the template (here a division by zero for long user messages)
    is the template's error for that record: named file:line and skipped, no traceback."""
    trace = support_log(tmp_path / "support.jsonl")
    tok = _tokenizer_with(tmp_path, b"{% for m in messages %}{% if m.role == 'user' and "
                          b"'refund it' in m.content %}{{ 1 // 0 }}{% endif %}<|{{ m.role }}|>"
                          b"{{ m.content }}\n{% endfor %}")
    code, out, err = cli(["diagnose", trace, "--tokenizer", tok, "--out", tmp_path / "o",
                          "--json"])
    assert code == 0 and "Traceback" not in err
    doc = json.loads(out)
    assert doc["skipped_records"] == 8 and doc["requests"] == 16
    assert doc["problems"][0] == (f"{trace}:3: $.messages: cannot be rendered: "
                                  "ZeroDivisionError: integer division or modulo by zero")


@pytest.mark.parametrize(("template", "reason"), [
    (b"{% for m in messages %}{{ range(10**9) | list }}{% endfor %}",
     "failed: OverflowError: Range too big"),
    (b"{% for m in messages %}{{ m.content }}{% endfor %}\xff\xfe",
     "chat_template.jinja: not UTF-8 text (byte "),
])
def test_a_broken_template_is_one_line(cli, tmp_path, template, reason):
    trace = support_log(tmp_path / "support.jsonl")
    tok = _tokenizer_with(tmp_path, template)
    code, out, err = cli(["diagnose", trace, "--tokenizer", tok, "--out", tmp_path / "o"])
    assert code != 0 and "Traceback" not in err + out
    assert reason in err and len(err.strip().splitlines()) == 1


def test_token_trace_breaking_in_the_first_block_is_not_nothing_shared(cli, tmp_path):
    """Token 1 changes in every request and the 240 tokens after it are the same: no full
    block is shared as recorded, but the note must not say that nothing could be served."""
    import random

    rnd = random.Random(1)
    shared = [rnd.randrange(1000, 30000) for _ in range(200)]
    path = tmp_path / "tokens.jsonl"
    path.write_text("".join(json.dumps({
        "request_id": f"tok-{i}", "prompt_token_ids": [7, 100 + i] + shared
        + [rnd.randrange(1000, 30000) for _ in range(40)], "output_tokens": 10, "t": float(i)})
        + "\n" for i in range(30)), encoding="utf-8")
    code, out, _ = cli(["diagnose", path, "--format", "token-ids", "--out", tmp_path / "o",
                        "--json"])
    doc = json.loads(out)
    top = doc["breakers"][0]
    assert (top["segment"], top["block"], top["requests"]) == ("tokens", 0, 29)
    assert doc["notes"] == ["no two requests share a full block as recorded: the breakers "
                            "below keep apart content they do share"]


def test_an_id_before_a_document_on_one_line_becomes_a_placeholder(cli, tmp_path):
    """The system prompt is one long line: "Session <id> " and then a document. Moving that
    line would move the document too (nothing gained); the fix replaces the id only, which
    changes what the model reads: suggested only with --allow-rewrites (issue 26; this test
    used to expect the placeholder by default), labelled so."""
    import random

    rnd = random.Random(2)
    doc = " ".join(rnd.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(3000))
    path = tmp_path / "oneline.jsonl"
    path.write_text("".join(json.dumps({"request_id": f"s-{i}", "output_tokens": 5, "messages": [
        {"role": "system", "content": f"Session {i * 7919:x}abc{i} " + doc},
        {"role": "user", "content": "summarise"}]}) + "\n" for i in range(6)), encoding="utf-8")
    code, out, _ = cli(["diagnose", path, "--out", tmp_path / "n", "--json"])
    d = json.loads(out)
    top = d["breakers"][0]
    assert (top["kind"], top["message_index"], top["line"]) == ("id", 0, 1)
    assert (top["fixable"], top["transforms"], d["suggested_layout"], d["what_if"]) == \
        (False, [], None, None)
    assert "--allow-rewrites suggests it" in top["suggestion"]
    code, out, _ = cli(["diagnose", path, "--out", tmp_path / "o", "--json", "--allow-rewrites"])
    d = json.loads(out)
    top = d["breakers"][0]
    assert top["suggestion"].startswith("rewrites the prompt (--allow-rewrites): replace the id "
                                        "on line 1 of the system message")
    assert top["rewrites_prompt"] and d["what_if"]["rewrites_prompt"]
    (t,) = d["suggested_layout"]["transforms"]
    assert (t["type"], t["with"]) == ("replace", r"\g<1><id>")
    assert t["pattern"].startswith("^(Session )(?:")
    # Five of six requests now share the whole document; the prompt keeps its length.
    assert d["what_if"]["hit_rate"] > 0.8
    assert abs(d["what_if"]["prompt_tokens"] - d["prompt_tokens"]) <= 6 * 4
    code, out, _ = cli(["replay", "sim", path, "--layout", d["suggested_layout"]["path"],
                        "--out", tmp_path / "s", "--json"])
    assert json.loads(out)["cached_tokens"] == d["what_if"]["cached_tokens"]


def test_diagnose_prunes_its_index_instead_of_stopping(cli, monkeypatch):
    """The bundled Mooncake trace grew diagnose's block index until the machine ran out
    (5.3 GB after 72 s), then the index bound stopped it (exit 7); now the least recently used
    blocks are pruned: the diagnosis completes with the index within its capacity, and with a
    capacity that holds every block the pass gives what it gives without pruning."""
    import prefixscope.replay.diagnose as d

    trace = Path(__file__).resolve().parents[1] / "data/traces/mooncake/conversation_trace.jsonl.gz"
    spec = d.DiagnoseSpec(trace=str(trace), limit=200)
    whole = d.attribution_pass(spec, keep_records=True)
    assert whole.pruned_blocks == 0 and whole.unique_blocks > 6_000
    monkeypatch.setattr(d, "MIN_INDEX_BLOCKS", 2_000)
    assert d.index_capacity(None) == 2_000 and d.index_capacity(5_000) == 10_000
    pruned = d.attribution_pass(spec, keep_records=True)
    assert pruned.pruned_blocks > 0
    # what the index holds at the end: its capacity, plus the blocks of the request that passed
    # it (a prune never drops the blocks of the request being attributed)
    largest = max(r.prompt_tokens for r in pruned.records) // 16
    assert pruned.unique_blocks - pruned.pruned_blocks <= 2_000 + largest
    assert pruned.summary == whole.summary  # the exact model is not the index
    assert len(pruned.records) == len(whole.records) == 200
    # a prefix pruned from the index is diagnosed as not seen before: never more matched
    assert all(p.matchable_tokens <= w.matchable_tokens
               for p, w in zip(pruned.records, whole.records))
    code, out, err = cli(["diagnose", trace, "--limit", "200", "--json"])
    assert code == 0, err
    assert "Traceback" not in err
    monkeypatch.setattr(d, "MIN_INDEX_BLOCKS", whole.unique_blocks)  # holds all: no prune
    same = d.attribution_pass(spec, keep_records=True)
    assert same.pruned_blocks == 0 and same.records == whole.records
