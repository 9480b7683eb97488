"""Identity model: namespaces, digests, salts, the acceptance check, the key, the inventory."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixscope.core.errors import ConfigError
from prefixscope.core import identity as idn
from prefixscope.replay.hashing import block_hashes

KEY = bytes(range(32))
KEY2 = bytes(range(1, 33))


def ident(**kw) -> idn.CacheIdentity:
    base = dict(scope="TENANT", namespace=idn.namespace_for(KEY, scope="TENANT", tenant_id="A"),
                model_digest="m" * 64, tokenizer_digest="t" * 64, runtime_digest="r" * 64,
                adapter_digest="", prompt_bundle_digest="p" * 64, toolset_digest="s" * 64,
                content_digest="c" * 64, policy_revision=1, authorization_epoch=1, cache_epoch=1)
    base.update(kw)
    return idn.CacheIdentity(**base)


def test_namespaces_are_hmacs_of_the_trusted_id():
    a = idn.namespace_for(KEY, scope="TENANT", tenant_id="acme-corp")
    assert len(a) == 64 and "acme" not in a
    assert a == idn.namespace_for(KEY, scope="TENANT", tenant_id="acme-corp")
    assert a != idn.namespace_for(KEY2, scope="TENANT", tenant_id="acme-corp")
    assert a != idn.namespace_for(KEY, scope="PRINCIPAL", tenant_id="acme-corp", principal_id="x")
    assert a != idn.namespace_for(KEY, scope="TENANT", tenant_id="acme-corp ")
    assert idn.namespace_digest(a) == a[:16]
    assert idn.tenant_digest(KEY, "acme-corp") == a[:16]
    with pytest.raises(ValueError):
        idn.namespace_for(KEY, scope="TENANT")
    with pytest.raises(ValueError):
        idn.namespace_for(KEY, scope="PRINCIPAL", tenant_id="a")


def test_content_digest_is_canonical_but_byte_exact_on_text():
    m1 = [{"role": "user", "content": "caf\u00e9", "cache_control": {"type": "ephemeral"}}]
    m2 = [{"content": "cafe\u0301", "role": "user"}]  # NFC-equal, keys in another order
    assert idn.content_digest(m1) == idn.content_digest(m2)
    assert idn.content_digest(m1) != idn.content_digest([{"role": "user", "content": "café "}])
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert idn.content_digest(m1, tools) != idn.content_digest(m1)
    assert idn.toolset_digest(tools) != idn.toolset_digest(tools + tools)


def test_accept_only_when_every_field_matches():
    assert idn.check_acceptance(ident(), ident()) == idn.Decision("accept")
    assert idn.check_acceptance(ident(), ident()).accepted


@pytest.mark.parametrize("field", idn.IDENTITY_FIELDS)
def test_each_field_alone_rejects(field):
    value = getattr(ident(), field)
    other = {"scope": "PRINCIPAL"}.get(field, value + 1 if isinstance(value, int) else value + "x")
    d = idn.check_acceptance(ident(), ident(**{field: other}))
    assert d.outcome == "reject" and d.first_mismatch == field and d.mismatches == (field,)


def test_first_and_all_mismatches_in_field_order():
    d = idn.check_acceptance(ident(), ident(cache_epoch=9, adapter_digest="z", scope="PUBLIC"))
    assert d.first_mismatch == "scope"
    assert d.mismatches == ("scope", "adapter_digest", "cache_epoch")


def test_an_int_epoch_never_equals_its_string():
    d = idn.check_acceptance(ident(), dataclasses.replace(ident(), cache_epoch="1"))
    assert d.mismatches == ("cache_epoch",)


@given(st.text(min_size=1, max_size=40), st.integers(0, 10**6), st.text(max_size=70))
def test_derived_salts_are_valid_vllm_salts(tenant, epoch, runtime):
    ns = idn.namespace_for(KEY, scope="TENANT", tenant_id=tenant)
    salt = idn.derive_salt(KEY, scope="TENANT", namespace=ns, cache_epoch=epoch,
                           runtime_digest=idn.sha256_hex(runtime))
    idn.validate_cache_salt(salt)
    assert len(salt) <= 128 and not any(c in salt for c in "@/\\\x00")


def test_salt_changes_with_namespace_epoch_runtime_and_key():
    ns = idn.namespace_for(KEY, scope="TENANT", tenant_id="A")
    base = idn.derive_salt(KEY, scope="TENANT", namespace=ns, cache_epoch=1, runtime_digest="r")
    others = {
        idn.derive_salt(KEY, scope="TENANT", namespace=idn.namespace_for(
            KEY, scope="TENANT", tenant_id="B"), cache_epoch=1, runtime_digest="r"),
        idn.derive_salt(KEY, scope="TENANT", namespace=ns, cache_epoch=2, runtime_digest="r"),
        idn.derive_salt(KEY, scope="TENANT", namespace=ns, cache_epoch=1, runtime_digest="q"),
        idn.derive_salt(KEY2, scope="TENANT", namespace=ns, cache_epoch=1, runtime_digest="r"),
    }
    assert base not in others and len(others) == 4
    # and it really separates vLLM's block hashes from the first block on
    toks = list(range(64))
    other = next(iter(others))
    assert not set(block_hashes(toks, block_size=16, cache_salt=base)) & set(
        block_hashes(toks, block_size=16, cache_salt=other))


@pytest.mark.parametrize("bad", ["", "a" * 129, "a@b", "a/b", "a\\b", "a\x00b"])
def test_validate_cache_salt_follows_vllm(bad):
    with pytest.raises(ValueError):
        idn.validate_cache_salt(bad)


def test_key_from_file_env_and_refusals(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFIXSCOPE_HMAC_KEY_FILE", raising=False)
    monkeypatch.delenv("PREFIXSCOPE_HMAC_KEY", raising=False)
    with pytest.raises(ConfigError, match="no HMAC key"):
        idn.load_hmac_key()
    f = tmp_path / "k"
    f.write_bytes(b"x" * 40 + b"\n")
    assert idn.load_hmac_key(f) == b"x" * 40
    monkeypatch.setenv("PREFIXSCOPE_HMAC_KEY_FILE", str(f))
    assert idn.load_hmac_key() == b"x" * 40
    monkeypatch.delenv("PREFIXSCOPE_HMAC_KEY_FILE")
    monkeypatch.setenv("PREFIXSCOPE_HMAC_KEY", "ab" * 32)
    assert idn.load_hmac_key() == bytes([0xAB]) * 32
    short = tmp_path / "short"
    short.write_bytes(b"abc")
    with pytest.raises(ConfigError, match="at least 32"):
        idn.load_hmac_key(short)
    with pytest.raises(ConfigError, match="inside the repository"):
        idn.load_hmac_key(Path(__file__).resolve().parent.parent / "pyproject.toml")


def test_public_inventory_file(tmp_path):
    d = idn.message_digest({"role": "system", "content": "public"})
    f = tmp_path / "inv.txt"
    f.write_text(f"# approved\nsha256:{d} the template\n\n")
    inv = idn.PublicInventory.from_file(f)
    assert inv.approves([d]) and not inv.approves([d, "0" * 64]) and not inv.approves([])
    assert idn.resolve_scope("TENANT", [d], None, inv) == "PUBLIC"
    assert idn.resolve_scope("TENANT", [d, "0" * 64], None, inv) == "TENANT"
    assert idn.resolve_scope("PRINCIPAL", [d], "1" * 64, inv) == "PRINCIPAL"
    f.write_text("sha256:XYZ\n")
    with pytest.raises(ConfigError, match=":1:"):
        idn.PublicInventory.from_file(f)


def test_short_forms_never_carry_the_namespace_or_raw_content():
    i = ident()
    short = i.short(KEY)
    assert short["namespace_digest"] == i.namespace[:16]
    assert i.namespace not in str(short)
    assert short["content_digest"] != i.content_digest[:12]  # keyed: no dictionary check
    assert len(short["content_digest"]) == 12


def test_reason_classes():
    assert idn.reason_class("namespace") == "cross_scope"
    assert idn.reason_class("salt") == "cross_scope"
    assert idn.reason_class("adapter_digest") == "version"
    assert idn.reason_class("cache_epoch") == "generation"
    assert idn.reason_class("content_digest") == "collision"
    assert idn.reason_class(None) is None
