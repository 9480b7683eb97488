"""Scopes and Rejections on a live gateway run inside a store of a demo-like week (a new
user's walk, session 7): the production gateway run (run ``''`` requests with a decision) is
shown whole on its own rows and over its own span of seconds, not on the week's UNSCOPED usage
rows; a single rejection reason is still named in a legend. Real ingest into a real DuckDB
file, the pages through Streamlit's AppTest."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from tests import dashboard_support as ds

WEEK0 = 1_795_651_200.0          # 2026-11-26 00:00 UTC
RUN0 = WEEK0 + 6 * 86400 + 2580  # 2026-12-02 00:43 UTC, after the week's last usage row
NS = "6c90621adc676cda"
IDENTITY = {"scope": "TENANT", "namespace_digest": NS, "model_digest": "a03cf42cdbb1",
            "policy_revision": 1, "authorization_epoch": 2, "cache_epoch": 2}


def _decision(i: int, decision: str, **extra) -> dict:
    rec = {"v": 1, "record": "decision", "ts_unix_s": RUN0 + 10.0 * i,
           "request_id": f"gw-{i}", "scope": "TENANT", "namespace_digest": NS,
           "decision": decision, "reasons": [], "candidate_cached_tokens": 0,
           "accepted_cached_tokens": 0, "expected": IDENTITY, "candidate": None,
           "instance": "gateway", "model": "tiny-llama-random"}
    rec.update(extra)
    return rec


@pytest.fixture(scope="module")
def week_and_gateway_db(tmp_path_factory) -> str:
    """A demo-like week of production usage rows (no scope: UNSCOPED, 4 M cached tokens an
    hour) and a 90-second gateway run right after it: 8 answered requests (a miss, six
    accepts, one authorization_epoch reject) and one refused (bad_request) request."""
    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    d = tmp_path_factory.mktemp("gw_run_pages")
    week = [{"ts_unix_s": WEEK0 + 3600.0 * h, "request_id": f"wk-{h}", "model": "m",
             "usage": {"prompt_tokens": 5_000_000, "completion_tokens": 1,
                       "prompt_tokens_details": {"cached_tokens": 4_000_000}}}
            for h in range(6 * 24)]
    decisions = [_decision(0, "miss")]
    decisions += [_decision(i, "accept", candidate_cached_tokens=928,
                            accepted_cached_tokens=928, candidate=IDENTITY)
                  for i in range(1, 7)]
    decisions.append(_decision(7, "reject", first_mismatch="authorization_epoch",
                               reasons=["authorization_epoch"], candidate_cached_tokens=928,
                               candidate={**IDENTITY, "authorization_epoch": 1}))
    decisions.append(_decision(8, "miss", error="bad_request"))  # refused: no usage row
    gw_usage = [{"ts_unix_s": r["ts_unix_s"], "request_id": r["request_id"], "run_id": "",
                 "model": "tiny-llama-random", "instance": "gateway", "scope": "TENANT",
                 "tenant_digest": NS,
                 "usage": {"prompt_tokens": 944, "completion_tokens": 4,
                           "prompt_tokens_details": {
                               "cached_tokens": 928 if r["decision"] == "accept" else 0}}}
                for r in decisions[:8]]
    (d / "usage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in week + gw_usage))
    (d / "decisions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in decisions))
    db = str(d / "store.duckdb")
    with store_db.writer(db) as con:
        ingest_usage_file(con, str(d / "usage.jsonl"))
        ingest_decisions_file(con, str(d / "decisions.jsonl"))
        con.execute("CHECKPOINT")
    return db


def _utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def _x_range(spec: dict) -> tuple[float, float]:
    lo, hi = spec["layout"]["xaxis"]["range"]
    return _utc(lo), _utc(hi)


def _names(spec: dict) -> set[str]:
    return {t.get("name") for t in spec["data"]}


def test_scopes_shows_the_gateway_run_on_its_own_rows_and_span(week_and_gateway_db, use_db):
    at = ds.run_app(use_db(week_and_gateway_db), "views/scopes.py")
    ds.assert_clean(at)
    assert list(at.multiselect(key="scopes_runs").value) == [""]
    # a 80-second run starts on the 10 s window (offered to short runs), not 15 min
    assert at.radio(key="scopes_window").value == "10s"
    assert list(at.radio(key="scopes_window").options)[:2] == ["10s", "1m"]
    m = ds.metrics(at)
    assert m["TENANT hit rate"] == f"{6 * 928 / (8 * 944):.1%}"  # the run's 8 answered requests
    charts = ds.charts(at)
    assert set(charts) == {"Hit rate by scope per 10s", "Saved prefill tokens per 10s",
                           "Hit rate by namespace digest (top 1 by volume) per 10s"}
    for title, spec in charts.items():
        # only the gateway run's series: the week's UNSCOPED usage rows are not that run's
        assert _names(spec) in ({"TENANT"}, {f"TENANT {NS}"}), title
        lo, hi = _x_range(spec)
        # the run's own span (00:43:00 .. 00:44:20) with half a 10 s window either side
        assert lo == pytest.approx(RUN0 - 5.0) and hi == pytest.approx(RUN0 + 80.0 + 15.0), title
        assert spec["layout"]["showlegend"] is True, title
    saved = charts["Saved prefill tokens per 10s"]
    assert sum(ds.values(saved["data"][0]["y"])) == 6 * 928


def test_scopes_window_of_a_long_choice_still_reads_the_run_only(week_and_gateway_db, use_db):
    at = ds.run_app(use_db(week_and_gateway_db), "views/scopes.py")
    at.radio(key="scopes_window").set_value("15m").run()
    ds.assert_clean(at)
    spec = ds.charts(at)["Saved prefill tokens per 15m"]
    assert _names(spec) == {"TENANT"}
    lo, hi = _x_range(spec)
    # the one 15-minute window of the run (00:30-00:45), half a window either side: not the week
    assert hi - lo == pytest.approx(2 * 900.0)
    assert lo <= RUN0 <= hi and lo > RUN0 - 3600


def test_rejections_names_the_single_reason_over_the_run_span(week_and_gateway_db, use_db):
    at = ds.run_app(use_db(week_and_gateway_db), "views/rejections.py")
    ds.assert_clean(at)
    assert at.radio(key="rejections_window").value == "10s"
    m = ds.metrics(at)
    assert m["Rejected requests"] == "1" and m["Ordinary misses"] == "1"
    reasons, misses = (json.loads(e.proto.spec) for e in at.get("plotly_chart"))
    # one bar, one reason: still named in a shown legend
    assert [t["name"] for t in reasons["data"]] == ["authorization_epoch"]
    assert reasons["layout"]["showlegend"] is True
    for spec in (reasons, misses):
        lo, hi = _x_range(spec)
        assert lo == pytest.approx(RUN0 - 5.0) and hi == pytest.approx(RUN0 + 95.0)
    # the miss breakdown has the run's answered windows only (8 of 10 s; the 9th holds the
    # refused request alone), not the week's
    assert len(ds.values(misses["data"][0]["x"])) == 8
    top = at.dataframe[0].value
    assert list(top["Requests"].astype(str)) == ["8"]  # the run's answered requests, not the week
