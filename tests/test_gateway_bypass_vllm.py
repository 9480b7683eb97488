"""The cache bypass (``/admin/bypass``) in front of the real vLLM CPU server: a request sent while
it is on goes with a salt unique to it, so vLLM reports 0 cached tokens even for a warm prefix.
Its decision record says so: the identity check's ``accept`` with ``bypass: true``,
``salt_applied`` false and ``accepted_cached_tokens`` 0 (what was served), its candidate tokens
kept; ``ingest decisions`` stores the flag, and Scopes and Rejections name the bypass, not
shadow mode (was: ``accept`` of 576 tokens and "Shadow: ... (mode shadow)" on a tenant gateway);
so does Invariants.
"""

from __future__ import annotations

import pytest

from prefixscope.ingest.decisions import ingest_decisions_file
from prefixscope.ingest.usage import ingest_usage_file
from prefixscope.store import db as store_db
from prefixscope.store.queries import scopes as q
from tests import dashboard_support as ds
from tests.gateway_support import read_jsonl
from tests.test_gateway_vllm import Run, _warm_a
from tests.vllm_support import ServerConfig, vllm_pool  # noqa: F401

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(vllm_pool):  # noqa: F811
    return vllm_pool.get(ServerConfig())


def test_a_bypassed_request_is_recorded_as_bypassed_and_the_pages_say_so(tmp_path, server,
                                                                          use_db):
    run = Run(tmp_path, server)  # mode tenant the whole time
    warm = _warm_a(run)  # an accept vLLM served: the prefix is warm under A's salt
    assert run.gw.admin("/admin/bypass", {"on": True})["bypass"] is True
    bypassed = run.send("acme")
    assert Run.cached(bypassed) == 0  # vLLM: nothing read from cache
    assert run.gw.admin("/admin/bypass", {"on": False})["bypass"] is False
    run.gw.stop()

    logs = tmp_path / "logs"
    decisions = {r["request_id"]: r for r in read_jsonl(logs / "decisions.jsonl")
                 if r.get("record") == "decision"}
    w = decisions[warm.headers["x-prefixscope-request-id"]]
    assert (w["decision"], w["salt_applied"], "bypass" in w) == ("accept", True, False)
    assert w["accepted_cached_tokens"] == Run.cached(warm) >= 1024
    rid = bypassed.headers["x-prefixscope-request-id"]
    b = decisions[rid]
    assert b["decision"] == "accept"  # what the identity check found
    assert b["bypass"] is True and b["salt_applied"] is False
    assert b["accepted_cached_tokens"] == 0 == Run.cached(bypassed)
    assert b["candidate_cached_tokens"] >= 1024
    assert sum(1 for r in decisions.values() if r.get("bypass")) == 1

    db = str(tmp_path / "gw.duckdb")
    with store_db.writer(db) as con:
        u = ingest_usage_file(con, logs / "usage.jsonl")
        assert (u.rows_added, u.rows_quarantined) == (4, 0)
        d = ingest_decisions_file(con, logs / "decisions.jsonl")
        assert d.rows_quarantined == 0
    with store_db.reader(db) as con:
        rows = con.execute("SELECT request_id, bypass, accepted_cached_tokens "
                           "FROM gateway_decisions WHERE bypass").fetchall()
        assert rows == [(rid, True, 0)]
        cached = con.execute("SELECT cached_tokens FROM requests WHERE request_id = ?",
                             [rid]).fetchone()[0]
        assert cached == 0
        assert q.unserved_accepts(con, run_ids=[""]) == (0, 0, 1, b["candidate_cached_tokens"])
        inv = q.invariant_counts(con)
        assert (inv["cross_scope_acceptance"], inv["wrong_version_acceptance"],
                inv["old_generation_use"]) == (0, 0, 0)

    want = (f"Bypass: 1 accept was not served ({b['candidate_cached_tokens']:,} candidate "
            "tokens): the cache bypass was on (`/admin/bypass`)")
    for page in ("views/scopes.py", "views/rejections.py", "views/invariants.py"):
        at = ds.run_app(use_db(db), page)
        ds.assert_clean(at)
        captions = ds.texts(at, "caption")
        assert any(c.startswith(want) for c in captions), (page, captions)
        assert not any("Shadow:" in c or "mode `shadow`" in c for c in captions), page
