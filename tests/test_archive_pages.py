"""Every dashboard query gives the same numbers after half of the month is archived (issue 17
item 4, ``docs/retention.md``): the Overview, Requests, Scopes, Rejections, Invariants,
Savings and serving (latency, gauges) queries, for the range "all", a range starting inside a
bucket, a range across the archive's boundary and one wholly archived, unfiltered and with
instance, model and scope filters (the instance-filtered scope queries and the part buckets
read the raw rows: table and archive). ``gateway_decisions`` are archived too, including
decisions whose usage row lies on the other side of the boundary, decisions without a usage
row and invariant violations. A real DuckDB file and Parquet folder; ``prefixscope archive``
through the CLI."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from prefixscope.cli.root import run
from prefixscope.ingest.usage import save_usage_rows
from prefixscope.store import db as store_db
from prefixscope.store.queries import alerts as alq
from prefixscope.store.queries import archive as arc
from prefixscope.store.queries import metrics as mq
from prefixscope.store.queries import requests as rq
from prefixscope.store.queries import residency as rs
from prefixscope.store.queries import savings as sq
from prefixscope.store.queries import scope_rollup
from prefixscope.store.queries import scopes as scq
from prefixscope.store.queries import serving as sv
from prefixscope.store.queries.export import export_table
from tests.scale_support import END_S, MODEL_NAMES, build_deployment

DAY = 86400.0
START_S = END_S - 30 * DAY
CUT_S = END_S - 15 * DAY  # archive the first 15 days
CUT_DAY = "2026-10-17"
INSTANCE = "vllm-00:8000"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A month (3,000 requests, hourly scrapes, 3 instances, 600 decisions), with decisions
    moved 2 h across the boundary day (so a request and its decision are archived apart),
    decisions whose usage row is gone, and invariant violations."""
    p = tmp_path_factory.mktemp("pages") / "pristine.duckdb"
    build_deployment(p, requests=3000, scrape_s=3600, days=30, instances=3)
    with store_db.writer(p) as con:
        con.execute("UPDATE gateway_decisions SET ts_unix_s = ts_unix_s - 7200 "
                    "WHERE ts_unix_s >= ? AND ts_unix_s < ?", [CUT_S, CUT_S + 7200])
        con.execute("UPDATE gateway_decisions SET ts_unix_s = ts_unix_s + 7200 "
                    "WHERE ts_unix_s >= ? AND ts_unix_s < ?", [CUT_S - 7200, CUT_S])
        # a rejected candidate whose usage still shows cached tokens (cross-scope invariant)
        con.execute("UPDATE gateway_decisions SET decision = 'reject', first_mismatch = "
                    "'namespace', reasons = 'namespace' WHERE decision = 'accept' AND "
                    "accepted_cached_tokens > 0 AND line % 55 = 0")
        # accepts of another scope's candidate (cross-scope acceptance)
        con.execute("UPDATE gateway_decisions SET candidate_scope = 'PUBLIC' WHERE "
                    "decision = 'accept' AND scope <> 'PUBLIC' AND line % 65 = 0")
        # decisions whose usage row never arrived
        con.execute("DELETE FROM requests WHERE request_id IN (SELECT request_id FROM "
                    "gateway_decisions WHERE line % 45 = 0)")
        rq.rebuild_request_rollup(con)
        rq.rebuild_latency_rollup(con)
        scope_rollup.rebuild(con)
        n = con.execute("SELECT count(*) FILTER (WHERE ts_unix_s < ?), count(*) "
                        "FROM gateway_decisions", [CUT_S]).fetchone()
        assert 0 < n[0] < n[1]
        store_db.checkpoint(con)
    return p


RANGES = [(None, None), (START_S + 30.0, None), (CUT_S - 1.5 * DAY + 77.0, CUT_S + 2 * DAY + 13.0),
          (START_S + 2 * DAY + 150.0, CUT_S - DAY - 33.0)]
FILTERS = [{}, {"instances": [INSTANCE]}, {"models": [MODEL_NAMES[1]]}]


