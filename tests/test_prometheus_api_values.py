"""``samples_from_series`` checks every value of a series, not only the first: after the
first kept sample the label rules are taken as settled for the series (same name and labels)
and only the time and value rules run per sample; a sample failing them is quarantined with
``normalise_sample``'s reason, exactly as before that fast path (issue 14, demo build time)."""

from __future__ import annotations

from prefixscope.ingest.prometheus_api import samples_from_series

BASE = {"engine": "0", "model_name": "m", "instance": "x:2", "job": "vllm"}


def test_bad_values_after_a_good_one_are_quarantined_with_their_reason():
    series = [
        {"metric": {"__name__": "vllm:prefix_cache_queries_total", **BASE},
         "values": [[100.0, "10"], [101.0, "-1"], [102.0, "NaN"], [103.0, "+Inf"],
                    [5e9, "40"], [104.0, "oops"], [105.0, "50"]]},
        {"metric": {"__name__": "vllm:kv_cache_usage_perc", **BASE},
         "values": [[100.0, "0.5"], [101.0, "1.5"], [102.0, "0"], [103.0, "-0.1"]]},
        {"metric": {"__name__": "vllm:num_requests_running", **BASE},
         "values": [[100.0, "2"], [101.0, "-3"], [102.0, "NaN"]]},
    ]
    read = samples_from_series(series, location="f.json", default_instance="f")
    got = sorted((s.metric, s.ts_unix_s, s.value) for s in read.samples if not s.created_zero)
    assert got == [("vllm:kv_cache_usage_perc", 100.0, 0.5), ("vllm:kv_cache_usage_perc", 102.0, 0.0),
                   ("vllm:num_requests_running", 100.0, 2.0),
                   ("vllm:num_requests_running", 101.0, -3.0),  # a gauge may be negative
                   ("vllm:prefix_cache_queries_total", 100.0, 10.0),
                   ("vllm:prefix_cache_queries_total", 105.0, 50.0)]
    # each quarantined sample: its ordinal in the answer as line, series and sample in the reason
    assert [(q.line, q.reason) for q in read.problems] == [
        (2, "counter value is negative (series 1, sample 2)"),
        (3, "counter value is not a finite number (series 1, sample 3)"),
        (4, "counter value is not a finite number (series 1, sample 4)"),
        (5, "sample time is outside 1970-01-01 to 2100-01-01 UTC (series 1, sample 5)"),
        (6, "value or time is not a number (series 1, sample 6)"),
        (9, "a fraction outside 0 to 1 (series 2, sample 2)"),
        (11, "a fraction outside 0 to 1 (series 2, sample 4)"),
        (14, "gauge value is not a finite number (series 3, sample 3)")]
