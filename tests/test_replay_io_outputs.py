"""Replay outputs in production formats, through the real ingest path, and the CLI commands."""

from __future__ import annotations

import json
import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixscope.ingest.prices import load_prices
from prefixscope.ingest.runs import ingest_run_dir
from prefixscope.replay.outputs import CounterEvent, snapshot_counters, snapshot_times
from prefixscope.replay.runner import SimRunSpec, run_compare, run_sim
from prefixscope.store import db as store_db
from prefixscope.store.queries.metrics import cache_config, hit_rate_totals
from prefixscope.store.queries.replay import replay_run_windows, replay_runs
from prefixscope.store.queries.requests import request_hit_rate_totals
from tests.replay_io_support import (
    AIDER_EXCERPT,
    AIDER_TRACE,
    DATA,
    LAYOUT_DATE_FIRST_USER,
    MOONCAKE_CONVERSATION,
    SWE_FUNCTION_CALLING,
    write_lines,
)

T0 = 1_790_000_000.0


@pytest.fixture(scope="module")
def mooncake_run(tmp_path_factory):
    """The first 600 Mooncake conversation requests, B=32, 5,000 blocks (with eviction)."""
    out = tmp_path_factory.mktemp("run")
    spec = SimRunSpec(trace=str(MOONCAKE_CONVERSATION), format="mooncake", block_size=32,
                      capacity_blocks=5000, algo="fast", limit=600, label="mc slice")
    return run_sim(spec, out, run_id="sim-test-mc", t0_unix_s=T0)


def test_usage_lines_have_the_shape_ingest_reads(mooncake_run):
    lines = mooncake_run.usage_path.read_text().splitlines()
    assert len(lines) == 600
    rec = json.loads(lines[1])
    assert set(rec) == {"ts_unix_s", "request_id", "run_id", "instance", "model", "endpoint",
                        "usage"}
    assert rec["ts_unix_s"] == T0 and rec["run_id"] == "sim-test-mc"
    u = rec["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens_details"]["cached_tokens"] % 32 == 0
    s = mooncake_run.summary
    assert s.requests == 600 and s.rejected_requests == 0 and s.evicted_blocks > 0
    tot = [json.loads(x)["usage"] for x in lines]
    assert sum(x["prompt_tokens"] for x in tot) == s.prompt_tokens
    assert sum(x["prompt_tokens_details"]["cached_tokens"] for x in tot) == s.cached_tokens


def test_expositions_parse_with_vllm_names_and_times(mooncake_run):
    assert 2 <= len(mooncake_run.metrics) <= 240
    times = [at for _, at in mooncake_run.metrics]
    assert times == sorted(times) and times[0] > T0
    last_path, last_at = mooncake_run.metrics[-1]
    assert os.stat(last_path).st_mtime == pytest.approx(last_at)
    fams = {f.name: f for f in text_string_to_metric_families(last_path.read_text())}
    q = fams["vllm:prefix_cache_queries"].samples
    total = [x for x in q if x.name.endswith("_total")][0]
    created = fams["vllm:prefix_cache_queries_created"].samples[0]  # 0.0.4: its own gauge
    assert total.labels == {"engine": "0", "model_name": "replay-sim"}
    assert total.value == mooncake_run.summary.prompt_tokens and created.value == T0 - 1
    hits = [x for x in fams["vllm:prefix_cache_hits"].samples if x.name.endswith("_total")][0]
    assert hits.value == mooncake_run.summary.cached_tokens
    info = fams["vllm:cache_config_info"].samples[0]
    assert info.labels["block_size"] == "32" and info.labels["num_gpu_blocks"] == "5000"
    assert info.labels["prefix_caching_hash_algo"] == "sha256"


def test_replay_run_goes_through_the_normal_ingest_path(mooncake_run, con):
    res = ingest_run_dir(con, mooncake_run.out_dir)
    assert res.usage.rows_added == 600 and res.usage.rows_quarantined == 0 and res.run_added
    # per-request view and counter view agree with the simulator
    s = mooncake_run.summary
    req = request_hit_rate_totals(con, run_ids=["sim-test-mc"], by=("run_id",))
    assert int(req.prompt_tokens[0]) == s.prompt_tokens
    assert int(req.cached_tokens[0]) == s.cached_tokens
    met = hit_rate_totals(con, by=("instance",), instances=["sim-test-mc"])
    assert int(met.query_tokens[0]) == s.prompt_tokens and int(met.hit_tokens[0]) == s.cached_tokens
    cfg = cache_config(con, instances=["sim-test-mc"])
    assert int(cfg.block_size[0]) == 32 and int(cfg.num_gpu_blocks[0]) == 5000
    # re-ingesting adds nothing
    again = ingest_run_dir(con, mooncake_run.out_dir)
    assert again.usage.rows_added == 0 and not again.run_added
    assert sum(m.rows_added for m in again.metrics) == 0
    runs = replay_runs(con)
    assert list(runs.run_id) == ["sim-test-mc"] and runs.label[0] == "mc slice"
    assert runs.hit_rate[0] == pytest.approx(s.hit_rate)
    assert json.loads(runs.params_json[0])["capacity_blocks"] == 5000
    assert runs.saved.isna().all()  # replay-sim has no price row


