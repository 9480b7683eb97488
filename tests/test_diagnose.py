"""prefixscope diagnose on real data: the bundled aider capture, agreement with the exact
model (what-if == replay sim --layout), the piece tokenizer, the CLI contract, bad input, and
the breaker summary stored through ingest (real DuckDB file, no prompt text)."""

from __future__ import annotations

import json

import duckdb
import pytest

from prefixscope.replay.chat_requests import chat_body
from prefixscope.replay.diagnose import DiagnoseSpec, attribution_pass, open_trace, replay_totals
from prefixscope.replay.diagnose_fix import diagnose
from prefixscope.replay.diagnose_render import PieceEncoder
from prefixscope.replay.layouts import load_layout
from prefixscope.replay.tokenization import load_chat_tokenizer
from prefixscope.replay.traces import read_trace
from tests.replay_io_support import AIDER_TRACE, LAYOUT_DATE_FIRST_USER

JSON_FIELDS = {"requests", "prompt_tokens", "cached_tokens", "hit_rate", "breakers",
               "suggested_layout", "what_if"}
BREAKER_FIELDS = {"rank", "level", "kind", "segment", "message_index", "role", "line",
                  "requests", "lost_tokens", "share", "suggestion"}


@pytest.fixture(scope="module")
def aider():
    return diagnose(DiagnoseSpec(trace=str(AIDER_TRACE)))


def test_aider_current_date_line_is_the_top_breaker(aider):
    top = aider.breakers[0]
    assert (top.kind, top.position.segment, top.position.role, top.position.message_index,
            top.position.line) == ("timestamp", "message", "system", 0, 5)
    assert top.level == 1 and top.measured
    assert top.requests == 17 and top.distinct_values == 17  # one date per day after the first
    assert round(aider.summary.hit_rate, 3) == 0.869
    # The suggested layout is the known one: the date at the end of the first user message.
    assert aider.suggested_layout.as_dict()["transforms"] == [
        {"type": "move_lines", "pattern": "^- Current date: ", "to": "first_user_end",
         "from": "first_system", "separator": "\n\n"}]
    assert round(aider.what_if.hit_rate, 3) == 0.936
    # A fixed placeholder instead of the date would do better still (and is reported).
    assert aider.neutralised is None or aider.neutralised.hit_rate >= aider.what_if.hit_rate
    assert top.what_if["hit_rate"] > aider.what_if.hit_rate


def test_aider_suggestion_equals_the_known_layout_file(aider):
    known = replay_totals(DiagnoseSpec(trace=str(AIDER_TRACE)),
                          layout=load_layout(LAYOUT_DATE_FIRST_USER))
    assert known.cached_tokens == aider.what_if.cached_tokens


def test_lost_tokens_are_the_counterfactual_gain(aider):
    top = aider.breakers[0]
    assert top.lost_tokens == top.what_if["cached_tokens"] - aider.summary.cached_tokens
    missed = aider.summary.prompt_tokens - aider.summary.cached_tokens
    assert top.share == pytest.approx(top.lost_tokens / missed)


def test_what_if_equals_replay_sim_with_the_written_layout(cli, tmp_path):
    code, out, _ = cli(["diagnose", AIDER_TRACE, "--out", tmp_path / "d", "--json"])
    assert code == 0
    doc = json.loads(out)
    assert JSON_FIELDS <= set(doc)
    assert all(BREAKER_FIELDS <= set(b) for b in doc["breakers"])
    assert [b["lost_tokens"] for b in doc["breakers"] if b["level"] == 1] == sorted(
        [b["lost_tokens"] for b in doc["breakers"] if b["level"] == 1], reverse=True)
    path = doc["suggested_layout"]["path"]
    code, out, _ = cli(["replay", "sim", AIDER_TRACE, "--layout", path, "--out", tmp_path / "s",
                        "--json"])
    sim = json.loads(out)
    assert sim["hit_rate"] == doc["what_if"]["hit_rate"]
    assert sim["cached_tokens"] == doc["what_if"]["cached_tokens"]
    code, out, _ = cli(["replay", "sim", AIDER_TRACE, "--out", tmp_path / "r", "--json"])
    base = json.loads(out)
    assert (base["prompt_tokens"], base["cached_tokens"]) == (doc["prompt_tokens"],
                                                              doc["cached_tokens"])


