"""Per-request hit rate, coverage and the histogram rows (store/queries/requests.py)."""

from __future__ import annotations

import pytest

from prefixscope.ingest.usage import ingest_usage_file
from prefixscope.core.errors import InvalidArgument
from prefixscope.store.queries import requests as q
from tests.requests_support import write_jsonl


def _reported_rows(con):
    """Every request that reported cached tokens, oldest first, with its hit rate (test-local
    SQL: the store has no per-request query over a whole range, only pages and aggregates)."""
    return con.execute("""
        SELECT request_id, ts_unix_s,
               CAST(cached_tokens AS DOUBLE) / NULLIF(prompt_tokens, 0) AS hit_rate
        FROM requests WHERE cached_tokens IS NOT NULL
        ORDER BY ts_unix_s NULLS LAST, run_id, request_id
    """).df()


def _req(i, ts, prompt, cached, *, model="m1", instance="a", run_id=None, ttft_ms=None):
    rec = {"request_id": f"r{i}", "ts_unix_s": ts, "model": model, "instance": instance,
           "usage": {"prompt_tokens": prompt,
                     "prompt_tokens_details": None if cached is None else {"cached_tokens": cached}}}
    if ttft_ms is not None:
        rec["ttft_ms"] = ttft_ms
    if run_id is not None:
        rec["run_id"] = run_id
    return rec


@pytest.fixture
def loaded(con, tmp_path):
    h = 3600.0
    base = 1_795_003_200.0  # = 498,612 h: aligned to the hour
    write_jsonl(tmp_path / "u.jsonl", [
        _req(1, base + 10, 1000, 900, ttft_ms=10.0),
        _req(2, base + 20, 1000, 0, ttft_ms=100.0),
        _req(3, base + 30, 1000, None, ttft_ms=1.0),  # not reported: not in hit_rate, lowers coverage
        _req(4, base + h + 5, 400, 400, model="m2", instance="b", ttft_ms=20.0),
        _req(5, base + h + 6, 600, 300, model="m2", instance="b"),
    ])
    ingest_usage_file(con, tmp_path / "u.jsonl")
    return con, base


def test_by_window(loaded):
    con, base = loaded
    df = q.request_hit_rate_by_window(con, window_s=3600, by=("model",))
    assert list(df.columns) == ["window_start_s", "window_end_s", "model", "requests",
                                "reported_requests", "prompt_tokens", "reported_prompt_tokens",
                                "cached_tokens", "hit_rate", "coverage"]
    r = df.to_dict("records")
    assert r[0]["window_start_s"] == base and r[0]["window_end_s"] == base + 3600
    assert (r[0]["model"], r[0]["requests"], r[0]["reported_requests"], r[0]["prompt_tokens"],
            r[0]["reported_prompt_tokens"], r[0]["cached_tokens"]) == ("m1", 3, 2, 3000, 2000, 900)
    assert r[0]["hit_rate"] == pytest.approx(0.45)
    assert r[0]["coverage"] == pytest.approx(2 / 3)
    assert (r[1]["model"], r[1]["cached_tokens"], r[1]["hit_rate"]) == ("m2", 700, 0.7)


def test_by_window_origin_and_filters(loaded):
    con, base = loaded
    df = q.request_hit_rate_by_window(con, window_s=7200, by=(), origin_s=base)
    assert len(df) == 1 and df.iloc[0]["requests"] == 5
    df = q.request_hit_rate_by_window(con, window_s=3600, by=("instance",), instances=["b"],
                                      start_s=base + 3600, end_s=base + 3606)
    assert df["requests"].tolist() == [1]  # end is exclusive


def test_totals_and_overall(loaded):
    con, _ = loaded
    t = q.request_hit_rate_totals(con, by=())
    assert (int(t.iloc[0]["cached_tokens"]), int(t.iloc[0]["reported_prompt_tokens"])) == (1600, 3000)
    by = q.request_hit_rate_totals(con, by=("model", "instance"))
    assert by[["model", "instance"]].values.tolist() == [["m1", "a"], ["m2", "b"]]


