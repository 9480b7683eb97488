"""Live gateway traffic on the pages and in the CLI (session 6, new user's findings).

The database is built from a real gateway (``prefixscope gateway`` in uvicorn) in front of the
minimal loopback upstream (``tests/gateway_support.py``), its usage and decision logs ingested
as ``ingest requests`` / ``ingest decisions`` read them: production traffic (run ``''``, no
``runs`` row, no counters). Traffic: acme twice (miss, accept), a cache-epoch bump, acme again
(reject, cache_epoch), globex once (miss); then three requests the gateway answers itself: a
malformed body (400 bad_request), an unknown model (404 unknown_model), an oversized body (413
too_large).
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests import dashboard_support as ds
from tests.gateway_support import CHAT, RunningGateway, gateway_config, headers_for, loopback_upstream

#: The gateway's answers to the three refused requests.
REFUSED = {"bad_request": 1, "too_large": 1, "unknown_model": 1}


@pytest.fixture(scope="module")
def live_db(tmp_path_factory):
    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    d = tmp_path_factory.mktemp("live_gw")
    with loopback_upstream() as (app, _control):
        gw = RunningGateway(gateway_config(d, app.url, max_body_bytes=4096,
                                           read_timeout_s=5.0, connect_timeout_s=5.0))
        try:
            url = gw.url + "/v1/chat/completions"
            acme, globex = headers_for("acme"), headers_for("globex")
            for _ in range(2):
                assert httpx.post(url, json=CHAT, headers=acme, timeout=10).status_code == 200
            gw.admin("/admin/cache-epoch/bump")
            assert httpx.post(url, json=CHAT, headers=acme, timeout=10).status_code == 200
            assert httpx.post(url, json=CHAT, headers=globex, timeout=10).status_code == 200
            js = {**acme, "content-type": "application/json"}
            for body, status in ((b'{"model": "x", "messages": [', 400),
                                 (json.dumps(dict(CHAT, model="nope")).encode(), 404),
                                 (json.dumps(dict(CHAT, pad="x" * 8000)).encode(), 413)):
                assert httpx.post(url, content=body, headers=js, timeout=10).status_code == status
        finally:
            gw.stop()
    (d / "logs_dir.txt").write_text(str(d / "logs"))
    path = str(d / "live.duckdb")
    with store_db.writer(path) as con:
        assert ingest_usage_file(con, d / "logs" / "usage.jsonl").rows_added == 4
        assert ingest_decisions_file(con, d / "logs" / "decisions.jsonl").rows_added == 8
        con.execute("CHECKPOINT")
    return path


def test_live_data_has_no_skip_reading_note(live_db, cli):
    """The live gateway sends a reject with an isolating salt, not skip_reading_prefix_cache,
    and this database has no counters: no 'vLLM's counters leave out' note anywhere."""
    code, out, err = cli(["hitrate", "--db", live_db, "--window", "1d"])
    assert code == 0, err
    assert "skip_reading" not in out and "note:" not in out
    assert "(requests: usage logs" in out  # the per-request figure is the only one
    code, out, err = cli(["report", "--db", live_db])
    assert code == 0, err
    assert "skip_reading" not in out and "note:" not in out
    code, out, _ = cli(["report", "--db", live_db, "--json"])
    assert json.loads(out)["note"] is None


def test_live_data_uncounted_is_zero_even_with_a_reject(live_db):
    from prefixscope.store import db as store_db
    from prefixscope.store.queries import requests as q

    with store_db.reader(live_db) as con:
        assert con.execute("SELECT count(*) FROM gateway_decisions WHERE decision = 'reject'"
                           ).fetchone()[0] == 1
        got = q.uncounted_by_counters(con, run_ids=("",))
        every = q.uncounted_by_counters(con, run_ids=None)
    assert got == every == {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0}


def test_scopes_page_on_live_data_has_no_note(live_db, use_db):
    at = ds.run_app(use_db(live_db), "views/scopes.py")
    ds.assert_clean(at)
    assert not [t for t in ds.texts(at, "info") if "Two figures" in t or "skip_reading" in t]


