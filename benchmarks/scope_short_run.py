"""Benchmark: a short live gateway run's 10 s windows on a month of production usage rows
(session 8, issue 17; docs/benchmarks.md "A short gateway run's windows").

Builds a month of production usage rows without decisions (UNSCOPED;
``tests/scale_support.build_deployment(..., decisions=False)``) and a 10-minute gateway run
after it (3,000 requests, usage and decision logs through the real ingest functions; request
ids spread like the month's, ``chatcmpl-<hex>``, or the gateway's own ``gw-<prefix>-<n>`` with
``--gateway-ids``). Then, in one process, the queries Scopes, Rejections and Invariants make
for its 10 s windows (``run_ids=['']``, ``decided_production=True``, no range), with the span
bound of ``store.queries.scopes._side_range`` on ("after") and off ("before": the
production decisions' span not used, the session-7 SQL), alternating, best of ``--repeat``;
the rows of ``requests`` each one scans, from ``EXPLAIN (ANALYZE, FORMAT JSON)``; and whether
both give the same result.

    .venv/bin/python benchmarks/scope_short_run.py [--requests 1000000] [--repeat 7]
        [--gateway-ids] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUN = 3000


def build(path: Path, requests: int, gateway_ids: bool) -> None:
    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db
    from tests.scale_support import END_S, build_deployment

    build_deployment(path, requests=requests, scrape_s=3600.0, decisions=False)
    run0 = END_S + 3600.0
    ident = {"scope": "TENANT", "namespace_digest": "6c90621adc676cda",
             "model_digest": "a03cf42cdbb1", "cache_epoch": 2, "authorization_epoch": 2}
    usage, decisions = [], []
    for i in range(RUN):
        rid = f"gw-1a2b-{i:x}" if gateway_ids else f"chatcmpl-{(i * 0x9E3779B97F4A7C15) % 2**64:016x}"
        ts, decision = run0 + 0.2 * i, ("accept", "accept", "miss", "reject")[i % 4]
        rec = {"ts_unix_s": ts, "request_id": rid, "scope": "TENANT",
               "namespace_digest": ident["namespace_digest"], "decision": decision,
               "reasons": [], "expected": ident, "candidate": None, "salt_applied": True,
               "candidate_cached_tokens": 0, "accepted_cached_tokens": 0,
               "instance": "gateway", "model": "tiny-llama-random"}
        if decision == "accept":
            rec.update(candidate=ident, candidate_cached_tokens=512, accepted_cached_tokens=512)
        if decision == "reject":
            rec.update(first_mismatch="cache_epoch", reasons=["cache_epoch"],
                       candidate={**ident, "cache_epoch": 1}, candidate_cached_tokens=512)
        decisions.append(rec)
        usage.append({"ts_unix_s": ts, "request_id": rid, "model": "tiny-llama-random",
                      "instance": "gateway", "scope": "TENANT",
                      "tenant_digest": ident["namespace_digest"],
                      "usage": {"prompt_tokens": 600, "completion_tokens": 4,
                                "prompt_tokens_details": {
                                    "cached_tokens": 512 if decision == "accept" else 0}}})
    d = path.parent
    (d / "usage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in usage))
    (d / "decisions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in decisions))
    with store_db.writer(path) as con:
        ingest_usage_file(con, d / "usage.jsonl")
        ingest_decisions_file(con, d / "decisions.jsonl")
        con.execute("CHECKPOINT")


class _Recorder:
    def __init__(self, con):
        self._con, self.calls = con, []

    def execute(self, sql, params=None):
        self.calls.append((sql, params))
        return self._con.execute(sql, params)

    def __getattr__(self, name):
        return getattr(self._con, name)


def _scanned(con, sql, params) -> int:
    doc = json.loads(con.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchall()[0][1])
    total = 0

    def walk(node):
        nonlocal total
        if node.get("type") == "TABLE_SCAN" and node["extra_info"]["Table"].endswith(".requests"):
            total += int(node["rows_scanned"])
        for child in node.get("children", []):
            walk(child)

    for node in doc["operator"]:
        walk(node)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--gateway-ids", action="store_true")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    import duckdb

    from prefixscope.store.queries import scopes as q

    work = Path(tempfile.mkdtemp(prefix="scope-short-run-"))
    path = work / "month.duckdb"
    t0 = time.perf_counter()
    build(path, args.requests, args.gateway_ids)
    print(f"built {args.requests:,} + {RUN:,} requests in {time.perf_counter() - t0:.1f} s; "
          f"load {os.getloadavg()[0]:.2f}")
    kw = dict(start_s=None, end_s=None, run_ids=[""], decided_production=True)
    queries = {
        "hit_rate_by_scope_window by scope": lambda c: q.hit_rate_by_scope_window(
            c, window_s=10, by=("scope",), **kw),
        "hit_rate_by_scope_window by namespace": lambda c: q.hit_rate_by_scope_window(
            c, window_s=10, by=("scope", "namespace_digest"), **kw),
        "rejections_by_reason_window": lambda c: q.rejections_by_reason_window(
            c, window_s=10, **kw),
        "miss_breakdown_by_window": lambda c: q.miss_breakdown_by_window(c, window_s=10, **kw),
        "invariant_counts (join)": lambda c: q.invariant_counts(c, rollup=False, **kw),
    }
    real = q._production_decision_span
    con = duckdb.connect(str(path), read_only=True)
    times: dict[tuple[str, str], list[float]] = {}
    scanned: dict[tuple[str, str], int] = {}
    results: dict[tuple[str, str], str] = {}
    try:
        for rnd in range(args.repeat):
            for mode in (("before", "after") if rnd % 2 == 0 else ("after", "before")):
                q._production_decision_span = real if mode == "after" else (lambda c: None)
                for name, fn in queries.items():
                    t = time.perf_counter()
                    out = fn(con)
                    times.setdefault((name, mode), []).append(time.perf_counter() - t)
                    if rnd == 0:
                        rec = _Recorder(con)
                        fn(rec)
                        scanned[(name, mode)] = _scanned(con, *rec.calls[-1])
                        results[(name, mode)] = str(out if isinstance(out, dict) else out.to_dict())
    finally:
        q._production_decision_span = real
        con.close()
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    print("| query (10 s windows) | rows scanned before -> after | before ms | after ms | ratio | same |")
    print("|---|---|---|---|---|---|")
    for name in queries:
        a, b = min(times[(name, "before")]), min(times[(name, "after")])
        print(f"| {name} | {scanned[(name, 'before')]:,} -> {scanned[(name, 'after')]:,} | "
              f"{a * 1000:.1f} | {b * 1000:.1f} | {a / b:.1f}x | "
              f"{results[(name, 'before')] == results[(name, 'after')]} |")
    if args.keep:
        print(f"kept {path}")
    else:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