def test_request_rows_histogram_coverage(loaded):
    con, _ = loaded
    rows = _reported_rows(con)
    assert rows["request_id"].tolist() == ["r1", "r2", "r4", "r5"]
    assert rows["hit_rate"].tolist() == [0.9, 0.0, 1.0, 0.5]
    h = q.request_hit_rate_histogram(con, bins=4)
    assert h.values.tolist() == [[0.0, 0.25, 1], [0.25, 0.5, 0], [0.5, 0.75, 1], [0.75, 1.0, 2]]
    cov = q.cached_tokens_coverage(con)
    assert cov.values.tolist() == [["m1", "a", 3, 2, pytest.approx(2 / 3)], ["m2", "b", 2, 2, 1.0]]


def test_aggregates_replace_per_request_rows(loaded):
    """Counts, quantile bands, latency quantiles and the paged table: small results that agree
    with the per-request rows."""
    con, base = loaded
    rows = _reported_rows(con)
    assert q.request_counts(con) == {"requests": 5, "reported_requests": 4, "hit_requests": 3,
                                     "with_ttft": 3, "with_latency": 0}
    assert q.request_counts(con, start_s=base + 3600) == {
        "requests": 2, "reported_requests": 2, "hit_requests": 2, "with_ttft": 1,
        "with_latency": 0}
    assert q.request_counts(con, start_s=0, end_s=1) == dict.fromkeys(
        ("requests", "reported_requests", "hit_requests", "with_ttft", "with_latency"), 0)
    bands = q.request_hit_rate_bands(con, window_s=3600)
    assert bands[["model", "requests", "p10", "p50", "p90"]].values.tolist() == [
        ["m1", 2, pytest.approx(0.09), pytest.approx(0.45), pytest.approx(0.81)],
        ["m2", 2, pytest.approx(0.55), pytest.approx(0.75), pytest.approx(0.95)]]
    assert bands["window_start_s"].tolist() == [base, base + 3600]
    lat = q.request_latency_quantiles(con, column="ttft_ms")
    # by cached share: 900/1000 and 400/400 warm (>= 80%), 0/1000 cold (< 10%); no partial
    assert lat[["band", "requests", "min_ms", "p50_ms", "max_ms"]].values.tolist() == [
        ["cold", 1, 100.0, 100.0, 100.0], ["warm", 2, 10.0, 15.0, 20.0]]
    assert lat["p25_ms"].tolist() == [100.0, 12.5]
    assert q.request_latency_quantiles(con, column="latency_ms").empty
    with pytest.raises(InvalidArgument):
        q.request_latency_quantiles(con, column="prompt_tokens")
    newest = rows.sort_values("ts_unix_s", ascending=False)["request_id"].tolist()
    assert q.newest_requests(con, limit=2)["request_id"].tolist() == newest[:2]
    assert q.newest_requests(con, limit=2, offset=2)["request_id"].tolist() == newest[2:]
    assert q.newest_requests(con, limit=2, offset=4).empty
    with pytest.raises(InvalidArgument):
        q.newest_requests(con, limit=0)


def test_filter_values_and_flags(loaded, tmp_path):
    con, base = loaded
    v = q.request_filter_values(con)
    assert v == {"models": ["m1", "m2"], "instances": ["a", "b"], "run_ids": [""],
                 "production_instances": ["a", "b"],
                 "min_ts_unix_s": base + 10, "max_ts_unix_s": base + 3606,
                 "production_max_ts_unix_s": base + 3606}
    write_jsonl(tmp_path / "f.jsonl", [{"id": "z", "usage": {"prompt_tokens": 1,
                                                             "prompt_tokens_details": {
                                                                 "cached_tokens": 5}}}])
    ingest_usage_file(con, tmp_path / "f.jsonl")
    assert q.request_flag_counts(con).values.tolist() == [["exclusive-input-suspected", 1]]


def test_empty_database(con):
    assert q.request_hit_rate_by_window(con).empty
    assert q.request_hit_rate_totals(con, by=()).empty
    assert q.request_hit_rate_histogram(con, bins=2)["requests"].tolist() == [0, 0]
    assert q.request_filter_values(con)["max_ts_unix_s"] is None


def test_bad_arguments(con):
    with pytest.raises(InvalidArgument):
        q.request_hit_rate_by_window(con, by=("prompt_tokens; DROP TABLE requests",))
    with pytest.raises(InvalidArgument):
        q.request_hit_rate_by_window(con, window_s=0)
