"""The Scopes, Rejections and Invariants pages through Streamlit's AppTest, on databases built
through the real ingest path: the bundled multi-tenant demo (gateway replay -> decision log,
usage JSONL, expositions -> ingest), and a decision log that breaks every invariant."""

from __future__ import annotations

import json

import pytest

from tests import dashboard_support as ds

PAGES = ("views/scopes.py", "views/rejections.py", "views/invariants.py")


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> str:
    from prefixscope.cli.demo_scopes import run_demo_scopes

    d = tmp_path_factory.mktemp("scopes_demo")
    run_demo_scopes(str(d / "demo.duckdb"), str(d / "out"), key=bytes(range(32)))
    return str(d / "demo.duckdb")


NS_A, NS_B = "a" * 16, "b" * 16


def _line(rid, decision, *, cand_ns=NS_A, reasons=(), cand=64, acc=0, **extra):
    rec = {"ts_unix_s": 1_795_960_000.0 + int(rid[1:]), "request_id": rid, "run_id": "bad",
           "scope": "TENANT", "namespace_digest": NS_A, "decision": decision,
           "reasons": list(reasons), "candidate_cached_tokens": cand if decision != "miss" else 0,
           "accepted_cached_tokens": acc,
           "expected": {"model_digest": "aaaa", "cache_epoch": 2, "authorization_epoch": 1},
           "candidate": None if decision == "miss" else {
               "scope": "TENANT", "namespace_digest": cand_ns, "model_digest": "aaaa",
               "cache_epoch": 2, "authorization_epoch": 1}}
    for k, v in extra.items():
        rec["candidate"][k] = v
    return json.dumps(rec)


@pytest.fixture(scope="module")
def bad_db(tmp_path_factory) -> str:
    """A gateway that accepted what it must not: one cross-namespace accept, one wrong-model
    accept, one old-epoch accept, plus usage rows (one reject whose KV was used anyway)."""
    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    d = tmp_path_factory.mktemp("scopes_bad")
    log = d / "decisions.jsonl"
    log.write_text("\n".join([
        _line("r1", "accept", cand_ns=NS_B, acc=64),
        _line("r2", "accept", acc=64, model_digest="bbbb"),
        _line("r3", "accept", acc=64, cache_epoch=1),
        _line("r4", "accept", acc=64),
        _line("r5", "reject", reasons=("namespace",), cand_ns=NS_B),
        _line("r6", "miss"),
    ]) + "\n")
    usage = d / "usage.jsonl"
    usage.write_text("\n".join(json.dumps({
        "ts_unix_s": 1_795_960_000.0 + i, "request_id": f"r{i}", "run_id": "bad",
        "model": "m", "scope": "TENANT", "tenant_digest": NS_A,
        "usage": {"prompt_tokens": 100, "completion_tokens": 1,
                  "prompt_tokens_details": {"cached_tokens": 64 if i != 6 else 0}}})
        for i in range(1, 7)) + "\n")
    db = str(d / "bad.duckdb")
    with store_db.writer(db) as con:
        ingest_decisions_file(con, log)
        ingest_usage_file(con, str(usage))
    return db


def test_pages_are_in_the_router():
    from prefixscope.dashboard.app import PAGES

    files = [p[0] for p in PAGES]
    for page in ("views/scopes.py", "views/rejections.py", "views/invariants.py"):
        assert page in files


def test_scopes_page_on_the_demo(demo_db, use_db):
    at = ds.run_app(use_db(demo_db), "views/scopes.py")
    ds.assert_clean(at)
    m = ds.metrics(at)
    for scope in ("PUBLIC", "TENANT", "PRINCIPAL"):
        assert m[f"{scope} hit rate"].endswith("%")
        assert f"{scope} saved prefill tokens" in m
    assert ds.chart_count(at) == 3
    table = at.dataframe[0].value
    assert set(table["Scope"]) == {"PUBLIC", "TENANT", "PRINCIPAL"}
    assert all(len(x) == 16 for x in table["Namespace digest"])
    assert len(table) == 5  # public + 3 tenants + 1 principal (alice)


def test_scopes_window_selector(demo_db, use_db):
    at = ds.run_app(use_db(demo_db), "views/scopes.py")
    at.radio(key="scopes_window").set_value("1h").run()
    ds.assert_clean(at)
    assert "per 1 h" in at.get("plotly_chart")[0].proto.spec or ds.chart_count(at) == 3