def test_diagnose_reads_the_same_requests_as_replay_sim():
    spec = DiagnoseSpec(trace=str(AIDER_TRACE))
    mine = [(tr.request_id, tr.arrival_s, tuple(tr.prompt_token_ids),
             tuple(tr.output_token_ids or ()), tr.cache_salt) for tr, _ in open_trace(spec).items]
    theirs = [(tr.request_id, tr.arrival_s, tuple(tr.prompt_token_ids),
               tuple(tr.output_token_ids or ()), tr.cache_salt)
              for tr in read_trace(str(AIDER_TRACE), format="chat").requests]
    assert mine == theirs and len(mine) == 124


def test_piece_encoder_equals_the_tokenizer():
    tok = load_chat_tokenizer()
    enc = PieceEncoder(tok, cache_size=64)
    for line in open(AIDER_TRACE, encoding="utf-8"):
        body = chat_body(json.loads(line))
        text = tok.render(body["messages"], tools=body.get("tools"))
        ids, offsets = enc.encode_with_offsets(text)
        assert ids == tok.encode(text)
        assert offsets == sorted(offsets) and len(offsets) == len(ids)


def test_explain_one_request_with_and_without_text(cli):
    code, out, _ = cli(["diagnose", AIDER_TRACE, "--request", "aider-0003-01"])
    assert code == 0
    assert "timestamp at token 99: message 0 (system), line 5, column 26" in out
    assert "matched against earlier request aider-0002-02" in out
    assert "Current date: 2024-08-0[6]" in out and "Current date: 2024-08-0[5]" in out
    code, out, _ = cli(["diagnose", AIDER_TRACE, "--request", "aider-0003-01", "--no-text"])
    assert "line 5" in out and "Current date" not in out and "2024" not in out
    code, out, _ = cli(["diagnose", AIDER_TRACE, "--request", "aider-0003-01", "--json"])
    doc = json.loads(out)
    assert (doc["kind"], doc["role"], doc["line"], doc["earlier_request"]) == \
        ("timestamp", "system", 5, "aider-0002-02")


def test_no_text_output_has_no_prompt_text(cli, tmp_path):
    code, out, _ = cli(["diagnose", AIDER_TRACE, "--no-text", "--out", tmp_path])
    assert code == 0 and "#1 level 1 timestamp" in out
    assert "Current date" not in out


def test_unrenderable_requests_are_named_and_counted(cli, tmp_path):
    good = {"messages": [{"role": "system", "content": "S " * 40}, {"role": "user", "content": "q"}]}
    lines = [good, {"messages": [{"role": "wizard", "content": "x"}]},
             {"messages": [{"role": "user", "content": "x"}], "tools": ["not a tool"]}, good]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n{broken\n", encoding="utf-8")
    p = attribution_pass(DiagnoseSpec(trace=str(path), format="chat"))
    assert [(q.line, q.field) for q in p.problems] == [
        (2, "$.messages[0].role"), (3, "$.tools[0]"), (5, None)]
    assert p.summary.requests == 2
    code, out, err = cli(["diagnose", path, "--format", "chat", "--out", tmp_path / "o"])
    assert code == 0
    assert f"skipped {path}:2: $.messages[0].role: unknown role" in err
    # replay sim skips the same records (one reading rule).
    code, out, _ = cli(["replay", "sim", path, "--format", "chat", "--out", tmp_path / "s",
                        "--json"])
    assert json.loads(out)["skipped_records"] == 3


def test_diagnose_reads_chat_traces_with_replay_sims_reader(tmp_path):
    """One chat reader (replay/traces.py): a request id or model past 256 characters is a named
    record in diagnose as in replay sim, and both read the same requests and token ids."""
    good = {"messages": [{"role": "system", "content": "S " * 40}, {"role": "user", "content": "q"}]}
    lines = [dict(good, request_id="a"), dict(good, request_id="r" * 257),
             dict(good, model="m" * 257), dict(good, request_id="b", response_text="fine")]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    src = open_trace(DiagnoseSpec(trace=str(path), format="chat"))
    items = list(src.items)
    sim = read_trace(str(path), format="chat")
    sim_requests = list(sim.requests)  # read lazily, as the diagnosis' items
    assert [str(q) for q in src.problems] == [str(q) for q in sim.problems] == [
        f"{path}:2: $.request_id: longer than 256 characters",
        f"{path}:3: $.model: longer than 256 characters"]
    assert [(tr.request_id, tr.prompt_token_ids, tr.output_token_ids) for tr, _ in items] == [
        (tr.request_id, tr.prompt_token_ids, tr.output_token_ids) for tr in sim_requests]
    assert [tr.request_id for tr, _ in items] == ["a", "b"]
    assert all(rendered.ids == tr.prompt_token_ids for tr, rendered in items)


def test_a_template_error_is_a_named_record(tmp_path):
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    src = load_chat_tokenizer().directory
    for f in src.iterdir():
        if f.is_file():
            (tok_dir / f.name).write_bytes(f.read_bytes())
    (tok_dir / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('tool messages are not supported') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}", encoding="utf-8")
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "tool", "content": "x"}]}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "y" * 80}]}) + "\n",
                    encoding="utf-8")
    p = attribution_pass(DiagnoseSpec(trace=str(path), tokenizer_dir=str(tok_dir)))
    assert [str(q).split(": ", 1)[1] for q in p.problems] == [
        "$.messages: cannot be rendered: tool messages are not supported"]
    assert p.summary.requests == 1