def test_cost_at_a_shadow_price_matches_the_savings_formula(mooncake_run, con):
    ingest_run_dir(con, mooncake_run.out_dir)
    load_prices(con, DATA / "prices.toml")
    runs = replay_runs(con, price_as="tiny-llama-random")
    s = mooncake_run.summary
    # tiny-llama-random: input 0.05, cached 0.0, output 0.08 USD per million tokens
    without = (s.all_prompt_tokens * 0.05 + s.completion_tokens * 0.08) / 1e6
    assert runs.cost_without_cache[0] == pytest.approx(without)
    assert runs.saved[0] == pytest.approx(s.cached_tokens * 0.05 / 1e6)
    assert bool(runs.shadow[0]) and runs.currency[0] == "USD"
    w = replay_run_windows(con, run_ids=["sim-test-mc"], window_s=60)
    assert w.window_start_s.iloc[0] == 0 and int(w.prompt_tokens.sum()) == s.prompt_tokens


def test_rejected_requests_are_reported_never_silently_dropped(tmp_path):
    trace = write_lines(tmp_path / "t.jsonl", [
        {"prompt_token_ids": list(range(40)), "t": 0},
        {"prompt_token_ids": list(range(400)), "t": 1, "request_id": "too-long"},
        {"prompt_token_ids": list(range(40)), "t": 2},
    ])
    res = run_sim(SimRunSpec(trace=str(trace), block_size=16, capacity_blocks=10,
                             output_tokens="0"), tmp_path / "out", t0_unix_s=T0)
    assert res.summary.requests == 3 and res.summary.rejected_requests == 1
    assert res.summary.rejected[0][0] == "too-long"
    assert len(res.usage_path.read_text().splitlines()) == 2
    manifest = json.loads((res.out_dir / "run.json").read_text())
    assert manifest["summary"]["rejected"][0]["request_id"] == "too-long"


def test_snapshot_schedule_is_capped_and_counts_at_admission_and_finish():
    events = [CounterEvent(t, t + 5, 100, 50, 10, True, 0) for t in range(0, 10_000, 10)]
    times = snapshot_times(events, every_s=60, max_snapshots=20)
    assert len(times) <= 21 and times[-1] == 9995
    c = snapshot_counters(events, times)
    assert c[-1].queries == 100_000 and c[-1].requests == 1000 and c[-1].generation == 10_000
    assert all(a.queries <= b.queries for a, b in zip(c, c[1:]))
    skip = [CounterEvent(0, 1, 100, 0, 0, False, 0)]
    assert snapshot_counters(skip, [1])[0].queries == 0  # skip-read: not a query
    assert snapshot_counters(skip, [1])[0].prompt == 100


def test_compare_runs_share_a_time_span(tmp_path):
    res = run_compare(trace=str(AIDER_TRACE), layout_b=str(LAYOUT_DATE_FIRST_USER),
                      out_dir=tmp_path, format="chat", block_size=16, limit=30)
    assert res.a.t0_unix_s == res.b.t0_unix_s
    assert res.a.layout is None and res.b.layout == "date-in-first-user"
    assert (tmp_path / "a" / "run.json").is_file() and (tmp_path / "b" / "run.json").is_file()


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------


