"""``ingest prometheus`` against a REAL Prometheus (Debian's /usr/bin/prometheus) scraping a real
loopback HTTP server that serves real vLLM 0.32 exposition text, with counters advanced between
scrapes and a restart. The hit rate from the Prometheus-pulled samples must equal the one from
direct scrapes of the same server, and the expected counter deltas."""

from __future__ import annotations

import json
import re
import os
import time

import pytest

from prefixscope.ingest.exposition import ingest_sources
from prefixscope.ingest.prometheus_api import ingest_prometheus_range, samples_from_series, series_selector
from prefixscope.store import db as store_db
from prefixscope.store.queries.metrics import hit_rate_by_window, hit_rate_totals
from tests.metrics_support import PROMETHEUS, ExpositionServer, PrometheusServer, counter_value, render

pytestmark = pytest.mark.prometheus

needs_prometheus = pytest.mark.skipif(not os.access(PROMETHEUS, os.X_OK),
                                      reason="Debian prometheus not installed (make system-deps)")

Q = "vllm:prefix_cache_queries_total"
H = "vllm:prefix_cache_hits_total"


def _totals(db_path, **kw):
    with store_db.reader(db_path) as con:
        return hit_rate_totals(con, by=("instance",), **kw).to_dict("records")


@needs_prometheus
def test_prometheus_pull_equals_direct_scrapes(tmp_path, cli):
    direct_db = str(tmp_path / "direct.duckdb")
    prom_db = str(tmp_path / "prom.duckdb")
    step_db = str(tmp_path / "step.duckdb")
    created0 = time.time() - 30.0
    states = [
        render("metrics_kvevents.txt", created_unix_s=created0),
        render("metrics_kvevents_after_evict.txt", created_unix_s=created0),
    ]
    t_start = time.time() - 2.0
    with ExpositionServer(states[:1]) as srv, PrometheusServer([srv.hostport]) as prom:
        for text in states + ["restart"]:
            if text == "restart":
                # the server goes down (Prometheus sees failed scrapes: stale series), comes
                # back with new counters created at its start; it answers only after that
                srv.set_text(None)
                time.sleep(2.5)
                created1 = time.time()
                text = render("metrics_kvevents.txt", created_unix_s=created1)
                time.sleep(0.5)
            srv.set_text(text)
            # Prometheus has scraped this state (queries, hits and the created time)
            prom.wait_for(f'{Q}{{instance="{srv.hostport}"}}', counter_value(text, Q))
            prom.wait_for(f'{H}{{instance="{srv.hostport}"}}', counter_value(text, H))
            prom.wait_for(f'vllm:prefix_cache_queries_created{{instance="{srv.hostport}"}}',
                          counter_value(text, "vllm:prefix_cache_queries_created"))
            outcomes, errors = ingest_sources(direct_db, [srv.url])
            assert errors == [] and outcomes[0].summary.rows_added > 0
            time.sleep(1.5)  # a few more Prometheus scrapes of the same state
        t_end = time.time() + 1.0
        time.sleep(1.2)
        outcome = ingest_prometheus_range(prom_db, prom.url, start_s=t_start, end_s=t_end,
                                          chunk_s=5.0)
        assert outcome.summary.rows_added > 0 and outcome.summary.kind == "prometheus"
        again = ingest_prometheus_range(prom_db, prom.url, start_s=t_start, end_s=t_end,
                                        chunk_s=5.0)
        assert again.summary.rows_added == 0  # pulling the same range again adds nothing
        code, out, err = cli(["ingest", "prometheus", prom.url, "--start", str(t_start),
                              "--end", str(t_end), "--step", "1s", "--db", step_db])
        assert code == 0, err
        assert (prom.proc.poll() is None), prom.log_text()[-2000:]

    expected = [(srv.hostport, 14272 + 7136, 30993 + 11652)]
    for db in (direct_db, prom_db, step_db):
        got = [(r["instance"], r["hit_tokens"], r["query_tokens"]) for r in _totals(db)]
        assert got == expected, db
    with store_db.reader(direct_db) as c1, store_db.reader(prom_db) as c2:
        w1 = hit_rate_by_window(c1, window_s=86400, origin_s=t_start)
        w2 = hit_rate_by_window(c2, window_s=86400, origin_s=t_start)
        cols = ["window_start_s", "model", "instance", "hit_tokens", "query_tokens", "hit_rate",
                "restarts"]
        assert w1[cols].to_dict("records") == w2[cols].to_dict("records")
        assert w1["restarts"].sum() == 1
        # Prometheus' target labels are not stored: same series labels as the direct scrape
        l1 = c1.execute("SELECT DISTINCT labels FROM metric_samples ORDER BY 1").fetchall()
        l2 = c2.execute("SELECT DISTINCT labels FROM metric_samples ORDER BY 1").fetchall()
        assert l1 == l2
        n_direct = c1.execute("SELECT count(DISTINCT ts_unix_s) FROM metric_samples "
                              "WHERE metric = ? AND NOT created_zero", [Q]).fetchone()[0]
        n_prom = c2.execute("SELECT count(DISTINCT ts_unix_s) FROM metric_samples "
                            "WHERE metric = ? AND NOT created_zero", [Q]).fetchone()[0]
        assert n_direct == 3 and n_prom > n_direct  # raw mode pulled every 1 s scrape


