"""Found by a new user trying to break the product: request times outside any plausible range
(quarantined with their field, so no report later fails on them), a report over requests of
which none reported ``cached_tokens``, and Ctrl-C in the middle of an ingest (one line, exit
130, nothing lost or counted twice when run again). Real DuckDB files, real subprocesses."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[1]
PREFIXSCOPE = [str(Path(sys.executable).with_name("prefixscope"))]


def _bench_generate():
    spec = importlib.util.spec_from_file_location("bench_ingest", ROOT / "benchmarks" / "ingest_requests.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.generate


def test_times_outside_1970_to_2100_are_quarantined_with_their_field(cli, db_path, tmp_path):
    f = tmp_path / "u.jsonl"
    usage = '"usage": {"prompt_tokens": 10, "completion_tokens": 1}'
    f.write_text("\n".join([
        '{"id": "a", "created": 1e300, ' + usage + '}',
        '{"id": "b", "created": -1, ' + usage + '}',
        '{"request_id": "c", "ts": "1e20", ' + usage + '}',
        '{"response": {"id": "e", "created": -5, ' + usage + '}}',
        '{"id": "d", "created": 1795960000, ' + usage + '}',
        '{"id": "m", "created": 1795960000123, ' + usage + '}',  # milliseconds: kept
    ]) + "\n")
    code, out, err = cli(["ingest", "requests", f, "--db", db_path])
    assert code == 0, err
    assert "2 requests added" in out and "4 lines quarantined" in out
    for line, field in ((1, "$.created"), (2, "$.created"), (3, "$.ts"), (4, "$.response.created")):
        assert f"quarantined {f}:{line}: {field}: time is outside 1970-01-01 to 2100-01-01 UTC" in err
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        times = sorted(r[0] for r in con.execute("SELECT ts_unix_s FROM requests").fetchall())
    finally:
        con.close()
    assert times == [1795960000.0, 1795960000.123]


def test_report_over_requests_without_cached_tokens_says_no_data(cli, db_path, tmp_path):
    """All requests in range left cached_tokens null: the sums are NULL (pandas NA), which the
    report line used to turn into a TypeError traceback."""
    f = tmp_path / "u.jsonl"
    f.write_text('{"id": "d", "created": 1795960000, "usage": {"prompt_tokens": 10, '
                 '"completion_tokens": 1}}\n')
    assert cli(["ingest", "requests", f, "--db", db_path])[0] == 0
    code, out, err = cli(["report", "--db", db_path, "--start", "2026-11-28", "--end", "2026-12-01"])
    assert code == 0, err
    assert "NO DATA" in out and "Traceback" not in err


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_in_a_large_ingest_is_one_line_and_nothing_is_lost_or_doubled(tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does: the parser processes
    get it too) part-way through; then the same command again completes the file exactly."""
    n = 300_000
    f = tmp_path / "usage.jsonl"
    _bench_generate()(f, n)
    db = tmp_path / "t.duckdb"
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.Popen([*PREFIXSCOPE, "ingest", "requests", str(f), "--db", str(db)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    # Interrupt once the database file exists (the ingest is under way).
    _wait_for(lambda: db.exists() or proc.poll() is not None, 60)
    time.sleep(0.3)
    assert proc.poll() is None, "the ingest finished before the signal: nothing interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C):")
    again = subprocess.run([*PREFIXSCOPE, "ingest", "requests", str(f), "--db", str(db)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    con = duckdb.connect(str(db), read_only=True)
    try:
        total, distinct = con.execute(
            "SELECT count(*), count(DISTINCT request_id) FROM requests").fetchone()
    finally:
        con.close()
    assert (total, distinct) == (n, n)


def test_ctrl_c_stops_a_scrape_loop_with_one_line(tmp_path):
    """``ingest metrics URL --every`` runs until stopped: Ctrl-C ends it with exit 130 and the
    one-line note, no traceback."""
    from tests.metrics_support import ExpositionServer

    text = ('# TYPE vllm:prefix_cache_queries counter\n'
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100\n')
    db = tmp_path / "t.duckdb"
    with ExpositionServer([text]) as server:
        proc = subprocess.Popen([*PREFIXSCOPE, "ingest", "metrics", server.url,
                                 "--every", "0.2", "--db", str(db)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        assert _wait_for(lambda: server.requests >= 2 or proc.poll() is not None, 60)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C):")


@pytest.mark.parametrize(("args", "words"), [
    (["hitrate", "--window", "99999999d"], "duration '99999999d' is longer than 100 years (36500d)"),
    (["hitrate", "--start", "1e300"], "time '1e300' is outside 1970-01-01 to 2100-01-01 UTC"),
    (["hitrate", "--start", "-100000000d"], "time '-100000000d' is outside 1970-01-01 to 2100-01-01 UTC"),
    (["report", "--end", "3000-01-01"], "time '3000-01-01' is outside 1970-01-01 to 2100-01-01 UTC"),
    (["report", "--start", "nan"], "time 'nan' is outside 1970-01-01 to 2100-01-01 UTC"),
    (["report", "daily", "--dry-run", "--date", "9999-12-31"],
     "--date 9999-12-31: use a day from 1970-01-02 to 2099-12-30"),
    (["report", "daily", "--dry-run", "--date", "0001-01-01"],
     "--date 0001-01-01: use a day from 1970-01-02 to 2099-12-30"),
])
def test_times_and_days_outside_the_stored_bound_are_usage_errors(cli, db_path, args, words):
    """Were tracebacks (year 275760 is out of range; date value out of range)."""
    code, _, err = cli([*args, "--db", db_path])
    assert code == 2 and words in err and "Traceback" not in err