def test_ingest_stores_structure_only(cli, tmp_path, db_path):
    code, out, _ = cli(["diagnose", AIDER_TRACE, "--out", tmp_path / "d", "--ingest", "--db",
                        db_path, "--model", "tiny-llama-random", "--json"])
    assert code == 0
    doc = json.loads(out)
    run_id = doc["ingested"]["run_id"]
    con = duckdb.connect(db_path, read_only=True)
    try:
        d = con.execute("SELECT run_id, model, requests, hit_rate, what_if_hit_rate "
                        "FROM diagnoses").fetchall()
        assert d == [(run_id, "tiny-llama-random", 124, doc["hit_rate"],
                      doc["what_if"]["hit_rate"])]
        b = con.execute("SELECT rank, level, kind, segment, role, message_index, line, requests, "
                        "lost_tokens, fixable FROM breakers").fetchall()
        assert b[0] == (1, 1, "timestamp", "message", "system", 0, 5, 17,
                        doc["breakers"][0]["lost_tokens"], True)
        # the run itself is a normal replay run
        assert con.execute("SELECT count(*) FROM requests WHERE run_id = ?",
                           [run_id]).fetchone()[0] == 124
        # no prompt text anywhere in the two tables
        dump = json.dumps(con.execute("SELECT * FROM breakers").fetchall(), default=str) + \
            json.dumps(con.execute("SELECT * FROM diagnoses").fetchall(), default=str)
        assert "Current date" not in dump and "2024-08" not in dump
    finally:
        con.close()
    # ingesting the same file again adds nothing
    from prefixscope.ingest.breakers import ingest_breakers_file
    from prefixscope.store import db as store_db

    with store_db.writer(db_path) as con:
        assert ingest_breakers_file(con, doc["ingested"]["breakers_file"]) == 0


def _token_trace(tmp_path, *, salt_after: int | None = None) -> str:
    rs = list(read_trace(str(AIDER_TRACE), format="chat", output_tokens="0").requests)
    path = tmp_path / "tokens.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, r in enumerate(rs):
            rec = {"request_id": r.request_id, "t": r.arrival_s,
                   "prompt_token_ids": list(r.prompt_token_ids)}
            if salt_after is not None:
                rec["cache_salt"] = "a" if i < salt_after else "b"
            fh.write(json.dumps(rec) + "\n")
    return str(path)


def test_token_id_trace_is_attributed_to_token_blocks(tmp_path):
    d = diagnose(DiagnoseSpec(trace=_token_trace(tmp_path), format="token-ids"))
    top = d.breakers[0]
    # The same 17 requests as the chat capture's date line, at the block holding token 99.
    assert (top.kind, top.position.segment, top.position.block, top.requests) == (
        "edited_text", "tokens", 6, 17)
    assert not top.measured and not top.fixable
    sim = replay_totals(DiagnoseSpec(trace=_token_trace(tmp_path), format="token-ids"))
    assert d.summary.cached_tokens == sim.cached_tokens


def test_token_id_trace_with_another_salt(tmp_path):
    p = attribution_pass(DiagnoseSpec(trace=_token_trace(tmp_path, salt_after=60),
                                      format="token-ids"))
    assert p.groups[("different_salt",)]["requests"] >= 1


def test_hash_id_trace_block_level(cli, tmp_path):
    from tests.replay_io_support import KV_CACHE_TESTER

    code, out, _ = cli(["diagnose", KV_CACHE_TESTER, "--format", "kv-cache-tester",
                        "--block-size", "64", "--algo", "fast", "--output-tokens", "0",
                        "--limit", "300", "--out", tmp_path, "--json"])
    assert code == 0
    doc = json.loads(out)
    code, sim_out, _ = cli(["replay", "sim", KV_CACHE_TESTER, "--format", "kv-cache-tester",
                            "--block-size", "64", "--algo", "fast", "--output-tokens", "0",
                            "--limit", "300", "--out", tmp_path / "s", "--json"])
    sim = json.loads(sim_out)
    assert (doc["prompt_tokens"], doc["cached_tokens"]) == (sim["prompt_tokens"],
                                                            sim["cached_tokens"])
    assert doc["breakers"] and {b["segment"] for b in doc["breakers"]} <= {"blocks", None}
    assert {b["kind"] for b in doc["breakers"]} <= {"divergent_block", "evicted"}