def test_rejections_page_on_the_demo(demo_db, use_db):
    at = ds.run_app(use_db(demo_db), "views/rejections.py")
    ds.assert_clean(at)
    m = ds.metrics(at)
    assert int(m["Rejected requests"].replace(",", "")) > 0
    assert int(m["Version-mismatch misses"].replace(",", "")) > 0
    assert ds.chart_count(at) == 2
    spec = at.get("plotly_chart")[0].proto.spec
    for reason in ("adapter_digest", "tokenizer_digest", "model_digest", "policy_revision",
                   "cache_epoch", "authorization_epoch", "toolset_digest"):
        assert reason in spec
    top = at.dataframe[0].value
    assert len(top) > 0 and all(len(x) == 16 for x in top["Namespace digest"])
    events = at.dataframe[1].value
    assert "tokenizer_upgrade" in set(events["Event"])


def test_invariants_page_reads_zero_on_the_demo(demo_db, use_db):
    at = ds.run_app(use_db(demo_db), "views/invariants.py")
    ds.assert_clean(at)
    html = [m.value for m in at.markdown if "font-size:4rem" in m.value]
    assert len(html) == 3
    assert all(">0</div>" in h and "#2ca02c" in h for h in html)
    assert len(at.success) == 3


def test_invariants_page_turns_red_with_drill_down(bad_db, use_db):
    at = ds.run_app(use_db(bad_db), "views/invariants.py")
    assert not at.exception
    html = [m.value for m in at.markdown if "font-size:4rem" in m.value]
    # cross-scope: r1 (accepted another namespace) + r5 (rejected, KV used anyway)
    assert html[0].endswith(">2</div>") and "#d62728" in html[0]
    assert html[1].endswith(">1</div>")  # r2: wrong model
    assert html[2].endswith(">1</div>")  # r3: old cache epoch
    assert len(at.error) == 3
    rows = at.dataframe[0].value
    assert set(rows["Request id"]) == {"r1", "r5"}
    at.selectbox(key="invariants_pick").set_value("old_generation_use").run()
    assert set(at.dataframe[0].value["Request id"]) == {"r3"}


@pytest.mark.parametrize("page", PAGES)
def test_pages_on_an_empty_database(tmp_path, use_db, page):
    db = ds.build_empty_db(tmp_path / "empty.duckdb")
    at = ds.run_app(use_db(db), page)
    ds.assert_clean(at)
    assert any("No data" in t for t in ds.texts(at, "info"))
    assert ds.chart_count(at) == 0


@pytest.mark.parametrize("page", PAGES)
def test_pages_on_a_database_without_decisions(tmp_path, use_db, page):
    db = ds.build_real_db(tmp_path / "real.duckdb")
    at = ds.run_app(use_db(db), page)
    ds.assert_clean(at)
    assert any("No data" in t for t in ds.texts(at, "info"))


@pytest.fixture(scope="module")
def demo_and_production_db(tmp_path_factory) -> str:
    """The multi-tenant demo plus the bundled vLLM captures' counters under run ``production``
    (a second data source that the Scopes banner must leave out when demo-scopes is picked)."""
    from prefixscope.cli.demo_scopes import run_demo_scopes
    from prefixscope.ingest.exposition import ingest_exposition
    from prefixscope.store import db as store_db

    d = tmp_path_factory.mktemp("scopes_two_runs")
    path = str(d / "demo.duckdb")
    run_demo_scopes(path, str(d / "out"), key=bytes(range(32)))
    with store_db.writer(path) as con:
        for name, instance, at in ds.SCRAPES:
            ingest_exposition(con, str(ds.CAPTURES / name), instance=instance, at_unix_s=at,
                              run_id="production")
        con.execute("CHECKPOINT")
    return path


def test_scopes_banner_counts_the_picked_run_only(demo_and_production_db, use_db):
    """The "Two figures" banner reads the picked run's counters (as `hitrate --run`), not the
    whole store's."""
    from prefixscope.core.report import uncounted_note_of
    from prefixscope.store import db as store_db
    from prefixscope.store.queries import requests as q

    db = use_db(demo_and_production_db)
    at = ds.run_app(db, "views/scopes.py")
    ds.assert_clean(at)
    picked = tuple(at.multiselect(key="scopes_runs").value)
    with store_db.reader(db) as con:
        want = uncounted_note_of(q.counters_and_requests(con, models=None, instances=None,
                                                         run_ids=picked, start_s=None,
                                                         end_s=None))
        every = uncounted_note_of(q.counters_and_requests(con, models=None, instances=None,
                                                          run_ids=None, start_s=None,
                                                          end_s=None))
    assert want is not None and every is not None and want != every
    banners = [t for t in ds.texts(at, "info") if t.startswith("Two figures")]
    assert banners == [f"Two figures for this traffic: {want}."]