def _snapshot(con) -> list:
    out: list = []
    for s, e in RANGES:
        r = {"start_s": s, "end_s": e}
        for f in FILTERS:
            k = {**r, **f}
            out += [
                # Overview (counters, usage log, serving)
                mq.hit_rate_totals(con, by=("model",), **k),
                mq.hit_rate_by_window(con, window_s=3600, by=("model", "instance"), **k),
                mq.counter_increase_by_window(con, metric="vllm:prefix_cache_queries_total",
                                              window_s=3600, by=("model",), **k),
                sv.gauge_by_window(con, metric="vllm:kv_cache_usage_perc", window_s=3600, **k),
                sv.ttft_by_band_window(con, window_s=3600, **k),
                # Requests
                rq.request_counts(con, **k),
                rq.request_hit_rate_totals(con, by=("model",), **k),
                rq.request_hit_rate_by_window(con, window_s=3600, by=("model",), **k),
                rq.request_hit_rate_bands(con, window_s=86400, **k),
                rq.request_hit_rate_histogram(con, **k),
                rq.request_latency_quantiles(con, column="ttft_ms", **k),
                rq.request_latency_quantiles(con, column="latency_ms", **k),
                rq.newest_requests(con, limit=40, **k),
                rq.cached_tokens_coverage(con, **k),
                rq.counters_and_requests(con, **k),
                rq.uncounted_by_counters(con, **k),
                # Savings
                sq.savings_by_model(con, **k),
                sq.savings_totals(con, **k),
                sq.savings_by_window(con, window_s=86400, **k),
                # Scopes (the instance filter reads the join: table and archive)
                scq.hit_rate_by_scope_window(con, window_s=3600, by=("scope",), **k),
                scq.hit_rate_by_scope_window(con, window_s=3600, by=("scope", "instance"), **k),
                scq.hit_rate_by_scope_totals(con, by=("scope", "namespace_digest"), **k),
                scq.hit_rate_by_scope_totals(con, by=("model",), scopes=["TENANT"], **k),
            ]
        out.append(rq.request_flag_counts(con, **r))
        if s is not None and e is not None:  # the Alerts page's scrape check, Residency
            out.append(alq.scrape_activity(con, start_s=s, end_s=e))
        out.append(rs.residency_histograms(con, **r))
        # Rejections and Invariants (no model/instance filters on these pages)
        for rollup in (None, False):
            out += [
                scq.rejections_by_reason_window(con, window_s=3600, rollup=rollup, **r),
                scq.miss_breakdown_by_window(con, window_s=3600, rollup=rollup, **r),
                scq.top_rejected_namespaces(con, rollup=rollup, **r),
                scq.invariant_counts(con, rollup=rollup, **r),
                *(scq.invariant_violations(con, invariant=n, rollup=rollup, **r)
                  for n in scq.INVARIANTS),
            ]
        out.append(scq.decision_rows(con, limit=60, **r))
    values = scq.scope_filter_values(con)
    # the data span reaches back to the oldest archived day's start (docs/retention.md)
    values["min_ts_unix_s"] = arc.day_floor(values["min_ts_unix_s"])
    out.append(values)
    return out


def _export(con, out) -> list:
    """``prefixscope export requests`` of "all" and of a range across the boundary, read back
    in a fixed order."""
    frames = []
    for i, (s, e) in enumerate([(None, None), RANGES[2]]):
        res = export_table(con, "requests", out / str(i), fmt="parquet", start_s=s, end_s=e)
        frames.append(con.execute("SELECT * FROM read_parquet(?) ORDER BY run_id, request_id",
                                  [res.files]).df())
    assert len(frames[0]) > len(frames[1]) > 0
    return frames


def rq_runs(con) -> list[str]:
    """The run picker of the Scopes pages."""
    from prefixscope.store.queries.replay import run_list

    return run_list(con, with_decisions=True)["run_id"].tolist()


