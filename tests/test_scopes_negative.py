"""Negative tests of the cache-identity design (``cache-identity.md`` "Negative tests").

Tenants A and B use a byte-identical public template, different private documents and the same
question. The cache is warmed as A; then B asks while something is wrong. In every case private
hits across tenants stay 0 (ground truth from vLLM's own block hashes of what was forwarded and
the exact simulator's cached tokens) and every rejection names the right field.
"""

from __future__ import annotations

import threading

import pytest

from prefixscope.replay.gateway import Faults
from prefixscope.core.identity import AuthorizationGate, namespace_for
from tests.scopes_support import (
    DOC_A,
    DOC_A2,
    DOC_B,
    DOC_C,
    KEY,
    ev,
    header,
    req,
    run,
)


def _assert_isolated(o):
    assert o.cross_tenant_private_hits() == 0
    for rid, d in o.decisions.items():
        if d.decision == "reject":
            assert o.forwarded[rid].skip_reading, f"{rid}: a reject must not read cached KV"
            assert o.results[rid].cached_tokens == 0
            assert d.accepted_cached_tokens == 0


def test_baseline_salts_separate_tenants_before_lookup():
    o = run([req("A1", 0, "A", DOC_A), req("B1", 1, "B", DOC_B), req("B2", 2, "B", DOC_B)])
    # A's and B's forwarded prompts share the template tokens, yet no block hash
    assert not set(o.hashes("A1")) & set(o.hashes("B1"))
    assert o.decisions["B1"].decision == "miss"
    assert o.results["B1"].cached_tokens == 0
    assert o.decisions["B2"].decision == "accept" and o.results["B2"].cached_tokens > 0
    _assert_isolated(o)


@pytest.mark.parametrize("who", ["B only", "everyone"])
def test_missing_salt_is_rejected_before_any_kv_use(who):
    drop = (lambda r: r.auth.tenant_id == "B") if who == "B only" else (lambda r: True)
    o = run([req("A1", 0, "A", DOC_A), req("B1", 1, "B", DOC_B)], faults=Faults(drop_salt=drop))
    d = o.decisions["B1"]
    assert d.decision == "reject" and d.first_mismatch == "salt" and not d.salt_applied
    assert o.forwarded["B1"].cache_salt is None
    if who == "everyone":
        # without salts the template blocks really are shared: the check is what saves B
        assert set(o.hashes("A1")) & set(o.hashes("B1"))
    assert o.results["B1"].cached_tokens == 0
    _assert_isolated(o)


def test_wrong_namespace_handle_from_a_is_rechecked_against_b():
    def hook(gw, item):
        if item.request_id == "B1":
            from dataclasses import replace

            return replace(item, cache_handle=gw.handle_for("A1"))
        return None

    o = run([req("A1", 0, "A", DOC_A), req("B1", 1, "B", DOC_B)], hook=hook)
    d = o.decisions["B1"]
    assert d.decision == "reject"
    assert d.first_mismatch == "namespace"
    assert "content_digest" in d.reasons
    assert d.candidate_request_id == "A1"
    assert d.candidate["namespace_digest"] != d.namespace_digest
    _assert_isolated(o)


def test_stale_authorization_epoch_is_rejected():
    o = run([req("A1", 0, "A", DOC_A), req("B0", 1, "B", DOC_B),
             ev(2, "authorization_epoch_bump", tenant="B"),
             req("B1", 3, "B", DOC_B, epoch_lag=1),   # token issued before the revocation
             req("B2", 4, "B", DOC_B),                 # fresh token, old object
             req("B3", 5, "B", DOC_B),                 # forgotten: a miss that writes anew
             req("B4", 6, "B", DOC_B)])                # fresh token, new object
    assert o.decisions["B1"].decision == "reject"
    assert o.decisions["B1"].first_mismatch == "authorization_epoch"
    assert o.decisions["B2"].decision == "reject"
    assert o.decisions["B2"].reasons == ("authorization_epoch",)
    # the live gateway's rule (core/decision.py note 2): a reject registers nothing and
    # forgets the old object, so the next request is a miss and the one after an accept
    assert o.decisions["B3"].decision == "miss" and o.results["B3"].cached_tokens == 0
    assert o.decisions["B4"].decision == "accept" and o.results["B4"].cached_tokens > 0
    _assert_isolated(o)


