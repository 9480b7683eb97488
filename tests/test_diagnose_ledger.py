"""``diagnose`` prints the miss ledger first (issue 26 item 6): a waterfall from the prompt
tokens to the tokens served from cache, each loss class with its tokens, the top breaker inside
*prompt change*, and the same figures in ``--json`` (``ledger``)."""

from __future__ import annotations

import json

from prefixscope.replay.ledger import CLASSES

AIDER = "data/captures/aider/chat-requests.jsonl"


def test_the_waterfall_comes_first_and_sums_to_the_prompt_tokens(cli, tmp_path):
    code, out, err = cli(["diagnose", AIDER, "--out", tmp_path])
    assert code == 0, err
    lines = out.splitlines()
    head = lines.index("where the prompt tokens went (miss ledger, exact replay, one instance):")
    assert head == 1  # right after the headline (this trace has no note)
    assert lines[head + 1].split()[:4] == ["prompt", "tokens", "117,892", "100.0%"]
    steps = [ln for ln in lines[head + 2:head + 11]
             if ln.startswith("  - ") or ln.startswith("  = ")]
    names = [ln[4:22].strip() for ln in steps]
    assert names == ["engine granularity", "routing", "capacity", "isolation", "prompt change",
                     "cold", "from cache"]
    values = [int(ln[22:].split()[0].replace(",", "")) for ln in steps]
    assert sum(values[:-1]) + values[-1] == 117_892
    assert values[-1] == 102_432 and values[1] == 0  # one instance: no routing loss
    top = next(ln for ln in lines if "top breaker #1" in ln)
    assert lines.index(top) == lines.index(steps[4]) + 1  # inside prompt change
    assert "timestamp (message 0 (system), line 5)" in top
    assert lines.index(steps[-1]) < next(i for i, ln in enumerate(lines)
                                         if ln.startswith("breakers, by lost tokens"))


def test_json_ledger_equals_the_exact_model_and_partitions_the_tokens(cli, tmp_path):
    code, out, err = cli(["diagnose", AIDER, "--out", tmp_path, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    led = doc["ledger"]
    assert set(led["classes"]) == set(CLASSES)
    assert sum(led["classes"].values()) == led["prompt_tokens"] == doc["prompt_tokens"]
    assert led["cached_tokens"] == led["classes"]["hit"] == doc["cached_tokens"]
    assert led["missed_tokens"] == doc["missed_tokens"]
    assert led["classes"]["routing"] == 0 and led["classes"]["capacity"] == 0  # unbounded
    assert led["largest_loss"] == "prompt_change"
    assert led["top_breaker"]["rank"] == 1 and led["top_breaker"]["kind"] == "timestamp"
    assert abs(sum(v for v in led["shares"].values()) - 1.0) < 1e-9


def test_a_small_cache_shows_capacity_losses(cli, tmp_path):
    """The bundled Mooncake conversation trace at 2,000 blocks of 512 tokens: evictions."""
    code, out, err = cli(["diagnose", "data/traces/mooncake/conversation_trace.jsonl.gz",
                          "--out", tmp_path, "--json", "--capacity-blocks", "2000",
                          "--limit", "1000", "--algo", "fast"])
    assert code == 0, err
    doc = json.loads(out)
    led = doc["ledger"]
    assert led["classes"]["capacity"] > 0.1 * led["missed_tokens"]
    assert led["classes"]["prompt_change"] == 0  # hash-id traces: content names its prefix
    assert led["cached_tokens"] == doc["cached_tokens"]
    assert sum(led["classes"].values()) == led["prompt_tokens"]
