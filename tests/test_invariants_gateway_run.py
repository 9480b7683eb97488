"""The Invariants page on a live gateway run inside a store of a demo-like week (session 8):
it reads the production gateway run (run ``''`` requests with a decision) as Scopes and
Rejections do, its own rows over its own span, with the same "Refused / errors" and "Shadow"
lines, so the three invariants of that run read what the other two pages say about it. Real
ingest into a real DuckDB file, the pages through Streamlit's AppTest."""

from __future__ import annotations

import json

import pytest

from tests import dashboard_support as ds

WEEK0 = 1_795_651_200.0          # 2026-11-26 00:00 UTC
RUN0 = WEEK0 + 6 * 86400 + 2580  # after the week's last usage row
NS, OTHER_NS = "6c90621adc676cda", "0123456789abcdef"
IDENTITY = {"scope": "TENANT", "namespace_digest": NS, "model_digest": "a03cf42cdbb1",
            "policy_revision": 1, "authorization_epoch": 2, "cache_epoch": 2}


def _decision(i: int, decision: str, **extra) -> dict:
    rec = {"v": 1, "record": "decision", "ts_unix_s": RUN0 + 10.0 * i,
           "request_id": f"gw-{i}", "scope": "TENANT", "namespace_digest": NS,
           "decision": decision, "reasons": [], "candidate_cached_tokens": 0,
           "accepted_cached_tokens": 0, "expected": IDENTITY, "candidate": None,
           "instance": "gateway", "model": "tiny-llama-random", "salt_applied": True}
    rec.update(extra)
    return rec


