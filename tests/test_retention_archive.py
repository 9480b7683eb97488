"""Retention and the Parquet archive (issue 17 item 4, migration 73, ``docs/retention.md``):
archiving old production rows and deleting them, then dropping old rollups, leaves every
request and counter query with exactly the numbers it gave before, for ranges before, across
and after the boundary (random data with counter restarts, late rows archived as a second
generation); re-running archives nothing twice; a ``kill -9`` at any point of a run followed
by a re-run neither loses nor doubles a row; bad input is one ``error:`` line, never a
traceback. Real DuckDB files and Parquet folders throughout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import duckdb
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscope.cli.root import run
from prefixscope.core.times import parse_time
from prefixscope.ingest.usage import save_usage_rows
from prefixscope.store import db as store_db
from prefixscope.store.queries import archive as arc
from prefixscope.store.queries import metrics as mq
from prefixscope.store.queries import requests as rq
from tests.scale_support import END_S, build_deployment

DAY = 86400.0
T0 = 1_790_000_000.0 - 1_790_000_000.0 % DAY  # a UTC midnight (2026-09-21)
Q, H = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def _req(i, ts, model, run_id="", cached=50, prompt=100):
    return (run_id, f"r{i}", "test", i, ts, False, model, "a", "chat", "openai", prompt,
            cached, None, None, 7, 20.0 + i % 7, 90.0 + i % 11, None, None, None)


def _sample(metric, instance, model, t, v):
    labels = json.dumps({"engine": "0", "model_name": model}, separators=(",", ":"))
    return (metric, labels, instance, model, "0", float(t), float(v), metric, False, False, "t")


def _ranges(lo, hi):
    mid = (lo + hi) / 2
    return [(None, None), (lo + 37.0, mid), (mid, None), (lo - DAY, lo + 1.5 * DAY),
            (lo + 2 * DAY + 150, hi - 33.0), (hi - 2 * DAY, hi + DAY)]


def _snapshot(con, lo, hi):
    out = []
    for s, e in _ranges(lo, hi):
        kw = {"start_s": s, "end_s": e}
        out += [rq.request_counts(con, **kw),
                rq.request_hit_rate_totals(con, by=("model",), **kw),
                rq.request_hit_rate_by_window(con, window_s=3600, by=("model",), **kw),
                rq.request_hit_rate_by_window(con, window_s=900, by=(), origin_s=77, **kw),
                rq.request_latency_quantiles(con, **kw),
                rq.newest_requests(con, limit=20, **kw),
                rq.cached_tokens_coverage(con, **kw),
                mq.hit_rate_totals(con, by=("model",), **kw),
                mq.hit_rate_by_window(con, window_s=3600, by=("model", "instance"), **kw),
                mq.hit_rate_by_window(con, window_s=7 * 60, by=(), **kw)]
    return out


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, dict):
            assert x == y
        else:
            pd.testing.assert_frame_equal(x.reset_index(drop=True), y.reset_index(drop=True),
                                          check_dtype=False)


def _archive_all(path, root, before_s, rollup_before_s=None):
    with store_db.writer(path) as con:
        plan = arc.plan_days(con, before_s)
    for item in plan:
        with store_db.writer(path) as con:
            arc.archive_day(con, item.table, parse_time(item.day), str(root))
    if rollup_before_s is not None:
        with store_db.writer(path) as con:
            arc.drop_rollups(con, rollup_before_s)
    return plan


_days = st.integers(3, 6)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(days=_days, data=st.data())
def test_queries_give_the_same_numbers_after_archiving(tmp_path_factory, days, data):
    tmp = tmp_path_factory.mktemp("arc")
    path, root = tmp / "db.duckdb", tmp / "archive"
    n = data.draw(st.integers(10, 120), label="requests")
    times = data.draw(st.lists(st.floats(0, days * DAY - 1), min_size=n, max_size=n), label="t")
    models = data.draw(st.lists(st.sampled_from(["m1", "m/2", None]), min_size=n, max_size=n))
    runs = data.draw(st.lists(st.sampled_from(["", "", "run-1"]), min_size=n, max_size=n))
    rows = [_req(i, T0 + t, m, r, cached=(i * 37) % 101) for i, (t, m, r)
            in enumerate(zip(times, models, runs))]
    samples = []
    for inst, model in (("a", "m1"), ("b", "m/2")):
        q = h = 0.0
        for k in range(int(days * DAY / 1800)):
            if data.draw(st.integers(0, 15), label="restart") == 0:
                q, h = 0.0, 0.0  # a restart: the counters drop
            q += 100 + k % 13
            h += 60 + k % 7
            t = T0 + k * 1800 + data.draw(st.integers(0, 120), label="jitter")
            samples += [_sample(Q, inst, model, t, q), _sample(H, inst, model, t, h)]
    with store_db.writer(path) as con:
        save_usage_rows(con, rows)
        mq.insert_metric_samples(con, samples)
    with store_db.reader(path) as con:
        before = _snapshot(con, T0, T0 + days * DAY)
    cut = T0 + data.draw(st.integers(1, days - 1), label="archive days") * DAY
    roll_cut = T0 + data.draw(st.integers(0, int((cut - T0) / DAY)), label="rollup days") * DAY
    _archive_all(path, root, cut, roll_cut)
    with store_db.reader(path) as con:
        assert con.execute("SELECT count(*) FROM requests WHERE run_id = '' AND ts_unix_s < ?",
                           [cut]).fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM metric_samples WHERE ts_unix_s < ?",
                           [cut]).fetchone()[0] == 0
        assert rq.rollup_current(con) and mq.counter_rollup_current(con)
        _equal(before, _snapshot(con, T0, T0 + days * DAY))
    # rows that arrive late for an archived day: ingested, then archived as generation 1
    late = [_req(10_000 + i, T0 + 3600.0 * i + 5, "m1") for i in range(3)]
    with store_db.writer(path) as con:
        save_usage_rows(con, late)
    with store_db.reader(path) as con:
        with_late = _snapshot(con, T0, T0 + days * DAY)
        assert rq.rollup_current(con)
    _archive_all(path, root, cut, roll_cut)
    with store_db.reader(path) as con:
        assert con.execute("SELECT max(gen) FROM archive_parts WHERE tbl = 'requests' AND "
                           "day = ?::DATE", [time.strftime("%Y-%m-%d", time.gmtime(T0))]
                           ).fetchone()[0] == 1
        _equal(with_late, _snapshot(con, T0, T0 + days * DAY))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """30 days of a generated deployment (3,000 requests, hourly scrapes), kept as a pristine
    copy: each test copies it."""
    p = tmp_path_factory.mktemp("deploy") / "pristine.duckdb"
    build_deployment(p, requests=3000, scrape_s=3600, days=30, instances=3)
    return p


def _copy(deployment, tmp_path):
    dst = tmp_path / "db.duckdb"
    shutil.copy(deployment, dst)
    return dst


def _cli(*args, capsys):
    code = run(list(args))
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err
    return code, cap.out, cap.err


def _all_rows(path):
    """Every production request id and sample key, table and archive together, with counts."""
    with store_db.reader(path) as con:
        r = con.execute(f"SELECT count(*), count(DISTINCT request_id) FROM "
                        f"{arc.relation(con, 'requests')} WHERE run_id = ''").fetchone()
        m = con.execute(f"SELECT count(*), count(DISTINCT (metric, labels, instance, ts_unix_s))"
                        f" FROM {arc.relation(con, 'metric_samples')}").fetchone()
    return r, m


def test_archive_command_is_idempotent_and_keeps_the_numbers(deployment, tmp_path, capsys):
    path = _copy(deployment, tmp_path)
    with store_db.reader(path) as con:
        before = _snapshot(con, END_S - 30 * DAY, END_S)
    code, out, _ = _cli("archive", "--db", str(path), "--to", str(tmp_path / "ark"),
                        "--before", "2026-10-20", "--json", capsys=capsys)
    assert code == 0
    first = json.loads(out)
    assert first["rows"]["requests"] > 0 and first["rows"]["metric_samples"] > 0
    files = sorted(str(p) for p in (tmp_path / "ark").rglob("*.parquet"))
    assert files and all("/day=" in f and "/model=" in f for f in files)
    code, out, _ = _cli("archive", "--db", str(path), "--to", str(tmp_path / "ark"),
                        "--before", "2026-10-20", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["days"] == []
    assert sorted(str(p) for p in (tmp_path / "ark").rglob("*.parquet")) == files
    assert _all_rows(path) == ((3000, 3000), (30 * 24 * 15, 30 * 24 * 15))
    with store_db.reader(path) as con:
        _equal(before, _snapshot(con, END_S - 30 * DAY, END_S))
    code, out, _ = _cli("hitrate", "--db", str(path), "--start", "2026-10-02", "--json",
                        capsys=capsys)
    assert code == 0


# Chunks of at most 150 rows (a day or two of one table), each waiting 0.25 s before it is
# archived, so that every kill delay lands mid-run on a quiet machine too (without it the whole
# archive finished in under 3.5 s and the kill came after the end); the kill lands between
# chunks or inside one.
_KILLER = """
import sys
import time