def test_cost_of_the_fix_at_the_model_price(cli, tmp_path):
    from prefixscope.cli.commands.replay_sim import _price
    from prefixscope.replay.compare import run_cost

    code, out, _ = cli(["diagnose", AIDER_TRACE, "--model", "tiny-llama-random", "--prices",
                        "data/prices.toml", "--out", tmp_path, "--json"])
    doc = json.loads(out)
    assert doc["cost"]["currency"] == "USD" and doc["cost"]["shadow"] is True
    d = diagnose(DiagnoseSpec(trace=str(AIDER_TRACE)))
    price = _price("tiny-llama-random", "data/prices.toml")
    expected = float(run_cost(d.what_if, price)["cost_with_cache"]
                     - run_cost(d.summary, price)["cost_with_cache"])
    assert doc["what_if"]["cost_delta"] == pytest.approx(expected) and expected < 0
    assert doc["breakers"][0]["what_if"]["cost_delta"] < 0


def test_anthropic_messages_bodies(tmp_path):
    stable = "\n".join(f"Policy {i}: be exact, cite the source, keep answers short." for i in
                       range(30))
    path = tmp_path / "anthropic.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(5):
            fh.write(json.dumps({"output_tokens": 0, "uri": "/v1/messages", "request_body": {
                "model": "claude", "max_tokens": 10,
                "system": [{"type": "text", "text": f"Today is 2026-11-{i + 1:02d}.\n{stable}"}],
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": f"Question {i}: what does policy {i} mean?"}]}]}})
                     + "\n")
    d = diagnose(DiagnoseSpec(trace=str(path), format="chat"))
    top = d.breakers[0]
    assert (top.kind, top.position.role, top.position.message_index, top.position.line) == (
        "timestamp", "system", 0, 1)
    assert d.what_if.hit_rate > d.summary.hit_rate


def test_a_log_without_any_shared_prefix_says_so_in_one_line(cli, tmp_path):
    path = tmp_path / "unshared.jsonl"
    path.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"{i} " + "word " * (i + 3)}]}) + "\n" for i in range(3)),
        encoding="utf-8")
    code, out, _ = cli(["diagnose", path, "--out", tmp_path / "o"])
    assert code == 0
    lines = out.splitlines()
    assert lines[1] == ("no two requests share a full block: nothing in this trace can be "
                        "served from cache at this block size")
    assert "breakers, by lost tokens" not in out


def test_broken_tool_definitions_are_named_records_in_both_shapes(cli, tmp_path):
    """A tool schema that is not an object, or a tool_use input that is not an object, is a
    request vLLM 0.32 answers 400 (Anthropic and OpenAI shapes alike): named file:line:field
    and skipped by diagnose and replay sim, never accepted silently."""
    sysmsg = "You are a support bot. " * 20
    good = {"system": sysmsg, "messages": [{"role": "user", "content": "hello"}],
            "tools": [{"name": "lookup", "input_schema": {"type": "object"}}]}
    bad_schema = dict(good, tools=[{"name": "lookup", "input_schema": "bad"}])
    bad_input = dict(good, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup",
                                           "input": "not an object"}]},
        {"role": "user", "content": "again"}])
    openai_bad = {"messages": [{"role": "user", "content": "x"}],
                  "tools": [{"type": "function", "function": {"name": "f", "parameters": "bad"}}]}
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [good, bad_schema, bad_input, openai_bad, good])
                    + "\n", encoding="utf-8")
    p = attribution_pass(DiagnoseSpec(trace=str(path), format="chat"))
    assert [(q.line, q.field) for q in p.problems] == [
        (2, "$.tools[0].input_schema"), (3, "$.messages[1].content[0].input"),
        (4, "$.tools[0].function.parameters")]
    assert p.summary.requests == 2
    code, out, err = cli(["diagnose", path, "--format", "chat", "--out", tmp_path / "o"])
    assert code == 0 and "Traceback" not in err
    assert f"skipped {path}:2: $.tools[0].input_schema: not a JSON schema object" in err
    code, out, _ = cli(["replay", "sim", path, "--format", "chat", "--out", tmp_path / "s",
                        "--json"])
    assert json.loads(out)["skipped_records"] == 3