@needs_prometheus
def test_ingest_prometheus_nothing_in_range_exits_non_zero(tmp_path, cli):
    with ExpositionServer(["# TYPE up gauge\nup 1\n"]) as srv, \
            PrometheusServer([srv.hostport]) as prom:
        time.sleep(1.5)
        code, _, err = cli(["ingest", "prometheus", prom.url, "--start", "-1m", "--end", "now",
                            "--db", tmp_path / "x.duckdb"])
    assert code == 4 and "no vLLM prefix-cache series" in err


@needs_prometheus
def test_ingest_prometheus_every_series_quarantined_prints_the_reasons(tmp_path, cli):
    """Every series refused (a label that may hold a tenant id, no HMAC key): the command
    fails (exit 4) but prints each quarantined series and, with --json, its document; the
    error names the count and the first reason, never the label's value."""
    text = ("# TYPE vllm:prefix_cache_queries_total counter\n"
            'vllm:prefix_cache_queries_total{engine="0",model_name="m",tenant="acme-corp"} 5\n')
    with ExpositionServer([text]) as srv, PrometheusServer([srv.hostport]) as prom:
        prom.wait_for(f'{Q}{{instance="{srv.hostport}"}}', 5.0)  # the sample's value is 5
        # "now" is after the sample the instant query just saw: the range ends to the ms
        # (it was rounded to a whole second, and "now" could fall before the sample)
        code, out, err = cli(["ingest", "prometheus", prom.url, "--start", "-5m", "--end",
                              "now", "--db", tmp_path / "x.duckdb", "--json"])
    assert code == 4, err
    doc = json.loads(out)
    assert doc[0]["rows_read"] == 0 and doc[0]["rows_quarantined"] >= 1
    reason = ("a label that is not a vLLM label may hold a tenant id; configure an "
              "HMAC key (PREFIXSCOPE_HMAC_KEY_FILE) to keep such labels as digests")
    # each sample of the one series located (630ea74): "(series 1, sample K)", K = 1, 2, ...
    reasons = [q["reason"] for q in doc[0]["quarantined"]]
    assert reasons == [f"{reason} (series 1, sample {k})" for k in range(1, len(reasons) + 1)]
    assert f"quarantined {prom.url}:" in err
    assert f"error: nothing could be read: {prom.url}: every series quarantined (" in err
    assert "acme-corp" not in out + err


def test_unreachable_api_is_source_unavailable(tmp_path, cli):
    code, _, err = cli(["ingest", "prometheus", "http://127.0.0.1:9", "--start", "-5m",
                        "--db", tmp_path / "x.duckdb"])
    assert code == 3 and "cannot query" in err


def test_series_selector_and_conversion_without_a_server():
    sel = series_selector()
    assert sel.startswith('{__name__=~"vllm:(') and "prefix_cache_queries_total" in sel
    assert "gpu_prefix_cache_hits_total" in sel and "prefix_cache_queries_created" in sel
    series = [
        {"metric": {"__name__": "vllm:gpu_prefix_cache_queries_total", "engine": "0",
                    "model_name": "m", "instance": "x:2", "pod": "h:1", "job": "vllm"},
         "values": [[100.0, "10"], [101.0, "30"]]},
        {"metric": {"__name__": "vllm:gpu_prefix_cache_queries_created", "engine": "0",
                    "model_name": "m", "instance": "x:2", "pod": "h:1", "job": "vllm"},
         "values": [[100.0, "90.5"], [101.0, "90.5"]]},
        {"metric": {"__name__": "vllm:prefix_cache_hits_total", "engine": "0",
                    "model_name": "m", "pod": "p-1", "job": "vllm"},
         "values": [[100.0, "NaN"]]},
    ]
    read = samples_from_series(series, location="http://p:9090", default_instance="p:9090",
                               instance_label="pod")
    got = sorted((s.metric, s.instance, s.ts_unix_s, s.value, s.legacy, s.created_zero)
                 for s in read.samples)
    assert got == [
        (Q, "h:1", 90.5, 0.0, True, True),
        (Q, "h:1", 100.0, 10.0, True, False),
        (Q, "h:1", 101.0, 30.0, True, False),
    ]
    assert [q.field for q in read.problems] == [H]
    assert "legacy metric names" in read.note