def _equal(a: list, b: list) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, pd.DataFrame):
            pd.testing.assert_frame_equal(x.reset_index(drop=True), y.reset_index(drop=True),
                                          check_dtype=False, obj=f"query {i}")
        else:
            assert x == y, f"query {i}"


def test_every_page_query_is_unchanged_by_archiving_half(pristine, tmp_path, capsys):
    path = tmp_path / "db.duckdb"
    shutil.copy(pristine, path)
    with store_db.reader(path) as con:
        before = _snapshot(con)
        exported = _export(con, tmp_path / "before")
        assert scq.invariant_counts(con)["cross_scope_acceptance"] > 0
        assert not scq.top_rejected_namespaces(con).empty
    assert run(["archive", "--db", str(path), "--to", str(tmp_path / "ark"), "--before",
                CUT_DAY, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert {d["table"] for d in done["days"]} == {"requests", "metric_samples",
                                                  "gateway_decisions"}
    assert len({d["day"] for d in done["days"] if d["table"] == "gateway_decisions"}) == 15
    with store_db.reader(path) as con:
        assert con.execute("SELECT count(*) FROM gateway_decisions WHERE ts_unix_s < ?",
                           [CUT_S]).fetchone()[0] == 0
        assert done["rows"]["gateway_decisions"] == arc.archived_rows(con, "gateway_decisions")
        assert scope_rollup.current(con) and rq.rollup_current(con)
        after = _snapshot(con)
        _equal(exported, _export(con, tmp_path / "after"))
    _equal(before, after)
    files = list((tmp_path / "ark" / "gateway_decisions").rglob("*.parquet"))
    assert files and all("/day=" in str(f) and "/model=" in str(f) for f in files)
    # then the whole month: every page still gives the same numbers from the archive alone
    assert run(["archive", "--db", str(path), "--to", str(tmp_path / "ark"), "--before",
                "2026-11-01"]) == 0
    capsys.readouterr()
    with store_db.reader(path) as con:
        assert con.execute("SELECT (SELECT count(*) FROM gateway_decisions) + (SELECT count(*) "
                           "FROM requests WHERE ts_unix_s IS NOT NULL)").fetchone()[0] == 0
        assert scope_rollup.current(con)
        everything = _snapshot(con)
        runs = rq_runs(con)
    _equal(before[:-1], everything[:-1])  # the filter lists: scopes from retained rows only
    assert everything[-1]["run_ids"] == [""] and everything[-1]["min_ts_unix_s"] == START_S
    assert runs == [""]


def test_late_rows_for_an_archived_day_keep_the_scope_rollup_exact(pristine, tmp_path, capsys):
    """A usage row arriving after its day was archived recomputes its 5-minute scope bucket
    from the table and the archive: the archived rows of that bucket stay counted."""
    path = tmp_path / "db.duckdb"
    shutil.copy(pristine, path)
    assert run(["archive", "--db", str(path), "--to", str(tmp_path / "ark"), "--before",
                CUT_DAY]) == 0
    capsys.readouterr()
    with store_db.writer(path) as con:
        ts = con.execute(f"SELECT min(ts_unix_s) FROM {arc.relation(con, 'requests')} "
                         "WHERE ts_unix_s > ?", [START_S + 3 * DAY]).fetchall()[0][0]
        # (run_id, request_id, source, line, ts, ..., model, instance, endpoint, shape,
        # prompt, cached, ...) as tests/test_retention_archive.py writes them
        save_usage_rows(con, [("", "late-1", "late", 1, ts + 1.0, False, MODEL_NAMES[0],
                               INSTANCE, "chat", "openai", 400, 64, None, None, 7, 20.0, 90.0,
                               None, None, None)])
    with store_db.reader(path) as con:
        assert scope_rollup.current(con)
        for s, e in RANGES:
            for by in (("scope",), ("model",)):
                _equal([scq.hit_rate_by_scope_totals(con, by=by, start_s=s, end_s=e)],
                       [scq.hit_rate_by_scope_totals(con, by=by, start_s=s, end_s=e,
                                                     rollup=False)])
