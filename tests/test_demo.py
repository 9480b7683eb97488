"""`prefixscope demo` (what `make demo` runs) builds the database the README describes."""

from __future__ import annotations

import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries.metrics import hit_rate_totals


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    from prefixscope.cli.demo import build_demo

    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    report = build_demo(str(path))
    return str(path), report


def test_demo_counter_hit_rates_match_the_readme(demo_db):
    path, _ = demo_db
    with store_db.reader(path) as con:
        by_instance = hit_rate_totals(con, by=("instance",)).set_index("instance")
        overall = hit_rate_totals(con, by=("model",), instances=["vllm-cpu-bs32", "vllm-cpu-kvevents"])
    assert by_instance.loc["vllm-cpu-bs32", "hit_tokens"] == 7136
    assert by_instance.loc["vllm-cpu-bs32", "query_tokens"] == 11652
    assert round(by_instance.loc["vllm-cpu-bs32", "hit_rate"], 3) == 0.612
    assert by_instance.loc["vllm-cpu-kvevents", "hit_tokens"] == 14272
    assert by_instance.loc["vllm-cpu-kvevents", "query_tokens"] == 30993
    assert round(by_instance.loc["vllm-cpu-kvevents", "hit_rate"], 3) == 0.460
    row = overall.set_index("model").loc["tiny-llama-random"]
    assert (row["hit_tokens"], row["query_tokens"]) == (21408, 42645)


def test_demo_holds_every_part(demo_db):
    path, report = demo_db
    text = "\n".join(report.steps)
    assert "replay runs: 5 runs" in text
    assert "multi-tenant scope demo" in text
    with store_db.reader(path) as con:
        counts = dict(con.execute(
            "SELECT 'requests', count(*) FROM requests UNION ALL "
            "SELECT 'runs', count(*) FROM runs UNION ALL "
            "SELECT 'kv_events', count(*) FROM kv_events UNION ALL "
            "SELECT 'prices', count(*) FROM prices UNION ALL "
            "SELECT 'gateway_decisions', count(*) FROM gateway_decisions").fetchall())
    assert counts["runs"] >= 6 and counts["requests"] > 6000
    assert counts["kv_events"] > 0 and counts["prices"] > 0 and counts["gateway_decisions"] == 307


def test_demo_report_line(demo_db, cli):
    path, _ = demo_db
    code, out, _ = cli(["report", "--db", path, "--source", "counters"])
    assert code == 0
    assert "tiny-llama-random  21,408 of 42,645 prompt tokens from cache (50%): OK" in out


def test_demo_rebuild_replaces_the_database(demo_db, tmp_path):
    from prefixscope.cli.demo import build_demo

    path, _ = demo_db
    report = build_demo(path, with_replay=False)
    with store_db.reader(path) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 31
    assert report.db_path == path