import prefixscope.store.queries.archive as arc

_archive_range = arc.archive_range


def _slow_archive_range(*args, **kwargs):
    time.sleep(0.25)
    return _archive_range(*args, **kwargs)


arc.archive_range = _slow_archive_range
arc.CHUNK_ROWS = 150  # a chunk of a day or two: many chunks, each committed on its own
from prefixscope.cli.root import main
sys.argv = ["prefixscope", "archive", "--db", sys.argv[1], "--to", sys.argv[2],
            "--before", "2026-10-31"]
main()
"""


@pytest.mark.parametrize("delay_s", [0.8, 2.0, 3.5, 6.0])
def test_kill_9_during_archive_then_rerun_loses_and_doubles_nothing(deployment, tmp_path,
                                                                     capsys, delay_s):
    path = _copy(deployment, tmp_path)
    with store_db.reader(path) as con:
        before = _snapshot(con, END_S - 30 * DAY, END_S)
    want = _all_rows(path)
    proc = subprocess.Popen([sys.executable, "-c", _KILLER, str(path), str(tmp_path / "ark")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL  # killed mid-run, not finished
    assert _all_rows(path) == want  # committed days are in the archive, the rest in the table
    code, _, _ = _cli("archive", "--db", str(path), "--to", str(tmp_path / "ark"),
                      "--before", "2026-10-31", capsys=capsys)
    assert code == 0
    assert _all_rows(path) == want
    with store_db.reader(path) as con:
        assert con.execute("SELECT count(*) FROM requests WHERE ts_unix_s < ?",
                           [END_S - DAY]).fetchone()[0] == 0
        _equal(before, _snapshot(con, END_S - 30 * DAY, END_S))


def test_a_waiting_writer_gets_in_between_chunks(deployment, tmp_path):
    """``prefixscope archive`` holds the write lock per chunk of days and releases it when
    another process waits (``<db>.waiting``): a writer that arrives mid-run gets the file
    while the archive is still running, and the archive then finishes with every row."""
    path = _copy(deployment, tmp_path)
    want = _all_rows(path)
    proc = subprocess.Popen([sys.executable, "-c", _KILLER, str(path), str(tmp_path / "ark")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "ark").rglob("*.parquet")):  # the first chunk's COPY ran
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with store_db.writer(path, lock_timeout_s=20) as con:
            running = proc.poll() is None
            days = con.execute("SELECT count(*) FROM archive_parts").fetchall()[0][0]
            left = con.execute("SELECT count(*) FROM requests WHERE ts_unix_s < ?",
                               [END_S - DAY]).fetchall()[0][0]
        assert running and left > 0  # in between two chunks, not after the end
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert days < 30 * 3
    assert _all_rows(path) == want
    with store_db.reader(path) as con:
        assert con.execute("SELECT count(*) FROM requests WHERE ts_unix_s < ?",
                           [END_S - DAY]).fetchone()[0] == 0


def test_bad_input_is_one_error_line(deployment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _copy(deployment, tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = _cli("archive", "--db", str(path), "--to", str(blocker / "ark"),
                        "--before", "2026-10-20", capsys=capsys)
    assert code != 0 and err.startswith("error: cannot write the archive at ")
    code, _, err = _cli("archive", "--db", str(path), "--to", "ark", "--before", "2099-01-01",
                        capsys=capsys)
    assert code == 2 and "in the future" in err
    code, _, err = _cli("archive", "--db", str(path), capsys=capsys)
    assert code == 2 and "no archive location" in err
    code, _, err = _cli("archive", "--db", str(tmp_path / "none.duckdb"), "--to", "ark",
                        capsys=capsys)
    assert code != 0 and "no database at" in err and not (tmp_path / "none.duckdb").exists()
    empty = tmp_path / "empty.duckdb"
    with store_db.writer(empty):
        pass
    code, out, _ = _cli("archive", "--db", str(empty), "--to", "ark", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["rows"] == {"requests": 0, "metric_samples": 0,
                                                        "gateway_decisions": 0}
    code, _, err = _cli("archive", "--db", str(path), "--to", "ark", "--before", "soon",
                        capsys=capsys)
    assert code == 2 and "cannot read time" in err


def test_foreign_files_are_ignored_and_a_corrupt_archive_file_is_named(deployment, tmp_path,
                                                                        capsys):
    path = _copy(deployment, tmp_path)
    ark = tmp_path / "ark"
    assert _cli("archive", "--db", str(path), "--to", str(ark), "--before", "2026-10-10",
                capsys=capsys)[0] == 0
    want = _all_rows(path)
    # a foreign Parquet file (other columns) inside a partition folder is never read
    part = next((ark / "requests").glob("day=*/model=*"))
    duckdb.sql(f"COPY (SELECT 1 AS foreign_column) TO '{part / 'foreign.parquet'}' "
               "(FORMAT parquet)")
    assert _all_rows(path) == want
    # one of the archived files truncated: queries and the next archive name it
    victim = sorted((ark / "requests").rglob("requests-*.parquet"))[0]
    victim.write_bytes(b"PAR1 not really")
    # a start inside a minute reads that part minute raw (table and archive of its day)
    code, _, err = _cli("hitrate", "--db", str(path), "--source", "requests", "--start",
                        "2026-10-02T00:00:30Z", capsys=capsys)
    assert code != 0 and str(victim) in err and err.startswith("error: archive file ")
    code, _, err = _cli("archive", "--db", str(path), "--to", str(ark), "--before",
                        "2026-10-20", capsys=capsys)
    assert code != 0 and str(victim) in err
    victim.unlink()
    code, _, err = _cli("hitrate", "--db", str(path), "--source", "requests", "--start",
                        "2026-10-02T00:00:30Z", capsys=capsys)
    assert code != 0 and str(victim) in err and "missing" in err


def test_object_storage_secret_sql_and_offline_httpfs_error(deployment, tmp_path, capsys,
                                                            monkeypatch):
    opts = arc.RemoteOptions(region="eu-west-1", endpoint="minio.local:9000", url_style="path",
                             use_ssl=False, key_id="AKIA'X", secret="s3cr3t")
    assert arc.secret_sql("s3://bucket/pre/fix", opts) == (
        "CREATE OR REPLACE TEMPORARY SECRET prefixscope_archive (TYPE s3, PROVIDER config, "
        "KEY_ID 'AKIA''X', SECRET 's3cr3t', REGION 'eu-west-1', ENDPOINT 'minio.local:9000', "
        "URL_STYLE 'path', USE_SSL false, SCOPE 's3://bucket')")
    assert arc.secret_sql("gs://b2/x", arc.RemoteOptions()) == (
        "CREATE OR REPLACE TEMPORARY SECRET prefixscope_archive (TYPE gcs, PROVIDER "
        "credential_chain, SCOPE 'gs://b2')")
    assert arc.secret_sql("https://host/archive", arc.RemoteOptions()) is None
    monkeypatch.setenv("PREFIXSCOPE_S3_KEY_ID", "k")
    monkeypatch.setenv("PREFIXSCOPE_S3_SECRET", "v")
    env_opts = arc.remote_options_from_env(s3_region="us-east-1")
    assert (env_opts.key_id, env_opts.secret, env_opts.region) == ("k", "v", "us-east-1")
    # The secret is accepted by DuckDB's secret manager without httpfs loaded? It needs the
    # extension; with an empty extension folder and an empty repository mirror, loading fails
    # the way it does on a machine without network: one error line saying what to do.
    repo, extdir = tmp_path / "mirror", tmp_path / "extensions"
    repo.mkdir()
    extdir.mkdir()
    cfg = tmp_path / "prefixscope.toml"
    cfg.write_text(f'[retention]\narchive = "s3://bucket/prefixscope"\n'
                   f'extension_directory = "{extdir}"\nextension_repository = "{repo}"\n')
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(cfg))
    path = _copy(deployment, tmp_path)
    code, _, err = _cli("archive", "--db", str(path), "--before", "2026-10-10", capsys=capsys)
    assert code != 0
    assert err.startswith("error: archive s3://bucket/prefixscope: DuckDB's httpfs extension")
    assert "extension_directory" in err and len(err.strip().splitlines()) == 1
    with store_db.reader(path) as con:  # nothing was archived or deleted
        assert con.execute("SELECT count(*) FROM archive_parts").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 3000


def test_a_second_root_is_refused_naming_the_first(deployment, tmp_path, capsys, monkeypatch):
    """docs/retention.md: one archive root per database. After `--to A`, `--to B` is exit 2
    naming A (dry run too) and archives nothing; `--new-root` archives to B; `--to` a file says
    it is a file."""
    monkeypatch.chdir(tmp_path)
    path = _copy(deployment, tmp_path)
    code, out, err = _cli("archive", "--db", str(path), "--to", "A", "--before", "2026-10-10",
                          "--json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["rows"]["requests"] > 0
    with store_db.reader(path) as con:
        assert arc.recorded_roots(con) == [str(tmp_path / "A")]  # absolute
        parts = con.execute("SELECT count(*) FROM archive_parts").fetchone()[0]
    for extra in ((), ("--dry-run",)):
        code, out, err = _cli("archive", "--db", str(path), "--to", "B", "--before",
                              "2026-10-12", *extra, capsys=capsys)
        assert code == 2 and out == ""
        assert err.startswith(f"error: {path} is already archived to {tmp_path / 'A'}: ")
        assert "--new-root" in err
    assert not (tmp_path / "B").exists()
    with store_db.reader(path) as con:
        assert con.execute("SELECT count(*) FROM archive_parts").fetchone()[0] == parts
    # the same root, spelled differently, is the same root
    code, out, err = _cli("archive", "--db", str(path), "--to", f"{tmp_path}/./A/", "--before",
                          "2026-10-11", "--json", capsys=capsys)
    assert code == 0, err
    code, out, err = _cli("archive", "--db", str(path), "--to", "B", "--before", "2026-10-12",
                          "--new-root", "--json", capsys=capsys)
    assert code == 0, err
    assert {d["table"] for d in json.loads(out)["days"]} >= {"requests"}
    assert list((tmp_path / "B").rglob("*.parquet"))
    with store_db.reader(path) as con:
        assert arc.recorded_roots(con) == [str(tmp_path / "A"), str(tmp_path / "B")]
    afile = tmp_path / "afile"
    afile.write_text("")
    code, _, err = _cli("archive", "--db", str(path), "--to", "afile", "--new-root",
                        capsys=capsys)
    assert code == 3 and err.startswith("error: afile is a file, not a folder")
