"""A negative token count reads ``token count is negative`` (``docs/ingest.md#bounds``) in every
ingester, never msgspec's ``Expected `int` >= 0``; an OTLP token attribute past int64
(``10**400``) quarantines its span naming the attribute and the bound, not the whole request
as "not an OTLP/JSON trace request"."""

from __future__ import annotations

import json

from tests.hostile.support import fresh_db, run_cli

HUGE = int("1" + "0" * 400)


def _quarantined(tmp_path, args):
    code, out, err = run_cli([*args, "--db", fresh_db(tmp_path)])
    assert code == 4, (out, err)
    return [ln for ln in err.splitlines() if ln.startswith("quarantined ")]


def test_negative_usage_token_count(tmp_path):
    f = tmp_path / "u.jsonl"
    f.write_text(json.dumps({"ts_unix_s": 1795960925.1, "request_id": "n1", "model": "m",
                             "usage": {"prompt_tokens": 10,
                                       "prompt_tokens_details": {"cached_tokens": -5}}}) + "\n")
    assert _quarantined(tmp_path, ["ingest", "requests", f]) == [
        f"quarantined {f}:1: $.usage.prompt_tokens_details.cached_tokens: token count is negative"]


def test_negative_decision_token_count_but_an_epoch_keeps_its_bound(tmp_path):
    rec = {"ts_unix_s": 1795960925.1, "request_id": "gw-1", "run_id": "", "scope": "TENANT",
           "namespace_digest": "3f9a0c1d2e4b5a69", "decision": "accept", "reasons": [],
           "candidate_cached_tokens": -10, "accepted_cached_tokens": 0}
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    assert _quarantined(tmp_path, ["ingest", "decisions", f]) == [
        f"quarantined {f}:1: candidate_cached_tokens: token count is negative"]


def _span(attrs):
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [{
        "traceId": "0" * 32, "spanId": "1" * 16, "name": "chat",
        "startTimeUnixNano": "1795960925000000000", "endTimeUnixNano": "1795960926000000000",
        "attributes": [{"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
                       *({"key": k, "value": {"intValue": v}} for k, v in attrs)]}]}]}]}


def test_otlp_token_attribute_past_int64_names_the_attribute_and_bound(tmp_path):
    f = tmp_path / "o.jsonl"
    where = "resourceSpans[0].scopeSpans[0].spans[0].attributes."
    lines = [_span([("gen_ai.usage.input_tokens", "-5"),
                    ("gen_ai.usage.cache_read.input_tokens", str(HUGE))]),
             _span([("gen_ai.usage.input_tokens", HUGE)]),  # a JSON number, not a string
             _span([("gen_ai.usage.input_tokens", str(-HUGE))])]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert _quarantined(tmp_path, ["ingest", "otlp", f]) == [
        f"quarantined {f}:1: {where}gen_ai.usage.input_tokens: token count is negative",
        f"quarantined {f}:2: {where}gen_ai.usage.input_tokens: over 4,294,967,295 tokens "
        "(2^32 - 1)",
        f"quarantined {f}:3: {where}gen_ai.usage.input_tokens: token count is negative"]


def test_numbers_past_double_in_decisions_read_as_their_bound(tmp_path):
    """``1e400`` (msgspec: ``Number out of range``) reads as the field's documented bound."""
    base = {"ts_unix_s": 1795960925.1, "request_id": "gw-1", "run_id": "", "scope": "TENANT",
            "namespace_digest": "3f9a0c1d2e4b5a69", "decision": "accept", "reasons": [],
            "candidate_cached_tokens": 10, "accepted_cached_tokens": 0}
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(base).replace(f'"{k}": {v}', f'"{k}": 1e400') + "\n"
                         for k, v in (("ts_unix_s", 1795960925.1),
                                      ("candidate_cached_tokens", 10))))
    assert _quarantined(tmp_path, ["ingest", "decisions", f]) == [
        f"quarantined {f}:1: ts_unix_s: time is outside 1970-01-01 to 2100-01-01 UTC",
        f"quarantined {f}:2: candidate_cached_tokens: over 4,294,967,295 tokens (2^32 - 1)"]