def test_cli_replay_sim_json_and_ingest(cli, tmp_path, db_path):
    code, out, err = cli(["replay", "sim", MOONCAKE_CONVERSATION, "--format", "mooncake",
                          "--block-size", "512", "--capacity-blocks", "500", "--algo", "fast",
                          "--limit", "300", "--out", tmp_path / "r", "--label", "cli run",
                          "--ingest", "--db", db_path, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    for key in ("requests", "prompt_tokens", "cached_tokens", "hit_rate", "rejected_requests",
                "capacity_blocks", "block_size"):
        assert key in doc
    assert doc["requests"] == 300 and doc["capacity_blocks"] == 500 and doc["block_size"] == 512
    assert doc["ingested"]["requests_added"] == 300
    with store_db.reader(db_path) as con:
        runs = replay_runs(con)
    assert list(runs.label) == ["cli run"] and int(runs.requests[0]) == 300


def test_cli_bad_lines_are_named_and_strict_stops(cli, tmp_path):
    trace = write_lines(tmp_path / "bad.jsonl", [
        {"prompt_token_ids": [1, 2, 3], "t": 0}, "{oops", {"prompt_token_ids": [1, 2], "t": 1}])
    code, out, err = cli(["replay", "sim", trace, "--out", tmp_path / "o"])
    assert code == 0
    assert f"skipped {trace}:2: not valid JSON" in err.replace("\n", "")
    assert "2 requests" in out
    code, out, err = cli(["replay", "sim", trace, "--strict", "--out", tmp_path / "o2"])
    assert code == 4 and f"error: {trace}:2: not valid JSON" in err.replace("\n", "")


def test_cli_nothing_readable_is_an_error(cli, tmp_path):
    trace = write_lines(tmp_path / "bad.jsonl", [{"prompt_token_ids": "x", "t": 0}])
    code, _, err = cli(["replay", "sim", trace, "--format", "token-ids", "--out", tmp_path / "o"])
    assert code == 4 and "no usable requests" in err


def test_cli_compare_prints_the_difference_and_cost(cli, tmp_path):
    code, out, err = cli(["replay", "compare", AIDER_TRACE, "--layout-b", LAYOUT_DATE_FIRST_USER,
                          "--price-as", "tiny-llama-random", "--prices", DATA / "prices.toml",
                          "--limit", "40", "--out", tmp_path, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["delta"]["cached_tokens"] == doc["b"]["cached_tokens"] - doc["a"]["cached_tokens"]
    assert doc["price"]["shadow"] is True and "saved" in doc["a"]
    code, out, _ = cli(["replay", "compare", AIDER_TRACE, "--limit", "5", "--out", tmp_path / "x"])
    assert code == 2 and out == ""


def test_cli_chat_trace_rebuilds_the_bundled_aider_trace(cli, tmp_path):
    dest = tmp_path / "aider.jsonl"
    code, out, err = cli(["replay", "chat-trace", AIDER_EXCERPT, "--out", dest,
                          "--chats-per-day", "4", "--max-turns", "3",
                          "--max-message-chars", "2000"])
    assert code == 0, err
    assert dest.read_bytes() == AIDER_TRACE.read_bytes()


def test_cli_chat_trace_from_a_swe_agent_trajectory_with_tool_calls(cli, tmp_path):
    dest = tmp_path / "swe.jsonl"
    code, _, err = cli(["replay", "chat-trace", SWE_FUNCTION_CALLING, "--out", dest])
    assert code == 0, err
    lines = [json.loads(x) for x in dest.read_text().splitlines()]
    assert len(lines) == 5
    assert any(m.get("tool_calls") for m in lines[-1]["messages"])
    code, out, err = cli(["replay", "sim", dest, "--format", "chat", "--out", tmp_path / "o",
                          "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["requests"] == 5 and doc["hit_rate"] > 0.5


def test_cli_ingest_replay_run(cli, tmp_path, db_path, mooncake_run):
    code, out, err = cli(["ingest", "replay-run", mooncake_run.out_dir, "--db", db_path])
    assert code == 0, err
    assert "600 requests added" in out
    code, out, _ = cli(["ingest", "replay-run", mooncake_run.out_dir, "--db", db_path, "--json"])
    assert json.loads(out)[0]["requests_added"] == 0


def test_demo_replays_make_and_ingest_five_runs(tmp_path, monkeypatch):
    from prefixscope.cli import demo_replay

    monkeypatch.setattr(demo_replay, "MOONCAKE_REQUESTS", 200)
    db = str(tmp_path / "demo.duckdb")
    with store_db.writer(db):
        pass
    line = demo_replay.run_demo_replays(db, str(tmp_path / "out"))
    assert line.startswith("5 runs")
    with store_db.reader(db) as con:
        runs = replay_runs(con)
    assert len(runs) == 5 and (runs.requests > 0).all()
    aider = runs[runs.run_id.str.startswith("demo-aider")]
    assert aider.first_ts_unix_s.nunique() == 1  # one time placement per trace
    rates = dict(zip(aider.run_id, aider.hit_rate.round(3)))
    assert rates == {"demo-aider-as-recorded": 0.869, "demo-aider-date-at-end": 0.729,
                     "demo-aider-date-in-first-user": 0.936}
