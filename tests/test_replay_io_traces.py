"""Trace readers on the bundled real traces, and their handling of bad input."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from prefixscope.core.errors import ParseError, SourceUnavailable, UsageError
from prefixscope.replay.trace_hashids import ExpandedTokens, IdChain, block_keys_for
from prefixscope.replay.traces import detect_format, read_trace
from tests.replay_io_support import (
    AIDER_TRACE,
    KV_CACHE_TESTER,
    MOONCAKE_CONVERSATION,
    MOONCAKE_SYNTHETIC,
    selection_rows,
    write_lines,
)

# ------------------------------------------------------------------------------------------
# Mooncake
# ------------------------------------------------------------------------------------------


def test_mooncake_conversation_trace_reads_every_request_with_its_published_shape():
    res = read_trace(MOONCAKE_CONVERSATION, format="mooncake", block_size=512)
    reqs = list(res.requests)
    assert len(reqs) == 12031 and res.problems == []
    assert res.stats["chain_violations"] == 0  # the published ids are chained
    mean_in = sum(r.num_prompt_tokens for r in reqs) / len(reqs)
    mean_out = sum(r.output_tokens for r in reqs) / len(reqs)
    assert round(mean_in, 2) == 12035.06 and round(mean_out, 2) == 342.62
    assert reqs[0].arrival_s == 0.0 and reqs[-1].arrival_s == pytest.approx(3536.999)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    assert reqs[0].request_id == "conversation_trace:1"
    assert reqs[0].source.endswith("conversation_trace.jsonl.gz:1")


def test_mooncake_synthetic_trace_counts():
    reqs = list(read_trace(MOONCAKE_SYNTHETIC, format="auto", block_size=512).requests)
    assert len(reqs) == 3993
    assert round(sum(r.num_prompt_tokens for r in reqs) / len(reqs), 2) == 15325.48


def test_each_hash_id_expands_to_tokens_determined_by_the_id_alone(tmp_path):
    # Two requests share ids 0 and 1, then differ: their tokens agree exactly up to the end of
    # id 1's block and differ at the first token of the next id.
    path = write_lines(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [0, 1, 2]},
        {"timestamp": 1000, "input_length": 45, "output_length": 3, "hash_ids": [0, 1, 3]},
    ])
    a, b = read_trace(path, format="mooncake", hash_id_block_size=16, block_size=16).requests
    assert len(a.prompt_token_ids) == 40 and len(b.prompt_token_ids) == 45
    assert list(a.prompt_token_ids[:32]) == list(b.prompt_token_ids[:32])
    assert a.prompt_token_ids[32] != b.prompt_token_ids[32]
    assert b.arrival_s == 1.0  # milliseconds
    # fast keys: one per full engine block, equal exactly where the prefix is equal
    assert len(a.block_keys) == 40 // 16 and len(b.block_keys) == 45 // 16
    assert a.block_keys[:2] == b.block_keys[:2]


@pytest.mark.parametrize("engine_block", [4, 16, 24, 32, 48, 512])
def test_fast_keys_are_the_token_at_the_end_of_each_block(engine_block):
    # The token itself, or (engine block dividing the id block) the token divided by the
    # engine block size: id tokens are then engine_block - 1 modulo engine_block, so the
    # quotient is one-to-one; tail tokens (negative, request-unique) are kept.
    canon = [7, 9, 11]
    for n in (1, 47, 48, 50, 64, 100):
        toks = ExpandedTokens(canon, 16, n, serial=5)
        ends = [toks[e - 1] for e in range(engine_block, n + 1, engine_block)]
        if 16 % engine_block == 0:
            assert all(t % engine_block == engine_block - 1 for t in ends if t >= 0)
            want = [t // engine_block if t >= 0 else t for t in ends]
        else:
            want = ends
        assert block_keys_for(canon, 16, n, engine_block, serial=5) == want


def test_tokens_past_the_last_id_are_unique_to_the_request():
    a = ExpandedTokens([1, 2], 64, 150, serial=1)
    b = ExpandedTokens([1, 2], 64, 150, serial=2)
    assert list(a[:128]) == list(b[:128])
    assert set(a[128:]).isdisjoint(b[128:])


def test_vocab_mapping_keeps_ids_in_range_and_prefixes_equal():
    a = ExpandedTokens([3, 4], 16, 32, vocab_size=4096)
    b = ExpandedTokens([3, 5], 16, 32, vocab_size=4096)
    assert all(5 <= t < 4096 for t in a)
    assert list(a[:16]) == list(b[:16]) and list(a[16:]) != list(b[16:])


def test_ids_reused_in_another_context_get_an_alias_so_no_false_hit_is_possible(tmp_path):
    # id 2 appears after id 1 first, then after id 9: the second context is different content.
    path = write_lines(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 32, "output_length": 0, "hash_ids": [1, 2]},
        {"timestamp": 0, "input_length": 32, "output_length": 0, "hash_ids": [9, 2]},
    ])
    res = read_trace(path, format="mooncake", hash_id_block_size=16, block_size=16)
    a, b = list(res.requests)
    assert a.block_keys[1] != b.block_keys[1]
    assert res.stats["chain_violations"] == 1


def test_id_chain_canonical_ids_identify_the_whole_prefix():
    chain = IdChain()
    seen: dict[tuple[int, int], tuple[int, ...]] = {}
    for ids in ([0, 1, 2], [0, 1, 3], [5, 1, 2], [0, 1, 2, 4], [5, 1, 2, 4], [2, 4]):
        canon = chain.canonical(ids)
        for i, c in enumerate(canon):
            assert seen.setdefault((i, c), tuple(ids[: i + 1])) == tuple(ids[: i + 1])


def test_bailian_lines_with_chat_id_have_timestamps_in_seconds(tmp_path):
    path = write_lines(tmp_path / "bailian.jsonl", [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 10.0, "input_length": 20,
         "output_length": 5, "type": "text", "turn": 1, "hash_ids": [0, 1]},
        {"chat_id": 2, "parent_chat_id": 1, "timestamp": 12.5, "input_length": 40,
         "output_length": 5, "type": "text", "turn": 2, "hash_ids": [0, 1, 2]},
    ])
    a, b = read_trace(path, format="mooncake", hash_id_block_size=16, block_size=16).requests
    assert (a.arrival_s, b.arrival_s) == (0.0, 2.5)
    assert b.attrs["conversation"] == "2"


def test_output_tokens_zero_drops_outputs():
    reqs = list(read_trace(MOONCAKE_CONVERSATION, format="mooncake", block_size=512,
                           output_tokens="0", limit=50).requests)
    assert len(reqs) == 50 and all(r.output_tokens == 0 for r in reqs)


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------


def _bad_mooncake(tmp_path):
    return write_lines(tmp_path / "bad.jsonl", [
        {"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [0, 1]},
        "{not json",
        {"timestamp": 5, "input_length": "many", "output_length": 1, "hash_ids": [0]},
        {"timestamp": 6, "input_length": 100, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 7, "input_length": 20, "output_length": 1, "hash_ids": [0, "x"]},
        "[1, 2]",
        "",
        {"timestamp": 9, "input_length": 20, "output_length": 1, "hash_ids": [0, 1]},
    ])


def test_malformed_lines_are_named_by_file_line_and_field_and_skipped(tmp_path):
    path = _bad_mooncake(tmp_path)
    res = read_trace(path, format="mooncake", hash_id_block_size=16, block_size=16)
    reqs = list(res.requests)
    assert [r.request_id for r in reqs] == ["bad:1", "bad:8"]
    got = [(p.line, p.field) for p in res.problems]
    assert got == [(2, None), (3, "$.input_length"), (4, "$.hash_ids"), (5, "$.hash_ids"),
                   (6, "$")]
    assert all(p.location == str(path) for p in res.problems)
    assert "not valid JSON" in res.problems[0].reason
    assert str(res.problems[1]) == f"{path}:3: $.input_length: missing or not an integer"
    assert res.stats == {"requests": 2, "skipped": 5, "chain_violations": 0}


def test_strict_stops_at_the_first_malformed_line_with_file_and_line(tmp_path):
    path = _bad_mooncake(tmp_path)
    res = read_trace(path, format="mooncake", hash_id_block_size=16, strict=True)
    with pytest.raises(ParseError) as info:
        list(res.requests)
    assert info.value.line == 2 and info.value.source == str(path)
    assert str(info.value).startswith(f"{path}:2: ")


def test_problem_reasons_never_echo_the_line_content(tmp_path):
    secret = "tenant-42 secret prompt text"
    path = write_lines(tmp_path / "t.jsonl", [
        {"prompt_token_ids": secret, "t": 0},
        json.dumps({"messages": [{"role": "user", "content": secret}], "cache_salt": "a/b"}),
    ])
    res = read_trace(path, format="token-ids")
    list(res.requests)
    res2 = read_trace(path, format="chat")
    list(res2.requests)
    for p in res.problems + res2.problems:
        assert secret not in str(p)


def test_unknown_format_and_missing_file_are_clear_errors(tmp_path):
    with pytest.raises(SourceUnavailable, match="no such file"):
        read_trace(tmp_path / "nope.jsonl")
    p = write_lines(tmp_path / "x.jsonl", [{"a": 1}])
    with pytest.raises(UsageError, match="unknown trace format"):
        read_trace(p, format="csv")
    with pytest.raises(UsageError, match="cannot tell the trace format"):
        read_trace(p)
    with pytest.raises(UsageError, match="output-tokens"):
        read_trace(p, format="token-ids", output_tokens="5")


# ------------------------------------------------------------------------------------------
# kv-cache-tester
# ------------------------------------------------------------------------------------------


def test_kv_cache_tester_directory_reads_parents_and_subagents():
    res = read_trace(KV_CACHE_TESTER, block_size=64)
    assert res.format == "kv-cache-tester"
    reqs = list(res.requests)
    assert res.problems == [] and res.stats["chain_violations"] == 0
    sub = [r for r in reqs if "subagent" in r.attrs]
    assert len(reqs) == 2592 + 262 and len(sub) == 262
    rows = {r["file"].split(".")[0]: r for r in selection_rows()}
    per_conv: dict[str, int] = {}
    for r in reqs:
        if "subagent" not in r.attrs:
            per_conv[r.attrs["conversation"]] = per_conv.get(r.attrs["conversation"], 0) + 1
    assert per_conv == {k: int(v["parent_requests"]) for k, v in rows.items()}
    for r in reqs:  # ids only for full 64-token blocks: keys = floor(in / 64)
        assert len(r.block_keys) == r.num_prompt_tokens // 64
    # conversations run one after another, each in arrival order
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))


def test_subagent_arrival_is_parent_entry_time_plus_its_own(tmp_path):
    doc = {"id": "c1", "block_size": 64, "requests": [
        {"t": 0.0, "type": "s", "in": 128, "out": 5, "hash_ids": [1, 2]},
        {"t": 10.0, "type": "subagent", "agent_id": "agent_007", "requests": [
            {"t": 0.5, "type": "n", "in": 64, "out": 1, "hash_ids": [50]},
            {"t": 3.0, "type": "n", "in": 128, "out": 1, "hash_ids": [50, 51]}]},
        {"t": 12.0, "type": "s", "in": 200, "out": 5, "hash_ids": [1, 2, 3]},
    ]}
    path = tmp_path / "conv.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    reqs = list(read_trace(path, format="kv-cache-tester", block_size=64).requests)
    assert [(r.arrival_s, r.attrs.get("subagent")) for r in reqs] == [
        (0.0, None), (10.5, "agent_007"), (12.0, None), (13.0, "agent_007")]
    assert reqs[2].block_keys[:2] == reqs[0].block_keys  # parent continues its own prefix


def test_kv_cache_tester_ids_are_local_to_each_conversation(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"id": name, "block_size": 64,
            "requests": [{"t": 0, "type": "s", "in": 128, "out": 1, "hash_ids": [1, 2]}]}))
    a, b = read_trace(tmp_path, block_size=64).requests
    assert set(a.block_keys).isdisjoint(b.block_keys)
    assert b.arrival_s == 1.0  # b starts CONVERSATION_GAP_S after a's last arrival


def test_kv_cache_tester_bad_request_is_skipped_with_its_index(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"id": "c", "block_size": 64, "requests": [
        {"t": 0, "type": "s", "in": 10, "out": 1, "hash_ids": [1, 2]},
        {"t": 1, "type": "s", "in": 128, "out": 1, "hash_ids": [1, 2]}]}))
    res = read_trace(tmp_path / "c.json", format="kv-cache-tester", block_size=64)
    assert len(list(res.requests)) == 1
    assert (res.problems[0].line, res.problems[0].field) == (1, "$.requests[0].hash_ids")


# ------------------------------------------------------------------------------------------
# token-id JSONL
# ------------------------------------------------------------------------------------------


def test_token_id_lines_carry_salt_lora_logprobs_and_outputs(tmp_path):
    path = write_lines(tmp_path / "tok.jsonl", [
        {"prompt_token_ids": [1, 2, 3, 4], "output_tokens": 7, "t": 0.5, "cache_salt": "A",
         "request_id": "r1", "model": "m"},
        {"prompt": [5, 6, 7], "arrival_s": 2, "lora_name": "ad", "lora_path": "/p",
         "prompt_logprobs": 1, "output_token_ids": [9, 9]},
        {"prompt_token_ids": [1, 2], "cache_salt": "bad/salt"},
        {"prompt_token_ids": [], "t": 3},
        {"prompt_token_ids": [1, True], "t": 3},
    ])
    res = read_trace(path)
    assert res.format == "token-ids"
    a, b = list(res.requests)
    assert (a.request_id, a.arrival_s, a.cache_salt, a.output_tokens, a.model) == (
        "r1", 0.5, "A", 7, "m")
    assert (b.arrival_s, b.lora_name, b.lora_path, b.skip_reading, b.output_tokens,
            list(b.output_token_ids)) == (2.0, "ad", "/p", True, 2, [9, 9])
    assert [(p.line, p.field) for p in res.problems] == [
        (3, "$.cache_salt"), (4, "$.prompt_token_ids"), (5, "$.prompt_token_ids")]


# ------------------------------------------------------------------------------------------
# chat requests
# ------------------------------------------------------------------------------------------


def test_bundled_aider_chat_trace_renders_and_tokenises():
    res = read_trace(AIDER_TRACE)
    assert res.format == "chat"
    reqs = list(res.requests)
    assert len(reqs) == 124 and res.problems == []
    assert max(r.num_prompt_tokens for r in reqs) < 4096  # fits the tiny model live
    with_reply = [r for r in reqs if r.output_token_ids is not None]
    assert len(with_reply) == 99
    assert all(len(r.output_token_ids) == r.output_tokens for r in with_reply)
    assert all(r.output_tokens == 0 for r in reqs if r.output_token_ids is None)
    assert len({r.attrs["conversation"] for r in reqs}) == 70


def test_next_turn_prompt_starts_with_previous_prompt_plus_its_reply():
    # the recorded reply's tokens (+ <|im_end|>) are exactly what the next turn re-sends, so
    # simulated decode blocks are hit as vLLM would hit them
    reqs = list(read_trace(AIDER_TRACE).requests)
    pairs = [(a, b) for a, b in zip(reqs, reqs[1:])
             if a.attrs["conversation"] == b.attrs["conversation"]]
    assert len(pairs) == 54
    for a, b in pairs:
        full = list(a.prompt_token_ids) + list(a.output_token_ids or [])
        assert list(b.prompt_token_ids[: len(full)]) == full


def test_chat_lines_wrapped_like_pydantic_ai_captures_and_anthropic_bodies(tmp_path):
    openai_line = {"i": 0, "uri": "https://api.openai.com/v1/chat/completions", "method": "POST",
                   "request_body": {"model": "gpt-4o", "messages": [
                       {"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       "max_tokens": 9}}
    anthropic_line = {"i": 1, "uri": "https://api.anthropic.com/v1/messages", "method": "POST",
                      "request_body": {"model": "claude", "system": "Be brief.",
                                       "messages": [{"role": "user", "content": "hi"}]},
                      "response_usage": {"input_tokens": 3, "output_tokens": 4}}
    path = write_lines(tmp_path / "caps.jsonl", [openai_line, anthropic_line])
    a, b = list(read_trace(path).requests)
    assert a.prompt_token_ids == b.prompt_token_ids  # same chat once normalised
    assert (a.output_tokens, b.output_tokens) == (9, 4)
    assert (a.model, b.model) == ("gpt-4o", "claude")


def test_detect_format():
    assert detect_format(MOONCAKE_CONVERSATION) == "mooncake"
    assert detect_format(KV_CACHE_TESTER) == "kv-cache-tester"
    assert detect_format(AIDER_TRACE) == "chat"


def test_limit_reads_only_a_slice():
    res = read_trace(MOONCAKE_CONVERSATION, block_size=16, limit=10)
    reqs = list(res.requests)
    assert len(reqs) == 10
    assert all(len(r.block_keys) == r.num_prompt_tokens // 16 for r in reqs)
    assert all(len(r.prompt_token_ids) == r.num_prompt_tokens for r in reqs)
    assert math.ceil(reqs[0].num_prompt_tokens / 512) == 14