def _weak_hash(namespace: str, material: str) -> bytes:
    return b"\x00"  # every lookup collides: the deliberately weak hash


def test_forced_collision_across_tenants_is_rejected_by_full_identity():
    o = run([req("A1", 0, "A", DOC_A), req("B1", 1, "B", DOC_B)],
            faults=Faults(lookup_key=_weak_hash))
    d = o.decisions["B1"]
    assert d.candidate_request_id == "A1"
    assert d.decision == "reject" and d.first_mismatch == "namespace"
    assert d.reasons == ("namespace", "content_digest")
    _assert_isolated(o)


def test_forced_collision_inside_one_tenant_is_rejected_on_content():
    o = run([req("A1", 0, "A", DOC_A), req("A2", 1, "A", DOC_A2)],
            faults=Faults(lookup_key=_weak_hash))
    d = o.decisions["A2"]
    assert d.decision == "reject" and d.reasons == ("content_digest",)
    _assert_isolated(o)


def test_adapter_switch_rejects_old_adapter_objects():
    hdr = header(adapters={"B": ("b-lora", "adapters/b/v1")})
    o = run([req("A1", 0, "A", DOC_A), req("B0", 1, "B", DOC_B),
             ev(2, "adapter_upgrade", "adapters/b/v2", tenant="B"),
             req("B1", 3, "B", DOC_B), req("B2", 4, "B", DOC_B), req("B3", 5, "B", DOC_B)],
            hdr=hdr)
    assert o.decisions["B1"].decision == "reject"
    assert o.decisions["B1"].reasons == ("adapter_digest",)
    assert o.forwarded["B1"].lora_path == "adapters/b/v2"
    assert o.decisions["B2"].decision == "miss"
    assert o.decisions["B3"].decision == "accept" and o.results["B3"].cached_tokens > 0
    _assert_isolated(o)


@pytest.mark.parametrize("restart", [True, False])
def test_tokenizer_switch_rejects_old_tokenizer_objects(restart):
    # tokenizer-v2 only adds a special token: ordinary text gives the same ids, so without a
    # restart the old blocks would physically hit; the rejection (skip-read) prevents it
    restart_on = ("tokenizer_upgrade",) if restart else ()
    o = run([req("A1", 0, "A", DOC_A), req("B0", 1, "B", DOC_B),
             ev(2, "tokenizer_upgrade", "tokenizer-v2"),
             req("B1", 3, "B", DOC_B), req("B2", 4, "B", DOC_B), req("B3", 5, "B", DOC_B)],
            restart_on=restart_on)
    assert o.decisions["B1"].decision == "reject"
    assert o.decisions["B1"].reasons == ("tokenizer_digest",)
    assert o.results["B1"].cached_tokens == 0
    assert o.decisions["B2"].decision == "miss"
    assert o.decisions["B3"].decision == "accept"
    _assert_isolated(o)


def test_policy_revocation_rejects_objects_of_the_old_policy():
    o = run([req("A1", 0, "A", DOC_A), req("B0", 1, "B", DOC_B),
             ev(2, "policy_revocation", tenant="B"),
             req("B1", 3, "B", DOC_B), req("A2", 4, "A", DOC_A), req("B2", 5, "B", DOC_B),
             req("B3", 6, "B", DOC_B)])
    assert o.decisions["B1"].reasons == ("policy_revision",)
    assert o.results["B1"].cached_tokens == 0        # sent isolated: nothing read
    assert o.decisions["A2"].decision == "accept"    # A's policy did not change
    assert o.decisions["B2"].decision == "miss"      # the old object was forgotten
    assert o.decisions["B3"].decision == "accept"
    _assert_isolated(o)


def test_cache_epoch_bump_changes_the_salt_and_rejects_old_generation():
    o = run([req("A1", 0, "A", DOC_A), req("B0", 1, "B", DOC_B), ev(2, "cache_epoch_bump"),
             req("B1", 3, "B", DOC_B)])
    assert o.decisions["B1"].reasons == ("cache_epoch",)
    assert o.forwarded["B1"].cache_salt != o.forwarded["B0"].cache_salt
    _assert_isolated(o)


