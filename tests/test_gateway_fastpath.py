"""The gateway's fast paths give the same values as the plain definitions: one-pass prefix
digests = ``content_digest`` of each prefix (also through the canonical-form cache); the
appended body = the client's bytes plus the fields the gateway sets; block chains and the
whole-block rule of exact candidate tokens; the serving process's gc settings."""

from __future__ import annotations

import gc
import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscope.core.identity import (
    canonical_json,
    content_digest,
    message_digest,
    prefix_digests,
    sha256_hex,
    toolset_digest,
)
from prefixscope.gateway.app import _rewrite
from prefixscope.gateway.prompt import CanonicalCache
from prefixscope.gateway.server import tune_gc
from prefixscope.gateway.tokens import block_chain, shared_tokens

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text
                     | st.floats(allow_nan=False, allow_infinity=False),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(_text, c, max_size=3),
                     max_leaves=8)
_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                  "content": _text | st.lists(st.fixed_dictionaries(
                                      {"type": st.just("text"), "text": _text}), max_size=2)},
                                 optional={"name": _text, "cache_control": _json,
                                           "extra": _json})


@settings(max_examples=150, deadline=None)
@given(st.lists(_message, min_size=1, max_size=6),
       st.lists(st.dictionaries(_text, _json, max_size=3), max_size=2))
def test_prefix_digests_equal_the_per_prefix_definitions(messages, tools):
    bounds = list(range(1, len(messages))) or [1]
    d = prefix_digests(messages, tools, bounds)
    assert d.content == tuple(content_digest(messages[:k], tools) for k in bounds)
    assert d.full == content_digest(messages, tools)
    assert d.messages_only == tuple(sha256_hex(canonical_json(messages[:k])) for k in bounds)
    assert d.message == tuple(message_digest(m) for m in messages)
    assert d.toolset == (toolset_digest(tools) if tools else "")
    cache = CanonicalCache()
    for _ in range(2):  # the first pass fills the cache, the second reads it
        assert prefix_digests(messages, tools, bounds, canonical=cache) == d
    lean = prefix_digests(messages, tools, bounds, canonical=cache, message_digests=False)
    assert lean.message == () and (lean.content, lean.full, lean.messages_only,
                                   lean.toolset) == (d.content, d.full, d.messages_only, d.toolset)


def test_canonical_cache_keeps_values_of_equal_encoding_apart_by_type_and_null():
    cache = CanonicalCache(max_bytes=200)
    values = [{"a": 1}, {"a": 1.0}, {"a": True}, {"a": "1"}, {"a": None, "b": "caf\u00e9"},
              {"b": "cafe\u0301"}, {"role": "user", "content": "x" * 80}, [1, {"z": 2, "y": 3}]]
    for _ in range(3):  # cached, re-read, and started over when max_bytes is passed
        for v in values:
            assert cache(v) == canonical_json(v)
    assert cache._bytes <= 200
    assert all(b"null" not in k for k in cache._forms)  # a null encoding is never a key


def test_rewrite_appends_to_the_client_bytes_or_replaces_its_fields():
    raw = b'{"model": "m",  "messages": [{"role":"user","content":"caf\\u00e9"}], "stream": true}\n'
    body = msgspec.json.decode(raw)
    out = _rewrite(raw, body, "ps1-x", True)
    assert out.startswith(raw.rstrip()[:-1])  # the client's bytes, untouched
    assert json.loads(out) == {**json.loads(raw), "cache_salt": "ps1-x",
                               "stream_options": {"include_usage": True}}
    assert _rewrite(raw, dict(body), "ps1-x", False) == raw.rstrip()[:-1] + b',"cache_salt":"ps1-x"}'
    theirs = b'{"model":"m","cache_salt":"mine","stream_options":{"include_usage":false,"x":1}}'
    got = json.loads(_rewrite(theirs, msgspec.json.decode(theirs), "ps1-y", True))
    assert got == {"model": "m", "cache_salt": "ps1-y",
                   "stream_options": {"include_usage": True, "x": 1}}
    assert theirs.count(b"cache_salt") == 1 and _rewrite(
        theirs, msgspec.json.decode(theirs), "ps1-y", True).count(b"cache_salt") == 1


def test_exact_candidate_tokens_follow_whole_blocks_and_the_last_token_rule():
    a = list(range(100))
    b = list(range(70)) + [999] * 30
    ca, cb = block_chain(a, 16), block_chain(b, 16)
    assert len(ca) == 6 * 8 and len(block_chain(a[:15], 16)) == 0
    assert shared_tokens(ca, cb, len(b), 16) == 64      # blocks 0-3 equal, block 4 differs
    assert shared_tokens(ca, ca, len(a), 16) == 96      # all 6 whole blocks (99 = p-1 >= 96)
    assert shared_tokens(block_chain(a[:96], 16), block_chain(a[:96], 16), 96, 16) == 80
    assert shared_tokens(ca, block_chain([5] + a[1:], 16), 100, 16) == 0  # chained: first differs


def test_tune_gc_freezes_start_up_objects_and_raises_the_young_threshold():
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 10_000  # this process's modules and test objects
        assert gc.get_threshold() == (10_000, 20, 20)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
