"""Requests page with two models: the latency-by-band box plot is one panel per model (pooled,
a slower model's warm requests sat above a faster one's cold ones), and the "any cached block"
count comes with the warm / partial / cold counts by the TTFT bands' rule, from the store's
per-band counts. Real probe capture through the real ingest path, AppTest."""

from __future__ import annotations

import json

import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries.requests import request_latency_quantiles
from prefixscope.dashboard import figures
from tests import dashboard_support as ds

SLOW = "big-model"


@pytest.fixture(scope="module")
def two_models_db(tmp_path_factory):
    """The probe's 31 requests of tiny-llama-random, plus the same requests of a model five
    times slower on another instance, its warm ones only (so pooled, warm reads slowest)."""
    from prefixscope.ingest.usage import ingest_usage_file

    d = tmp_path_factory.mktemp("twomodels")
    path = ds.build_real_db(d / "two.duckdb")
    rows = [json.loads(line) for line in ds.PROBE_REQUESTS.read_text().splitlines() if line]
    warm = [r for r in rows if r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0]
    out = d / "big.jsonl"
    out.write_text("".join(json.dumps({**r, "model": SLOW, "request_id": "big/" + r["request_id"],
                                       "latency_ms": r["latency_ms"] * 5}) + "\n" for r in warm))
    with store_db.writer(path) as con:
        ingest_usage_file(con, out, instance="big-1")
        con.execute("CHECKPOINT")
    return path


def _all(at):
    at.radio(key="filter_range").set_value("all")


def _box(fig):
    return {t["name"].split(" (")[0]: (t["median"][0], t["upperfence"][0]) for t in fig["data"]}


def test_latency_panel_is_split_per_model(two_models_db, use_db):
    at = ds.run_app(use_db(two_models_db), "views/requests.py", setup=_all)
    ds.assert_clean(at)
    charts = ds.charts(at)
    title = "Total latency by cached share"
    panels = sorted(k for k in charts if k.startswith(title))
    assert panels == [f"{title} · {SLOW}",
                      f"{title} · {ds.MODEL}"]
    assert not any(k == f"{title}" for k in charts)
    with store_db.reader(two_models_db) as con:
        for model in (SLOW, ds.MODEL):
            q = request_latency_quantiles(con, column="latency_ms", models=[model])
            fig = charts[f"{title} · {model}"]
            assert _box(fig) == {r["band"]: (pytest.approx(r["p50_ms"]),
                                             pytest.approx(r["p95_ms"]))
                                 for _, r in q.iterrows()}
        pooled = request_latency_quantiles(con, column="latency_ms").set_index("band")
        small = request_latency_quantiles(con, column="latency_ms",
                                          models=[ds.MODEL]).set_index("band")
    # the premise: pooled, warm is slower than cold; per model it is not
    assert pooled.loc["warm", "p50_ms"] > pooled.loc["cold", "p50_ms"]
    assert small.loc["warm", "p50_ms"] < small.loc["cold", "p50_ms"]
    assert any(c.startswith("One panel per model (2 in this selection)")
               for c in ds.texts(at, "caption"))
    # the whisker rule left the titles (cut at 1400 px) for the caption under the panels
    assert sum(c.startswith(figures.BOX_RULE) for c in ds.texts(at, "caption")) == 1


def test_any_cached_block_count_comes_with_band_counts(two_models_db, use_db):
    at = ds.run_app(use_db(two_models_db), "views/requests.py", setup=_all)
    ds.assert_clean(at)
    with store_db.reader(two_models_db) as con:
        q = request_latency_quantiles(con, column="latency_ms").set_index("band")["requests"]
        hits = con.execute("SELECT count(*) FROM requests WHERE cached_tokens > 0").fetchone()[0]
    m = ds.metrics(at)
    assert "Requests with a hit" not in m
    assert m["Requests with any cached block"] == f"{hits:,}"
    text = [t for t in ds.texts(at, "markdown") if t.startswith("By the share of the prompt")]
    assert text == [
        "By the share of the prompt from the cache (the TTFT bands' rule): "
        f"**warm** (≥ 80% cached) {int(q.get('warm', 0)):,} · "
        f"**partial** (10–80% cached) {int(q.get('partial', 0)):,} · "
        f"**cold** (< 10% cached) {int(q.get('cold', 0)):,}, "
        f"of the {int(q.sum()):,} reporting requests with a latency."]
    assert int(q.sum()) == 31 + 16