@pytest.fixture(scope="module")
def week_and_gateway_db(tmp_path_factory) -> str:
    """A week of production usage rows (no scope: UNSCOPED) and a 100-second gateway run
    after it: a miss, five accepts (two in shadow mode, salt not applied; one of another
    namespace's object: a cross-scope acceptance), a cache_epoch reject whose KV was used
    anyway (old-generation use), a miss, and one refused (bad_request) request."""
    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    d = tmp_path_factory.mktemp("inv_gw_run")
    week = [{"ts_unix_s": WEEK0 + 3600.0 * h, "request_id": f"wk-{h}", "model": "m",
             "usage": {"prompt_tokens": 5_000_000, "completion_tokens": 1,
                       "prompt_tokens_details": {"cached_tokens": 4_000_000}}}
            for h in range(6 * 24)]
    accept = dict(candidate_cached_tokens=928, accepted_cached_tokens=928, candidate=IDENTITY)
    decisions = [_decision(0, "miss")]
    decisions += [_decision(i, "accept", **accept) for i in (1, 2)]
    decisions += [_decision(i, "accept", **accept, salt_applied=False) for i in (3, 4)]
    decisions.append(_decision(5, "accept", **dict(
        accept, candidate={**IDENTITY, "namespace_digest": OTHER_NS})))
    decisions.append(_decision(6, "reject", first_mismatch="cache_epoch", reasons=["cache_epoch"],
                               candidate_cached_tokens=928,
                               candidate={**IDENTITY, "cache_epoch": 1}))
    decisions.append(_decision(7, "miss"))
    decisions.append(_decision(8, "miss", error="bad_request"))  # refused: no usage row
    cached = {"gw-1": 928, "gw-2": 928, "gw-5": 928, "gw-6": 928}  # gw-6: KV used after reject
    gw_usage = [{"ts_unix_s": r["ts_unix_s"], "request_id": r["request_id"], "run_id": "",
                 "model": "tiny-llama-random", "instance": "gateway", "scope": "TENANT",
                 "tenant_digest": NS,
                 "usage": {"prompt_tokens": 944, "completion_tokens": 4,
                           "prompt_tokens_details": {
                               "cached_tokens": cached.get(r["request_id"], 0)}}}
                for r in decisions[:8]]
    (d / "usage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in week + gw_usage))
    (d / "decisions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in decisions))
    db = str(d / "store.duckdb")
    with store_db.writer(db) as con:
        assert ingest_usage_file(con, str(d / "usage.jsonl")).rows_added == 144 + 8
        assert ingest_decisions_file(con, str(d / "decisions.jsonl")).rows_added == 9
        con.execute("CHECKPOINT")
    return db


# the reason is the decision log's (data): escaped by md_text in the Markdown source
REFUSED = ("Refused / errors: 1 request (bad\\_request 1) never reached the engine (the gateway "
           "answered them itself, or the upstream failed); they are left out of the hit rates "
           "and the request and miss counts here (docs/metrics.md#refused-requests).")
SHADOW = "Shadow: 2 accepts were not served (1,856 candidate tokens): the gateway forwarded them"


def _numbers(at) -> list[str]:
    return [m.value for m in at.markdown if "font-size:4rem" in m.value]


def test_invariant_counts_of_the_gateway_run(week_and_gateway_db):
    """The store: the run's own decided rows, the join and the rollup alike."""
    from prefixscope.store import db as store_db
    from prefixscope.store.queries import scopes as q

    with store_db.reader(week_and_gateway_db) as con:
        for rollup in (None, False):
            counts = q.invariant_counts(con, run_ids=[""], decided_production=True,
                                        rollup=rollup)
            assert counts == {"cross_scope_acceptance": 1, "wrong_version_acceptance": 0,
                              "old_generation_use": 1, "decided_requests": 9,
                              "answered_requests": 8, "refused_requests": 1,
                              "unverifiable_accepts": 0}, rollup
            # the same as Scopes' totals and the refused line for the run
            totals = q.hit_rate_by_scope_totals(con, run_ids=[""], decided_production=True,
                                                rollup=rollup)
            assert totals[["scope", "requests", "refused_requests"]].values.tolist() == [
                ["TENANT", 8, 1]]
            rows = q.invariant_violations(con, invariant="old_generation_use", run_ids=[""],
                                          decided_production=True, rollup=rollup)
            assert list(rows["request_id"]) == ["gw-6"]


def test_invariants_page_reads_the_run_as_scopes_and_rejections_do(week_and_gateway_db,
                                                                   use_db):
    db = use_db(week_and_gateway_db)
    at = ds.run_app(db, "views/invariants.py")
    assert not at.exception
    assert list(at.multiselect(key="invariants_runs").value) == [""]
    numbers = _numbers(at)
    assert [n.rsplit(">", 2)[1].removesuffix("</div") for n in numbers] == ["1", "0", "1"]
    assert "#d62728" in numbers[0] and "#2ca02c" in numbers[1] and "#d62728" in numbers[2]
    captions = ds.texts(at, "caption")
    assert REFUSED in captions
    shadow = [c for c in captions if c.startswith(SHADOW)]
    assert len(shadow) == 1
    # the run's 8 answered requests, the Requests of Scopes' table, and its refused one
    assert "Over 8 requests with a gateway decision and 1 refused request (checked too)." \
        in captions
    rows = at.dataframe[0].value
    assert list(rows["Request id"]) == ["gw-5"]  # cross-scope: the other namespace's object
    at.selectbox(key="invariants_pick").set_value("old_generation_use").run()
    assert list(at.dataframe[0].value["Request id"]) == ["gw-6"]
    for page, key in (("views/scopes.py", "scopes_runs"),
                      ("views/rejections.py", "rejections_runs")):
        other = ds.run_app(db, page)
        ds.assert_clean(other)
        assert list(other.multiselect(key=key).value) == [""], page
        assert at.multiselect(key="invariants_runs").format_func("") == \
            other.multiselect(key=key).format_func(""), page
        texts = ds.texts(other, "caption")
        assert REFUSED in texts, page
        assert [c for c in texts if c.startswith(SHADOW)] == shadow, page
    table = ds.run_app(db, "views/scopes.py").dataframe[0].value
    assert list(table["Requests"].astype(str)) == ["8"]


@pytest.mark.browser
def test_invariants_page_in_chromium(week_and_gateway_db, tmp_path):
    """The same page from a real ``prefixscope dashboard`` in headless Chromium: the numbers,
    the refused and shadow lines, no exception box."""
    with ds.chromium(tmp_path / "chromium-profile") as browser, \
            ds.dashboard_server(week_and_gateway_db, log_path=tmp_path / "server.log") as url:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{url}/{ds.page_url_path('views/invariants.py', first=False)}",
                  wait_until="domcontentloaded")
        ds.wait_for_streamlit(page)
        text = page.locator('[data-testid="stMain"]').inner_text()
        assert page.locator('[data-testid="stException"]').count() == 0
        assert not errors, errors
    assert "Refused / errors: 1 request (bad_request 1) never reached the engine" in text
    assert "Shadow: 2 accepts were not served (1,856 candidate tokens)" in text
    assert "Over 8 requests with a gateway decision and 1 refused request (checked too)." in text
    assert "1 request violates it" in text and "0: holds" in text
