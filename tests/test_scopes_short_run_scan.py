"""A short live gateway run after a month of production usage rows (session 8, issue 17): the
Scopes and Rejections pages read its 10 s / 1 min windows from the decisions-usage join, not
the 5-minute rollup, so the join must be read within the run's span. The request ids of the
run interleave with the month's (``chatcmpl-<hex>``), so DuckDB's join filter on the ids cannot
prune: only the time filter on each table's own ``ts_unix_s`` keeps the scan to the run's
span ± ``PAIR_SKEW_S``. A real DuckDB file (``tests/scale_support.build_deployment``, then the
run through the real ingest functions); the scans read from ``EXPLAIN (ANALYZE, FORMAT JSON)``
of the SQL each query function runs."""

from __future__ import annotations

import json

import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries import scopes as q
from tests.scale_support import END_S, build_deployment

MONTH = 400_000  # requests over 30 days: 4 row groups of the requests table
RUN = 600        # requests of the gateway run, 0.5 s apart (5 minutes)
RUN0 = END_S + 3600.0
NS = "6c90621adc676cda"


@pytest.fixture(scope="module")
def month_and_run(tmp_path_factory) -> str:
    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file

    d = tmp_path_factory.mktemp("short_run_scan")
    path = d / "month.duckdb"
    build_deployment(path, requests=MONTH, scrape_s=86400.0, decisions=False)
    ident = {"scope": "TENANT", "namespace_digest": NS, "model_digest": "a03cf42cdbb1",
             "cache_epoch": 2, "authorization_epoch": 2}
    usage, decisions = [], []
    for i in range(RUN):
        rid = f"chatcmpl-{(i * 0x9E3779B97F4A7C15) % 2**64:016x}"  # spread like the month's ids
        ts = RUN0 + 0.5 * i
        decision = ("accept", "miss", "reject")[i % 3]
        rec = {"ts_unix_s": ts, "request_id": rid, "scope": "TENANT", "namespace_digest": NS,
               "decision": decision, "reasons": [], "expected": ident, "candidate": None,
               "candidate_cached_tokens": 0, "accepted_cached_tokens": 0, "salt_applied": True,
               "instance": "gateway", "model": "tiny-llama-random"}
        if decision == "accept":
            rec.update(candidate=ident, candidate_cached_tokens=512, accepted_cached_tokens=512)
        if decision == "reject":
            rec.update(first_mismatch="cache_epoch", reasons=["cache_epoch"],
                       candidate={**ident, "cache_epoch": 1}, candidate_cached_tokens=512)
        decisions.append(rec)
        usage.append({"ts_unix_s": ts, "request_id": rid, "model": "tiny-llama-random",
                      "instance": "gateway", "scope": "TENANT", "tenant_digest": NS,
                      "usage": {"prompt_tokens": 600, "completion_tokens": 4,
                                "prompt_tokens_details": {
                                    "cached_tokens": 512 if decision == "accept" else 0}}})
    (d / "usage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in usage))
    (d / "decisions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in decisions))
    with store_db.writer(path) as con:
        assert ingest_usage_file(con, d / "usage.jsonl").rows_added == RUN
        assert ingest_decisions_file(con, d / "decisions.jsonl").rows_added == RUN
        con.execute("CHECKPOINT")
    return str(path)


class _Recorder:
    """The real connection, keeping the SQL and parameters of each ``execute``."""

    def __init__(self, con):
        self._con, self.calls = con, []

    def execute(self, sql, params=None):
        self.calls.append((sql, params))
        return self._con.execute(sql, params)

    def __getattr__(self, name):
        return getattr(self._con, name)


def _scans(con, sql, params) -> dict[str, list[int]]:
    """Rows each table scan of ``sql`` read, by table (``requests``, ``gateway_decisions``)."""
    doc = json.loads(con.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchall()[0][1])
    out: dict[str, list[int]] = {}

    def walk(node):
        if node.get("type") == "TABLE_SCAN":
            table = node["extra_info"]["Table"].rsplit(".", 1)[-1]
            out.setdefault(table, []).append(int(node["rows_scanned"]))
        for child in node.get("children", []):
            walk(child)

    for node in doc["operator"]:
        walk(node)
    return out


QUERIES = {
    "hit_rate_by_scope_window": lambda c, **kw: q.hit_rate_by_scope_window(
        c, window_s=10, by=("scope", "namespace_digest"), **kw),
    "rejections_by_reason_window": lambda c, **kw: q.rejections_by_reason_window(
        c, window_s=10, **kw),
    "miss_breakdown_by_window": lambda c, **kw: q.miss_breakdown_by_window(c, window_s=60, **kw),
    "invariant_counts": lambda c, **kw: q.invariant_counts(c, rollup=False, **kw),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_short_run_windows_scan_the_run_span_only(month_and_run, name):
    with store_db.reader(month_and_run) as con:
        near = con.execute("SELECT count(*) FROM requests WHERE ts_unix_s >= ?",
                           [RUN0 - q.PAIR_SKEW_S]).fetchone()[0]
        rec = _Recorder(con)
        out = QUERIES[name](rec, start_s=None, end_s=None, run_ids=[""],
                            decided_production=True)
        sql, params = rec.calls[-1]
        scans = _scans(con, sql, params)
    # the month's rows more than a day before the run are never read; row groups are
    # 122,880 rows, so the scan reads the last group or two, not the four of the month
    assert len(scans["requests"]) == 1
    assert near < scans["requests"][0] <= 2 * 122_880 < MONTH + RUN
    assert scans["gateway_decisions"] == [RUN]
    if name == "invariant_counts":
        assert out == {"cross_scope_acceptance": 0, "wrong_version_acceptance": 0,
                       "old_generation_use": 0, "decided_requests": RUN,
                       "answered_requests": RUN, "refused_requests": 0,
                       "unverifiable_accepts": 0}
    elif name == "hit_rate_by_scope_window":
        assert len(out) == RUN * 0.5 / 10  # one row per 10 s window of the 5-minute run
        assert out["requests"].sum() == RUN
        assert out["cached_tokens"].sum() == 512 * RUN // 3
    elif name == "rejections_by_reason_window":
        assert out["rejects"].sum() == RUN // 3
        assert set(out["reason"]) == {"cache_epoch"}
    else:
        assert (out["ordinary_miss_requests"].sum(), out["accepts"].sum(),
                out["other_reject_requests"].sum()) == (RUN // 3, RUN // 3, RUN // 3)
