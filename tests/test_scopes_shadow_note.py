"""Shadow mode on the Scopes and Rejections pages: a gateway in ``shadow`` forwards every
request with a salt unique to it, so its accepts are candidate hits the engine could not serve
(``salt_applied`` false). The pages count them as Accepted decisions and say how many were not
served, with their candidate tokens (``scopes.unserved_accepts``); a ``tenant`` run has no such
note. Real gateway (uvicorn) in front of the loopback upstream, logs ingested as the CLI does."""

from __future__ import annotations

import httpx
import pytest

from tests import dashboard_support as ds
from tests.gateway_support import CHAT, RunningGateway, gateway_config, headers_for, loopback_upstream


def _db(d, mode: str) -> tuple[str, list[dict]]:
    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db
    from tests.gateway_support import read_jsonl

    with loopback_upstream() as (app, _control):
        gw = RunningGateway(gateway_config(d, app.url, mode=mode))
        try:
            for _ in range(3):
                r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT,
                               headers=headers_for("acme"), timeout=10)
                assert r.status_code == 200
        finally:
            gw.stop()
    path = str(d / "gw.duckdb")
    with store_db.writer(path) as con:
        assert ingest_usage_file(con, d / "logs" / "usage.jsonl").rows_added == 3
        assert ingest_decisions_file(con, d / "logs" / "decisions.jsonl").rows_added == 3
    return path, read_jsonl(d / "logs" / "decisions.jsonl")


@pytest.fixture(scope="module")
def shadow(tmp_path_factory):
    return _db(tmp_path_factory.mktemp("shadow"), "shadow")


def test_unserved_accepts_are_the_shadow_accepts(shadow, tmp_path):
    from prefixscope.store import db as store_db
    from prefixscope.store.queries import scopes as q

    db, records = shadow
    assert [(r["decision"], r["salt_applied"]) for r in records] == [
        ("miss", False), ("accept", False), ("accept", False)]
    tokens = sum(r["accepted_cached_tokens"] for r in records if r["decision"] == "accept")
    assert tokens > 0
    with store_db.reader(db) as con:
        assert q.unserved_accepts(con, run_ids=[""]) == (2, tokens, 0, 0)
        assert q.unserved_accepts(con, run_ids=["other"]) == (0, 0, 0, 0)
        assert q.unserved_accepts(con, run_ids=[""], models=["no-such-model"]) == (0, 0, 0, 0)
    tenant_db, tenant_records = _db(tmp_path, "tenant")
    assert [r["decision"] for r in tenant_records] == ["miss", "accept", "accept"]
    with store_db.reader(tenant_db) as con:
        assert q.unserved_accepts(con, run_ids=[""]) == (0, 0, 0, 0)


def test_pages_say_the_shadow_accepts_were_not_served(shadow, use_db):
    db, records = shadow
    tokens = sum(r["accepted_cached_tokens"] for r in records if r["decision"] == "accept")
    want = f"Shadow: 2 accepts were not served ({tokens:,} candidate tokens)"
    for page in ("views/scopes.py", "views/rejections.py"):
        at = ds.run_app(use_db(db), page)
        ds.assert_clean(at)
        assert any(c.startswith(want) for c in ds.texts(at, "caption")), page