def test_no_note_without_counters():
    """A replay run's rejects without any counters in the selection: nothing to leave out."""
    from prefixscope.core.report import uncounted_note_of

    figures = {"counter_hit_tokens": 0, "counter_query_tokens": 0, "request_cached_tokens": 10,
               "request_prompt_tokens": 100, "uncounted_requests": 3,
               "uncounted_prompt_tokens": 60}
    assert uncounted_note_of(figures) is None
    with_counters = dict(figures, counter_hit_tokens=10, counter_query_tokens=40)
    assert uncounted_note_of(with_counters).endswith(
        "vLLM's counters leave out the 60 prompt tokens of 3 rejected requests (sent with "
        "skip_reading_prefix_cache), the per-request figure counts them")


def test_report_json_has_iso_times_beside_unix_seconds(live_db, cli):
    """`report --json` gains `start`/`end` (ISO, as `hitrate --json`'s window_start); the old
    fields stay."""
    from prefixscope.core.times import format_time

    code, out, err = cli(["report", "--db", live_db, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"] == "requests"
    assert doc["start"] == format_time(doc["start_unix_s"]) and doc["start"].endswith("Z")
    assert doc["end"] == format_time(doc["end_unix_s"])
    assert doc["start_unix_s"] < doc["end_unix_s"]
    code, out, _ = cli(["report", "--db", live_db, "--start", "2020-01-01", "--json"])
    doc = json.loads(out)
    assert doc["start"] == "2020-01-01T00:00:00Z"


def test_refused_requests_are_counted_apart(live_db):
    """The three requests the gateway answered itself are not traffic: out of the request and
    miss counts, in refused_by_reason by code; the rollup and the join agree."""
    from prefixscope.store import db as store_db
    from prefixscope.store.queries import scopes as q

    with store_db.reader(live_db) as con:
        for rollup in (None, False):
            refused = q.refused_by_reason(con, run_ids=[""], rollup=rollup)
            assert dict(zip(refused["error"], refused["requests"])) == REFUSED
            t = q.hit_rate_by_scope_totals(con, by=("scope",), run_ids=[""], rollup=rollup)
            assert t[["requests", "accepts", "rejects", "misses", "refused_requests"]
                     ].values.tolist() == [[4, 1, 1, 2, 3]]
            assert (t["reported_prompt_tokens"].sum(), t["cached_tokens"].sum()) == (
                t["prompt_tokens"].sum(), t["cached_tokens"].sum())
            m = q.miss_breakdown_by_window(con, window_s=86400, run_ids=[""], rollup=rollup)
            assert (m["ordinary_miss_requests"].sum(), m["accepts"].sum(),
                    m["other_reject_requests"].sum()) == (2, 1, 1)
            r = q.rejections_by_reason_window(con, window_s=86400, run_ids=[""], rollup=rollup)
            assert r["rejects"].sum() == 1


def test_pages_show_refused_apart(live_db, use_db):
    db = use_db(live_db)
    at = ds.run_app(db, "views/scopes.py")
    ds.assert_clean(at)
    table = at.dataframe[0].value
    assert sum(int(x) for x in table["Requests"]) == 4  # acme 3, globex 1
    assert sum(int(x) for x in table["No candidate"]) == 2
    # the reasons are the decision log's (data): escaped by md_text in the Markdown source
    want = ("Refused / errors: 3 requests (bad\\_request 1, too\\_large 1, unknown\\_model 1) "
            "never reached the engine")
    assert any(c.startswith(want) for c in ds.texts(at, "caption"))
    at = ds.run_app(db, "views/rejections.py")
    ds.assert_clean(at)
    assert ds.metrics(at)["Ordinary misses"] == "2"
    assert any(c.startswith(want) for c in ds.texts(at, "caption"))


def test_live_run_reads_production_gateway_with_its_span(live_db, use_db):
    """The picker's option for live gateway traffic: the span of its decisions, not an empty
    name and the ingest time."""
    from prefixscope.core.formatting import fmt_time
    from prefixscope.store import db as store_db

    with store_db.reader(live_db) as con:
        lo, hi = con.execute("SELECT min(ts_unix_s), max(ts_unix_s) FROM gateway_decisions"
                             ).fetchone()
    at = ds.run_app(use_db(live_db), "views/rejections.py")
    ds.assert_clean(at)
    picker = at.multiselect(key="rejections_runs")
    assert picker.value == [""]
    assert picker.format_func("") == f"production (gateway) · from {fmt_time(lo)} to {fmt_time(hi)}"


def test_page_picker_follows_the_sidebar_run(live_db, tmp_path, use_db):
    """Two runs with decisions: the page's picker starts with the sidebar's Run, and says so
    when the user picks another."""
    import shutil
    from pathlib import Path

    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    logs = Path(Path(live_db).parent / "logs_dir.txt").read_text()
    db = str(tmp_path / "two.duckdb")
    shutil.copy(live_db, db)
    for name in ("usage.jsonl", "decisions.jsonl"):  # copies under run "other"
        lines = [json.loads(x) for x in (Path(logs) / name).read_text().splitlines() if x]
        (tmp_path / name).write_text("".join(
            json.dumps({**x, "run_id": "other"} if "run_id" in x else x) + "\n" for x in lines))
    with store_db.writer(db) as con:
        assert ingest_usage_file(con, tmp_path / "usage.jsonl", run_id="other").rows_added == 4
        assert ingest_decisions_file(con, tmp_path / "decisions.jsonl",
                                     run_id="other").rows_added == 8
        con.execute("CHECKPOINT")
    db = use_db(db)
    at = ds.run_app(db, "views/scopes.py")
    ds.assert_clean(at)
    assert at.multiselect(key="filter_runs").value == [""]  # the sidebar: production
    assert at.multiselect(key="scopes_runs").value == [""]  # the page follows it

    def pick_other(at):
        at.multiselect(key="filter_runs").set_value(["other"])
    at = ds.run_app(db, "views/scopes.py", setup=pick_other)
    ds.assert_clean(at)
    assert at.multiselect(key="scopes_runs").value == ["other"]
    at.multiselect(key="scopes_runs").set_value([""]).run()
    assert any(c.startswith("Showing production (picked here); the sidebar's Run is other")
               for c in ds.texts(at, "caption"))


def test_page_says_why_it_shows_another_run_than_the_sidebar(live_db, tmp_path, use_db):
    """The demo's case: the sidebar's Run is production, which has usage rows but no decision;
    the page shows the run with decisions and says why."""
    from pathlib import Path

    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    logs = Path(Path(live_db).parent / "logs_dir.txt").read_text()
    for name in ("usage.jsonl", "decisions.jsonl"):
        lines = [json.loads(x) for x in (Path(logs) / name).read_text().splitlines() if x]
        (tmp_path / name).write_text("".join(
            json.dumps({**x, "run_id": "other"} if "run_id" in x else x) + "\n" for x in lines))
    db = str(tmp_path / "side.duckdb")
    with store_db.writer(db) as con:
        assert ingest_usage_file(con, Path(logs) / "usage.jsonl").rows_added == 4  # production
        assert ingest_usage_file(con, tmp_path / "usage.jsonl", run_id="other").rows_added == 4
        assert ingest_decisions_file(con, tmp_path / "decisions.jsonl",
                                     run_id="other").rows_added == 8
        con.execute("CHECKPOINT")
    at = ds.run_app(use_db(db), "views/scopes.py")
    ds.assert_clean(at)
    assert at.multiselect(key="filter_runs").value == [""]
    assert at.multiselect(key="scopes_runs").value == ["other"]
    assert ("Showing other (the sidebar's run production has no gateway decisions); the "
            "sidebar's Run is production.") in ds.texts(at, "caption")