def test_step_samples_place_the_restart_zero_after_the_old_process_steps(con):
    from prefixscope.ingest.exposition import save_samples

    def series(name, points):
        return {"metric": {"__name__": name, "engine": "0", "model_name": "m", "instance": "h:1"},
                "values": [[t, str(v)] for t, v in points]}

    # old process created at 50; restarted at 101.5 (created 101.5) but, with no failed scrape
    # in between, query_range still reports the old value at step 102
    result = [
        series(Q, [(100, 30993), (101, 30993), (102, 30993), (103, 11652), (104, 11652)]),
        series("vllm:prefix_cache_queries_created",
               [(100, 50), (101, 50), (102, 50), (103, 101.5), (104, 101.5)]),
    ]
    read = samples_from_series(result, location="p", default_instance="p:9090", step_s=1.0)
    zeros = sorted(s.ts_unix_s for s in read.samples if s.created_zero)
    assert zeros == [99.5, 102.5]  # max(C, first step showing C - step/2)
    save_samples(con, read, kind="prometheus")
    tot = hit_rate_totals(con, by=()).to_dict("records")[0]
    assert tot["query_tokens"] == 30993 + 11652
    raw = samples_from_series(result, location="p", default_instance="p:9090")
    assert sorted(s.ts_unix_s for s in raw.samples if s.created_zero) == [50.0, 101.5]


@needs_prometheus
def test_ingest_query_range_cli_stores_a_saved_answer_as_the_live_pull(tmp_path, cli):
    """``prefixscope ingest query-range``: the answer of a REAL Prometheus's
    ``/api/v1/query_range`` (step 1 s), saved to a file, stores the same counter totals as
    pulling the range live with ``ingest prometheus --step``; again adds nothing; a refused
    label is quarantined and printed; a broken file beside it is named and skipped; only broken
    files exit 4."""
    import json
    import urllib.parse
    import urllib.request

    created0 = time.time() - 30.0
    states = [render("metrics_kvevents.txt", created_unix_s=created0),
              render("metrics_kvevents_after_evict.txt", created_unix_s=created0)]
    t_start = time.time() - 2.0
    with ExpositionServer(states[:1]) as srv, PrometheusServer([srv.hostport]) as prom:
        for text in states:
            srv.set_text(text)
            prom.wait_for(f'{Q}{{instance="{srv.hostport}"}}', counter_value(text, Q))
            prom.wait_for(f'{H}{{instance="{srv.hostport}"}}', counter_value(text, H))
            time.sleep(1.5)
        t_end = time.time() + 1.0
        time.sleep(1.2)
        query = urllib.parse.urlencode({"query": series_selector(), "start": f"{t_start:.3f}",
                                        "end": f"{t_end:.3f}", "step": "1s"})
        with urllib.request.urlopen(f"{prom.url}/api/v1/query_range?{query}", timeout=10) as r:
            answer = json.loads(r.read())
        live_db = tmp_path / "live.duckdb"
        code, _, err = cli(["ingest", "prometheus", prom.url, "--start", str(t_start),
                            "--end", str(t_end), "--step", "1s", "--db", live_db])
        assert code == 0, err
    assert answer["status"] == "success" and answer["data"]["resultType"] == "matrix"
    # one series more, with a label no allowlist knows and no HMAC key to digest it: quarantined
    odd = json.loads(json.dumps(next(r for r in answer["data"]["result"]
                                     if r["metric"]["__name__"] == Q)))
    odd["metric"]["customer"] = "acme"
    answer["data"]["result"].append(odd)
    saved = tmp_path / "range.json"
    saved.write_text(json.dumps(answer))
    broken = tmp_path / "broken.json"
    broken.write_text('{"status": "error", "error": "bad query"}')

    db = tmp_path / "saved.duckdb"
    code, out, err = cli(["ingest", "query-range", saved, broken, "--step", "1s", "--json",
                          "--db", db])
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 1 and rows[0]["source"] == str(saved) and rows[0]["kind"] == "prometheus"
    assert rows[0]["rows_added"] > 0 and rows[0]["rows_quarantined"] == 1
    assert [q["field"] for q in rows[0]["quarantined"]] == [Q]  # field: the metric name only
    assert "acme" not in out and "acme" not in err  # quarantine never echoes values
    # line: the sample's ordinal in the answer; the reason names its series and sample
    assert re.search(rf"quarantined {re.escape(str(saved))}:[1-9][0-9]*: {re.escape(Q)}: .*"
                     r"\(series [1-9][0-9]*, sample 1\)", err), err
    assert f"error: {broken}: $.status: not a successful Prometheus API response" in err
    expected = [(srv.hostport, 14272, 30993)]  # both scrapes: docs of test_dashboard_pages
    for d in (db, live_db):
        assert [(r["instance"], r["hit_tokens"], r["query_tokens"]) for r in _totals(str(d))] \
            == expected, d

    code, out, _ = cli(["ingest", "query-range", saved, "--step", "1s", "--db", db])
    assert code == 0 and "0 samples added" in out  # the same file again adds nothing
    code, _, err = cli(["ingest", "query-range", broken, tmp_path / "absent.json", "--db", db])
    assert code == 4 and "nothing could be read" in err and "absent.json" in err
