"""Overview reads the usage log's per-model totals once per render (session 8, issue 17 item
5): with counters present it also needs those totals for models without counters, and the
"Two figures" note needs their sum; one cached call (``data.usage_totals_and_note``) gives
both from one read, with the same figures as reading each. Real captures through the real
ingest path, AppTest."""

from __future__ import annotations

import json

import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries import requests as rq
from tests import dashboard_support as ds

USAGE_ONLY = "gw-model"


@pytest.fixture(scope="module")
def mixed_db(tmp_path_factory):
    """The real counters and probe requests of tiny-llama-random, plus the probe's cold
    requests re-sent as ``gw-model`` on ``gw-1`` (usage log only, no counters)."""
    from prefixscope.ingest.usage import ingest_usage_file

    d = tmp_path_factory.mktemp("usage_read")
    path = ds.build_real_db(d / "mixed.duckdb")
    rows = [json.loads(line) for line in ds.PROBE_REQUESTS.read_text().splitlines() if line]
    out = d / "gw.jsonl"
    out.write_text("".join(json.dumps({**r, "model": USAGE_ONLY,
                                       "request_id": "gw/" + r["request_id"]}) + "\n"
                           for r in rows[:12]))
    with store_db.writer(path) as con:
        assert ingest_usage_file(con, out, instance="gw-1").rows_added == 12
        con.execute("CHECKPOINT")
    return path


def test_note_from_the_by_model_totals_is_the_same(mixed_db):
    with store_db.reader(mixed_db) as con:
        for sel in ({}, {"models": [ds.MODEL]}, {"models": [USAGE_ONLY]},
                    {"start_s": 0.0, "end_s": 1.0}):
            by_model = rq.request_hit_rate_totals(con, by=("model",), **sel)
            alone = rq.counters_and_requests(con, **sel)
            assert rq.counters_and_requests(con, request_totals=by_model, **sel) == alone, sel
        both = rq.counters_and_requests(con)
    assert both["counter_query_tokens"] > 0 and both["request_prompt_tokens"] > 0


def test_overview_reads_the_usage_totals_once(mixed_db, use_db, monkeypatch):
    import streamlit as st

    calls = []
    real = rq.request_hit_rate_totals

    def counted(con, **kw):
        calls.append(tuple(kw.get("by", ())))
        return real(con, **kw)

    monkeypatch.setattr(rq, "request_hit_rate_totals", counted)
    def all_range_then_count(at):
        # the render counted is the second alone, on an empty cache: the first run's reads
        # (and a cache entry whose 15 s TTL runs out between the runs on a loaded machine,
        # which read the totals again) are not this render's
        at.radio(key="filter_range").set_value("all")
        st.cache_data.clear()
        calls.clear()

    st.cache_data.clear()
    at = ds.run_app(use_db(mixed_db), None, setup=all_range_then_count)
    ds.assert_clean(at)
    # the usage-only model's card comes from the usage log, beside the counters' model
    m = ds.metrics(at)
    assert any(k.startswith(f"{USAGE_ONLY} ·") for k in m), m
    assert any(k.startswith(f"{ds.MODEL} ·") for k in m), m
    # one read by model for the cards and the note (was two: by model, and by () for the note)
    assert calls.count(("model",)) == 1 and () not in calls, calls