def test_eviction_in_between_leaves_no_cross_tenant_hit():
    flood = [req(f"C{i}", 2 + i, "C", DOC_C[i % len(DOC_C)], question=f"flood question {i}")
             for i in range(6)]
    o = run([req("A1", 0, "A", DOC_A), req("B0", 1, "B", DOC_B), *flood,
             req("B1", 10, "B", DOC_B), req("A2", 11, "A", DOC_A)], num_gpu_blocks=260)
    assert o.decisions["B1"].decision == "accept"     # B's own object, still the right identity
    assert o.results["B1"].cached_tokens < o.decisions["B1"].accepted_cached_tokens  # evicted
    assert o.decisions["A2"].decision == "accept"
    _assert_isolated(o)


def test_worker_restart_empties_the_engine_and_accepts_nothing_wrong():
    o = run([req("A1", 0, "A", DOC_A), req("B0", 1, "B", DOC_B), ev(2, "worker_restart"),
             req("B1", 3, "B", DOC_B), req("B2", 4, "B", DOC_B)])
    assert o.decisions["B1"].decision == "accept"
    assert o.results["B1"].cached_tokens == 0         # new engine
    assert o.results["B2"].cached_tokens > 0
    _assert_isolated(o)


def test_model_upgrade_rejects_old_model_objects():
    o = run([req("A1", 0, "A", DOC_A), req("B0", 1, "B", DOC_B), ev(2, "model_upgrade", "r2"),
             req("B1", 3, "B", DOC_B)])
    assert o.decisions["B1"].reasons == ("model_digest",)
    _assert_isolated(o)


def test_principal_scope_is_not_shared_with_the_rest_of_the_tenant():
    o = run([req("A1", 0, "A", DOC_A, scope="PRINCIPAL", principal="alice"),
             req("A2", 1, "A", DOC_A, scope="PRINCIPAL", principal="bob"),
             req("A3", 2, "A", DOC_A)])
    assert o.decisions["A2"].decision == "miss" and o.results["A2"].cached_tokens == 0
    assert o.decisions["A3"].decision == "miss" and o.results["A3"].cached_tokens == 0
    assert len({d.namespace_digest for d in o.decisions.values()}) == 3


# --------------------------------------------------------------------------- the race

@pytest.mark.parametrize("trial", range(200))
def test_revocation_and_permit_race_exactly_one_wins(trial):
    gate = AuthorizationGate(initial_epoch=7)
    ns = namespace_for(KEY, scope="TENANT", tenant_id="B")
    seen_epoch = gate.current(ns)       # the lookup happened at this epoch
    barrier = threading.Barrier(2)
    outcome = {}

    def permit():
        barrier.wait()
        outcome["permit"] = gate.acquire_permit(ns, seen_epoch)

    def revoke():
        barrier.wait()
        outcome["revoke"] = gate.revoke(ns, from_epoch=seen_epoch)

    threads = [threading.Thread(target=permit), threading.Thread(target=revoke)]
    if trial % 2:
        threads.reverse()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcome["revoke"] == 8                      # the revocation always applies
    ops = {op.kind: op for op in gate.log}
    if outcome["permit"]:
        # the KV use won: its permit was linearised before the revocation
        assert ops["permit"].seq < ops["revoke"].seq
    else:
        # the revocation won: it came first and the permit saw the new epoch
        assert ops["revoke"].seq < ops["permit"].seq
    assert gate.current(ns) == 8
    assert not gate.acquire_permit(ns, seen_epoch)     # never again at the old epoch


def test_many_permits_against_one_revocation():
    gate = AuthorizationGate()
    ns = namespace_for(KEY, scope="TENANT", tenant_id="B")
    barrier = threading.Barrier(9)
    results = []
    lock = threading.Lock()

    def permit():
        barrier.wait()
        ok = gate.acquire_permit(ns, 1)
        with lock:
            results.append(ok)

    def revoke():
        barrier.wait()
        gate.revoke(ns, from_epoch=1)

    threads = [threading.Thread(target=permit) for _ in range(8)] + [threading.Thread(target=revoke)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rev = next(op for op in gate.log if op.kind == "revoke")
    for op in gate.log:
        if op.kind == "permit":
            assert op.ok == (op.seq < rev.seq)
    assert sum(results) == sum(1 for op in gate.log if op.kind == "permit" and op.seq < rev.seq)
