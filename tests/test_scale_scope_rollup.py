"""The per-minute scope rollup (issue 17, migration 75) and the daily latency histogram
(migration 77): maintained by the transactions that write decisions and requests, in either
order of arrival (decisions before their requests and after, late and out-of-order rows,
repeats), they give exactly the numbers of the raw join (Scopes, Rejections, Invariants) and
of on-the-fly binning (latency quantiles, within the stated error of exact quantiles); a run
with decisions but no requests and one with requests but no decisions included; a database
made before the migrations gets them in place."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from prefixscope.ingest.usage import save_usage_rows
from prefixscope.store import db as store_db
from prefixscope.store.queries import requests as qr
from prefixscope.store.queries import scope_rollup
from prefixscope.store.queries import scopes as q
from prefixscope.store.queries import serving
from prefixscope.store.queries.decisions import DECISION_COLUMNS, insert_decision_rows
from prefixscope.store.queries.replay import insert_run
from tests.store_support import (frames_equal, insert_requests_without_rollups, older_schema,
                                 request_row)

T0 = 1_795_000_020.0  # a whole minute (29,916,667 min)
REASONS = [None, "scope", "namespace", "salt", "model_digest", "policy_revision",
           "authorization_epoch", "content_digest"]
RUNS = ["", "run-both", "run-decisions-only", "run-usage-only"]


def _usage(run_id, rid, ts, *, model, instance, scope, tenant, prompt, cached, ttft=None,
           latency=None):
    return request_row(run_id, rid, ts, model=model, instance=instance, scope=scope,
                       tenant=tenant, prompt=prompt, cached=cached, ttft=ttft, latency=latency)


def _decision(run_id, rid, ts, *, model, instance, scope, ns, decision, reason, cand, same):
    row = dict.fromkeys(DECISION_COLUMNS)
    row.update(run_id=run_id, request_id=rid, source_id="test", line=1, ts_unix_s=ts,
               instance=instance, model=model, scope=scope, namespace_digest=ns,
               decision=decision, first_mismatch=reason if decision == "reject" else None,
               reasons=(reason or "") if decision == "reject" else "",
               candidate_cached_tokens=cand if decision != "miss" else 0,
               accepted_cached_tokens=cand if decision == "accept" else 0,
               model_digest="m1", content_digest="c1", policy_revision=1,
               authorization_epoch=1, cache_epoch=1)
    if decision != "miss":
        # the candidate's identity: the same as the request's, or one field different
        row.update(candidate_request_id="prev", candidate_scope=scope,
                   candidate_namespace_digest=ns, candidate_model_digest="m1",
                   candidate_content_digest="c1", candidate_policy_revision=1,
                   candidate_authorization_epoch=1, candidate_cache_epoch=1)
        if same == "scope":
            row["candidate_scope"] = "PUBLIC" if scope != "PUBLIC" else "TENANT"
        elif same == "model":
            row["candidate_model_digest"] = "m2"
        elif same == "epoch":
            row["candidate_cache_epoch"] = 0
        elif same == "unverifiable":
            row.update(candidate_scope=None, candidate_namespace_digest=None)
    return tuple(row[c] for c in DECISION_COLUMNS)


_key = st.fixed_dictionaries({
    "run": st.sampled_from(RUNS),
    "usage_ts": st.one_of(st.none(), st.floats(-200, 7400)),
    "decision_ts": st.floats(-200, 7400),
    "model": st.sampled_from(["m1", "m2", None]),
    "instance": st.sampled_from(["a", "b"]),
    "scope": st.sampled_from([None, "PUBLIC", "TENANT"]),
    "tenant": st.sampled_from([None, "ns1", "ns2"]),
    "prompt": st.one_of(st.none(), st.integers(0, 5000)),
    "cached": st.one_of(st.none(), st.integers(0, 5000)),
    "decision": st.sampled_from(["accept", "reject", "miss"]),
    "reason": st.sampled_from(REASONS),
    "cand": st.integers(0, 3000),
    "same": st.sampled_from(["yes", "yes", "scope", "model", "epoch", "unverifiable"]),
    "ttft": st.one_of(st.none(), st.floats(0.01, 5000)),
    "latency": st.one_of(st.none(), st.floats(0.01, 1e6)),
})


def _rows(keys):
    usage, decisions = [], []
    for i, k in enumerate(keys):
        rid = f"r{i}"
        if k["run"] != "run-decisions-only":
            usage.append(_usage(k["run"], rid, None if k["usage_ts"] is None
                                else T0 + k["usage_ts"], model=k["model"],
                                instance=k["instance"], scope=k["scope"], tenant=k["tenant"],
                                prompt=k["prompt"], cached=k["cached"], ttft=k["ttft"],
                                latency=k["latency"]))
        if k["run"] != "run-usage-only" and (k["run"] != "" or i % 3):
            decisions.append(_decision(
                k["run"], rid, T0 + k["decision_ts"], model=None if i % 4 == 0 else k["model"],
                instance=k["instance"], scope=k["scope"] or "TENANT", ns=k["tenant"] or "ns0",
                decision=k["decision"], reason=k["reason"], cand=k["cand"], same=k["same"]))
    return usage, decisions


def _same(con, **kw):
    runs = kw.pop("run_ids", None)
    calls = [
        lambda r: q.hit_rate_by_scope_window(con, window_s=300, by=("scope",), run_ids=runs,
                                             rollup=r, **kw),
        lambda r: q.hit_rate_by_scope_window(con, window_s=900, by=("scope", "namespace_digest"),
                                             rollup=r, **kw),
        lambda r: q.hit_rate_by_scope_window(con, window_s=3600, by=("run_id", "model"),
                                             origin_s=600, models=["m1"], rollup=r, **kw),
        lambda r: q.hit_rate_by_scope_window(con, window_s=60, by=("scope",), instances=["a"],
                                             rollup=r, **kw),  # served by the join
        lambda r: q.hit_rate_by_scope_totals(con, by=("scope",), run_ids=runs, rollup=r, **kw),
        lambda r: q.hit_rate_by_scope_totals(con, by=("scope", "namespace_digest", "instance"),
                                             namespaces=["ns1", "ns0"], rollup=r, **kw),
        lambda r: q.rejections_by_reason_window(con, window_s=900, run_ids=runs, rollup=r, **kw),
        lambda r: q.miss_breakdown_by_window(con, window_s=900, run_ids=runs, rollup=r, **kw),
        lambda r: q.miss_breakdown_by_window(con, window_s=300, scopes=["TENANT"], rollup=r,
                                             **kw),
        lambda r: q.top_rejected_namespaces(con, run_ids=runs, rollup=r, **kw),
        lambda r: q.invariant_counts(con, run_ids=runs, rollup=r, **kw),
        *(lambda r, n=n: q.invariant_violations(con, invariant=n, run_ids=runs, rollup=r, **kw)
          for n in q.INVARIANTS),
        # the "Two figures" note of the Scopes page and `hitrate`: whole buckets from the
        # rollup, the parts at either end from the join
        lambda r: qr.uncounted_by_counters(con, run_ids=runs, rollup=r, **kw),
    ]
    for call in calls:
        frames_equal(call(True), call(False))


def _write(con, batches):
    for kind, rows in batches:
        if kind == "usage":
            save_usage_rows(con, rows)
        else:
            insert_decision_rows(con, rows, [])


@settings(max_examples=20, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(keys=st.lists(_key, min_size=0, max_size=30), data=st.data())
def test_scope_rollup_gives_the_numbers_of_the_join(keys, data):
    usage, decisions = _rows(keys)
    # batches of either kind in a random order: decisions before their requests and after,
    # a batch repeating rows stored already
    batches = []
    for kind, rows in (("usage", usage), ("decisions", decisions)):
        cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=3), label=kind))
        bounds = [0, *cuts, len(rows)]
        batches += [(kind, rows[lo:hi]) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    batches = data.draw(st.permutations(batches), label="arrival order")
    if batches and data.draw(st.booleans(), label="repeat a batch"):
        batches.append(batches[0])
    with store_db.memory() as con:
        _write(con, batches)
        for run in RUNS[1:]:  # replay-model runs: the counters leave their rejects out
            insert_run(con, run_id=run, kind="replay-sim", label=run, created_unix_s=T0,
                       params={})
        assert scope_rollup.current(con)
        stored = con.execute("SELECT * FROM scope_rollup_5m ORDER BY ALL").fetchall()
        scope_rollup.rebuild(con)
        assert con.execute("SELECT * FROM scope_rollup_5m ORDER BY ALL").fetchall() == stored
        start = T0 + data.draw(st.floats(-300, 7500), label="start")
        length = data.draw(st.sampled_from([0.5, 30.0, 60.0, 61.5, 600.0, 9000.0]), label="len")
        _same(con)
        _same(con, start_s=start, end_s=start + length)
        _same(con, end_s=start, run_ids=["run-decisions-only", "run-usage-only"])
        _same(con, start_s=T0 - 120, end_s=T0 + 7080, run_ids=["run-both"])  # whole buckets
        _same(con, start_s=0.0, end_s=60.0)  # a range with no data
        # the latency histogram: the same bins from the rollup and from the rows, within the
        # stated bound of the exact quantiles
        assert qr.latency_rollup_current(con)
        for column in ("ttft_ms", "latency_ms"):
            for kw in ({}, {"start_s": start, "end_s": start + length * 20}):
                _latency_close(con, column, **kw)


def _latency_close(con, column, **kw):
    a = qr.request_latency_quantiles(con, column=column, rollup=True, **kw)
    b = qr.request_latency_quantiles(con, column=column, rollup=False, **kw)
    exact = qr.request_latency_quantiles(con, column=column, exact=True, **kw)
    pd.testing.assert_frame_equal(a.drop(columns="mean_ms"), b.drop(columns="mean_ms"),
                                  check_dtype=False)
    assert a[["band", "requests", "min_ms", "max_ms"]].values.tolist() == \
        exact[["band", "requests", "min_ms", "max_ms"]].values.tolist()
    assert a["mean_ms"].tolist() == pytest.approx(exact["mean_ms"].tolist(), rel=1e-9)
    bound = qr.LATENCY_QUANTILE_ERROR + 1e-9
    for col in ("p05_ms", "p25_ms", "p50_ms", "p75_ms", "p95_ms"):
        for est, true in zip(a[col], exact[col]):
            assert abs(est - true) <= bound * true, (col, est, true)
    if column == "ttft_ms" and "start_s" in kw:
        # the bands of the TTFT panel: one window holding the whole range gives, per band, the
        # same requests and the same exact median (serving.ttft_by_band_window, by run)
        panel = serving.ttft_by_band_window(con, window_s=1e10, by=(), **kw)
        assert panel["band"].tolist() == exact["band"].tolist()
        assert panel["requests"].tolist() == exact["requests"].tolist()
        assert panel["p50_ms"].tolist() == pytest.approx(exact["p50_ms"].tolist(), rel=1e-12)


def test_decisions_before_and_after_their_requests(con):
    """The decision of a request arrives first (its row sits in the decision's minute), then
    the request (the row moves to the request's minute); and the other way round."""
    u = _usage("", "x", T0 + 200, model="m1", instance="a", scope="TENANT", tenant="ns1",
               prompt=100, cached=40)
    d = _decision("", "x", T0 + 10, model="m1", instance="a", scope="TENANT", ns="ns1",
                  decision="accept", reason=None, cand=40, same="yes")
    insert_decision_rows(con, [d], [])
    w = q.hit_rate_by_scope_window(con, window_s=300)
    assert w[["window_start_s", "requests", "decided_requests", "reported_requests"]
             ].values.tolist() == [[T0 - 120, 1, 1, 0]]
    save_usage_rows(con, [u])
    w = q.hit_rate_by_scope_window(con, window_s=60)
    assert w[["window_start_s", "requests", "decided_requests", "hit_rate"]].values.tolist() \
        == [[T0 + 180, 1, 1, 0.4]]
    w = q.hit_rate_by_scope_window(con, window_s=300)
    assert w[["window_start_s", "requests", "decided_requests", "hit_rate"]].values.tolist() \
        == [[T0 + 180, 1, 1, 0.4]]
    _same(con)
    u2 = _usage("", "y", T0 + 400, model="m1", instance="a", scope=None, tenant=None,
                prompt=10, cached=10)
    save_usage_rows(con, [u2])
    insert_decision_rows(con, [_decision("", "y", T0 + 900, model=None, instance="a",
                                         scope="PUBLIC", ns="ns9", decision="reject",
                                         reason="salt", cand=10, same="yes")], [])
    assert q.invariant_counts(con)["cross_scope_acceptance"] == 1  # rejected, KV used anyway
    assert q.invariant_violations(con, invariant="cross_scope_acceptance")[
        "request_id"].tolist() == ["y"]
    assert q.top_rejected_namespaces(con)[["namespace_digest", "top_reason"]].values.tolist() \
        == [["ns9", "salt"]]
    _same(con)


def test_usage_batches_without_decisions_add_to_the_rollup(con, monkeypatch):
    """Usage batches of new rows while no decision is stored: each batch's aggregates are added
    to the stored buckets (not recomputed), exactly what a rebuild from the rows gives: batches
    sharing 5-minute buckets, rows without a time, NULL tokens and scopes; then a repeated
    batch (recomputed) and a decision for a stored request (recomputed) keep it exact."""
    rows = [_usage("" if i % 5 else "run-a", f"u{i}", None if i % 9 == 0 else T0 + 47.0 * i,
                   model=["m1", "m2", None][i % 3], instance="a",
                   scope=[None, "PUBLIC", "TENANT"][i % 3], tenant=[None, "ns1"][i % 2],
                   prompt=None if i % 11 == 0 else 100 + i,
                   cached=None if i % 4 == 0 else i % 3 * 10)
            for i in range(60)]
    calls = []
    real = scope_rollup._add_usage_only
    monkeypatch.setattr(scope_rollup, "_add_usage_only",
                        lambda c, b: (calls.append(b), real(c, b)))  # counts the calls
    for lo, hi in ((0, 7), (7, 30), (30, 31), (31, 60)):  # cuts inside shared buckets
        save_usage_rows(con, rows[lo:hi])
        stored = con.execute("SELECT * FROM scope_rollup_5m ORDER BY ALL").fetchall()
        scope_rollup.rebuild(con)
        assert con.execute("SELECT * FROM scope_rollup_5m ORDER BY ALL").fetchall() == stored
    assert len(calls) == 4  # every batch took the additive path
    assert con.execute("SELECT count(*) FROM scope_rollup_5m WHERE bucket_start_s IS NULL"
                       ).fetchone()[0] > 0
    assert scope_rollup.current(con)
    _same(con)
    save_usage_rows(con, rows[20:40])  # a repeat: nothing added, recomputed
    assert len(calls) == 4
    insert_decision_rows(con, [_decision("", "u1", T0 + 5000, model="m1", instance="a",
                                         scope="TENANT", ns="ns1", decision="accept",
                                         reason=None, cand=5, same="yes")], [])
    save_usage_rows(con, [_usage("", "late", T0 + 60, model="m1", instance="a",
                                 scope=None, tenant=None, prompt=5, cached=5)])
    assert len(calls) == 4  # a decision is stored: recomputed
    stored = con.execute("SELECT * FROM scope_rollup_5m ORDER BY ALL").fetchall()
    scope_rollup.rebuild(con)
    assert con.execute("SELECT * FROM scope_rollup_5m ORDER BY ALL").fetchall() == stored
    _same(con)


@pytest.fixture
def db_at_72(db_path, monkeypatch):
    with older_schema(db_path, monkeypatch, before=73) as con:
        store_db.migrate(con)
        keys = [dict(run=RUNS[i % 4], usage_ts=None if i % 7 == 0 else 37.0 * i,
                     decision_ts=11.0 * i, model="m1", instance="a", scope="TENANT",
                     tenant=f"ns{i % 3}", prompt=100, cached=i % 3 * 10,
                     decision=["accept", "reject", "miss"][i % 3], reason=REASONS[i % 8],
                     cand=50, same=["yes", "scope"][i % 2], ttft=10.0 + i, latency=100.0 + i)
                for i in range(40)]
        usage, decisions = _rows(keys)
        from prefixscope.store.sqlhelpers import insert_rows_bulk

        # as the code before migrations 75-77 wrote them: no scope or latency rollup
        insert_requests_without_rollups(con, usage)
        qr.rebuild_request_rollup(con)
        # the columns of schema 72: bypass (migration 81, the last column) came later
        assert DECISION_COLUMNS[-1] == "bypass"
        insert_rows_bulk(con, "gateway_decisions", DECISION_COLUMNS[:-1],
                         [r[:-1] for r in decisions])
    return db_path


def test_migrations_build_the_rollups_of_stored_rows(db_at_72):
    con = store_db.connect(db_at_72)
    try:
        assert {75, 76, 77} <= set(store_db.migrate(con))
        assert scope_rollup.current(con)
        assert qr.latency_rollup_current(con)
        assert q.invariant_counts(con)["decided_requests"] == 26  # 40 keys: 10 usage-only, 4 without
        _same(con)
        _latency_close(con, "ttft_ms")
    finally:
        con.close()
