"""KV residency: vLLM's residency histograms (a real vLLM 0.32 CPU capture with
--kv-cache-metrics, data/vllm-cpu-0.32/metrics_residency.txt) and KV-event lifetimes (the real
KV-event captures), through the real ingest path into a DuckDB file, the queries and the
Residency page (AppTest)."""

from __future__ import annotations

import re

import pytest

from prefixscope.ingest.exposition import ingest_exposition
from prefixscope.ingest.kv_events import ingest_kv_events_file
from prefixscope.store import db as store_db
from prefixscope.store.queries.residency import (
    RESIDENCY_METRICS,
    histogram_quantile,
    kv_event_lifetimes,
    residency_histograms,
)
from tests import dashboard_support as ds


def fmt_s(x):
    """The page's seconds wording (dashboard/views/residency.py runs as a script)."""
    if x < 1:
        return f"{x * 1000:,.0f} ms"
    if x < 120:
        return f"{x:,.1f} s"
    return f"{x / 60:,.1f} min" if x < 7200 else f"{x / 3600:,.1f} h"

CAPTURE = ds.CAPTURES / "metrics_residency.txt"
AT = 1796126600.0


def _exposed(metric: str) -> dict[str, float]:
    """le -> cumulative count, and _sum/_count, read straight from the exposition text."""
    out = {}
    for line in CAPTURE.read_text().splitlines():
        for kind in ("bucket", "sum", "count"):
            if line.startswith(f"{metric}_{kind}{{"):
                le = re.search(r'le="([^"]+)"', line)
                out[le.group(1) if kind == "bucket" else kind] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.fixture(scope="module")
def residency_db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("res") / "res.duckdb")
    ds.build_real_db(path)
    with store_db.writer(path) as con:
        ingest_exposition(con, str(CAPTURE), instance="vllm-cpu-residency", at_unix_s=AT,
                          label_key=None)
        for name in ("kv_events.jsonl", "kv_events_evict.jsonl"):
            ingest_kv_events_file(con, str(ds.CAPTURES / name), instance=ds.KVEVENTS)
    return path


def test_histograms_are_ingested_and_summed_per_bucket(residency_db):
    with store_db.reader(residency_db) as con:
        h = residency_histograms(con)
    assert sorted(h["metric"].unique()) == sorted(RESIDENCY_METRICS)
    for metric in RESIDENCY_METRICS:
        want = _exposed(metric)
        g = h[h["metric"] == metric]
        got = {("+Inf" if le == float("inf") else f"{le:g}"): c
               for le, c in zip(g["le"], g["count"])}
        assert got == {(k if k == "+Inf" else f"{float(k):g}"): v for k, v in want.items()
                       if k not in ("sum", "count")}
        assert g["total"].iloc[0] == want["count"] and g["sum_s"].iloc[0] == pytest.approx(
            want["sum"])
    life = h[h["metric"] == "vllm:kv_block_lifetime_seconds"]
    assert life["total"].iloc[0] > 0  # the capture evicted blocks


def test_a_second_scrape_counts_only_the_increase(tmp_path):
    db = str(tmp_path / "two.duckdb")
    with store_db.writer(db) as con:
        for at in (AT, AT + 60):  # the same cumulative values a minute later: no new evictions
            ingest_exposition(con, str(CAPTURE), instance="r", at_unix_s=at, label_key=None)
        h = residency_histograms(con)
        late = residency_histograms(con, start_s=AT + 30)
    total = _exposed("vllm:kv_block_lifetime_seconds")["count"]
    assert h[h["metric"] == "vllm:kv_block_lifetime_seconds"]["total"].iloc[0] == total
    assert late[late["metric"] == "vllm:kv_block_lifetime_seconds"]["total"].iloc[0] == total
    # (a range holding only the later scrape counts from the server start: one sample)


def test_histogram_quantile_interpolates_like_prometheus():
    import pandas as pd

    b = pd.DataFrame({"le": [1.0, 2.0, 5.0, float("inf")], "count": [0.0, 10.0, 20.0, 20.0]})
    assert histogram_quantile(b, 0.5) == pytest.approx(2.0)  # rank 10: top of (1, 2]
    assert histogram_quantile(b, 0.75) == pytest.approx(3.5)  # rank 15: halfway in (2, 5]
    assert histogram_quantile(b, 0.25) == pytest.approx(1.5)
    assert histogram_quantile(b.assign(count=0.0), 0.5) is None


def test_kv_event_lifetimes_pair_removals_with_their_stores(residency_db):
    with store_db.reader(residency_db) as con:
        row = kv_event_lifetimes(con).iloc[0]
        removed = con.execute("SELECT count(*) FROM kv_events WHERE event_type = 'BlockRemoved'"
                              ).fetchone()[0]
        # the same pairs, by a correlated subquery (the slow way)
        lives = [r[0] for r in con.execute("""
            SELECT r.batch_ts_unix_s - (SELECT max(s.batch_ts_unix_s) FROM kv_events s
                WHERE s.event_type = 'BlockStored' AND s.instance = r.instance
                  AND s.dp_rank = r.dp_rank AND s.block_hash = r.block_hash
                  AND s.batch_ts_unix_s <= r.batch_ts_unix_s)
            FROM kv_events r WHERE r.event_type = 'BlockRemoved'""").fetchall()]
    paired = [x for x in lives if x is not None]
    assert removed > 0 and row["evicted"] + row["unpaired"] == removed
    assert row["evicted"] == len(paired)
    assert row["max_s"] == pytest.approx(max(paired))
    assert row["mean_s"] == pytest.approx(sum(paired) / len(paired))
    assert row["buckets"][-1] == (float("inf"), len(paired))


def test_residency_page_on_real_data(residency_db, use_db):
    at = ds.run_app(use_db(residency_db), "views/residency.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    assert at.title[0].value == "Residency"
    g = None
    with store_db.reader(residency_db) as con:
        h = residency_histograms(con)
        g = h[h["metric"] == "vllm:kv_block_lifetime_seconds"]

    assert ds.metrics(at)["Median block lifetime"] == fmt_s(histogram_quantile(g, 0.5))
    assert ds.chart_count(at) >= 2  # lifetime (histogram + KV events), idle before evict
    assert [b.label for b in at.get("download_button")][:2] == ["CSV", "Parquet"]


def test_residency_page_explains_missing_data(tmp_path, use_db):
    db = ds.build_empty_db(tmp_path / "empty.duckdb")
    at = ds.run_app(use_db(db), "views/residency.py")
    ds.assert_clean(at)
    assert any("--kv-cache-metrics" in i.value for i in at.info)


CAPTURE_RUN = "vllm-cpu-0.32"


@pytest.fixture(scope="module")
def two_sources_db(tmp_path_factory):
    """Production usage on the bs32 instance; the vLLM CPU captures (counters, residency
    histograms, KV events of the kvevents instance) under their own run, as the demo stores
    them; plus KV events of an instance that no run names (production by the rule)."""
    from prefixscope.ingest.usage import ingest_usage_file

    path = str(tmp_path_factory.mktemp("res2") / "two.duckdb")
    with store_db.writer(path) as con:
        ingest_usage_file(con, ds.PROBE_REQUESTS, instance="gpu-a1")
        for name, instance, at in ds.SCRAPES:
            ingest_exposition(con, str(ds.CAPTURES / name), instance=instance, at_unix_s=at,
                              run_id=CAPTURE_RUN)
        ingest_exposition(con, str(CAPTURE), instance=ds.KVEVENTS, at_unix_s=AT,
                          label_key=None, run_id=CAPTURE_RUN)
        for name in ("kv_events.jsonl", "kv_events_evict.jsonl"):
            ingest_kv_events_file(con, str(ds.CAPTURES / name), instance=ds.KVEVENTS)
        con.execute("CHECKPOINT")
    return path


def test_kv_event_lifetimes_follow_the_runs_of_their_instance(two_sources_db, tmp_path):
    with store_db.reader(two_sources_db) as con:
        every = kv_event_lifetimes(con).iloc[0]
        capture = kv_event_lifetimes(con, run_ids=[CAPTURE_RUN]).iloc[0]
        production = kv_event_lifetimes(con, run_ids=[""]).iloc[0]
    assert every["evicted"] > 0
    assert capture["evicted"] == every["evicted"]
    assert capture["buckets"] == every["buckets"]
    assert production["evicted"] == 0 and production["unpaired"] == 0
    # an instance that no run names is production's
    orphan = str(tmp_path / "orphan.duckdb")
    with store_db.writer(orphan) as con:
        ingest_kv_events_file(con, str(ds.CAPTURES / "kv_events_evict.jsonl"),
                              instance="orphan")
    with store_db.reader(orphan) as con:
        alone = kv_event_lifetimes(con).iloc[0]
        assert kv_event_lifetimes(con, run_ids=[""]).iloc[0]["unpaired"] == alone["unpaired"]
        assert kv_event_lifetimes(con, run_ids=["other"]).iloc[0]["unpaired"] == 0
    assert alone["evicted"] + alone["unpaired"] > 0


def test_residency_page_keeps_to_the_picked_run(two_sources_db, use_db):
    db = use_db(two_sources_db)
    at = ds.run_app(db, "views/residency.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    assert at.multiselect(key="filter_runs").value == [""]
    assert "Median block lifetime" not in ds.metrics(at)  # nothing of the capture's
    assert any("No KV residency data in this range" in t for t in ds.texts(at, "info"))

    def pick(a):
        a.radio(key="filter_range").set_value("all")
        a.multiselect(key="filter_runs").set_value([CAPTURE_RUN])

    at = ds.run_app(db, "views/residency.py", setup=pick)
    ds.assert_clean(at)
    with store_db.reader(two_sources_db) as con:
        h = residency_histograms(con, run_ids=[CAPTURE_RUN])
        ev = kv_event_lifetimes(con, run_ids=[CAPTURE_RUN]).iloc[0]
    g = h[h["metric"] == "vllm:kv_block_lifetime_seconds"]
    assert not g.empty and ev["evicted"] > 0
    assert ds.metrics(at)["Median block lifetime"] == fmt_s(histogram_quantile(g, 0.5))
    table = at.dataframe[0].value
    assert table.iloc[-1]["Blocks"] == f"{int(ev['evicted']):,}"


def test_residency_dash_comes_with_its_reason(tmp_path, use_db):
    """KV events only (no residency histograms): the idle and reuse figures read "—" and the
    page says why, under the KPIs."""
    db = str(tmp_path / "events.duckdb")
    with store_db.writer(db) as con:
        for name in ("kv_events.jsonl", "kv_events_evict.jsonl"):
            ingest_kv_events_file(con, str(ds.CAPTURES / name), instance="orphan")
        ev = kv_event_lifetimes(con).iloc[0]
    at = ds.run_app(use_db(db), "views/residency.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    m = ds.metrics(at)
    assert m["Median block lifetime"] == fmt_s(ev["p50_s"])
    assert m["Median idle before eviction"] == "—"
    captions = ds.texts(at, "caption")
    assert any(c.startswith("— no vLLM residency histograms for this run: start vLLM with "
                            "`--kv-cache-metrics`") for c in captions), captions
    assert not any("no KV events" in c for c in captions)


def test_residency_runs_names_the_runs_holding_data(two_sources_db):
    from prefixscope.store.queries.residency import residency_runs

    with store_db.reader(two_sources_db) as con:
        runs = residency_runs(con)
        stored = con.execute("SELECT count(*) FROM kv_events").fetchone()[0]
        samples = con.execute("SELECT count(*) FROM metric_samples WHERE run_id = ? AND metric "
                              "LIKE 'vllm:kv_block_%_seconds_count'", [CAPTURE_RUN]).fetchone()[0]
        none = residency_runs(con, instances=["gpu-a1"])
    assert stored > 0 and samples > 0
    assert runs.to_dict("records") == [
        {"run_id": CAPTURE_RUN, "kv_events": stored, "histogram_samples": samples}]
    assert none.empty  # production's instance holds no residency data


def test_residency_empty_state_names_the_run_that_holds_the_kv_events(two_sources_db, use_db):
    """The demo's case: its KV events belong to the capture run, the sidebar starts on
    production; on the range 'all' the page names the capture run instead of asking to ingest
    what is stored."""
    from prefixscope.store.queries.residency import residency_runs

    db = use_db(two_sources_db)
    at = ds.run_app(db, "views/residency.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    assert at.multiselect(key="filter_runs").value == [""]
    with store_db.reader(two_sources_db) as con:
        r = residency_runs(con).iloc[0]
    infos = ds.texts(at, "info")
    assert len(infos) == 1, infos
    assert infos[0].startswith("No KV residency data in this range for the selected run. ")
    assert (f"Stored outside this selection: {int(r['kv_events']):,} KV events and "
            f"{int(r['histogram_samples']):,} residency histogram samples under the run "
            f"`{CAPTURE_RUN}`. Pick it in the sidebar's **Run** filter") in infos[0]
    assert "ingest its KV events" not in infos[0]
    # picked: the data shows and no pointer elsewhere
    at = ds.run_app(db, "views/residency.py", setup=lambda a: (
        a.radio(key="filter_range").set_value("all"),
        a.multiselect(key="filter_runs").set_value([CAPTURE_RUN])))
    ds.assert_clean(at)
    assert "Median block lifetime" in ds.metrics(at)
    assert not any("Stored outside this selection" in t
                   for t in ds.texts(at, "info") + ds.texts(at, "caption"))


def test_residency_empty_store_still_says_how_to_ingest(tmp_path, use_db):
    db = ds.build_empty_db(tmp_path / "empty.duckdb")
    at = ds.run_app(use_db(db), "views/residency.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    infos = ds.texts(at, "info")
    assert any(i.startswith("No KV residency data in this range.") and "ingest its KV events"
               in i for i in infos), infos
    assert not any("Stored outside" in i for i in infos)


def test_residency_empty_range_points_at_the_data_outside_it(residency_db, use_db):
    """The new-user check of session 11: on the demo's default 7d range the page asked to
    start vLLM with --kv-cache-metrics though 591 KV events were stored (before the range);
    it now says what is stored outside the time range and to widen it."""
    from prefixscope.store.queries.residency import residency_runs

    at = ds.run_app(use_db(residency_db), "views/residency.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("24h"))
    ds.assert_clean(at)
    with store_db.reader(residency_db) as con:
        runs = residency_runs(con)
    events, samples = int(runs["kv_events"].sum()), int(runs["histogram_samples"].sum())
    assert events > 0
    infos = ds.texts(at, "info")
    assert len(infos) == 1, infos
    assert infos[0].startswith("No KV residency data in this range. "), infos
    assert f"{events:,} KV events" in infos[0] and "stored outside this time range" in infos[0]
    assert "**all**" in infos[0] and "--kv-cache-metrics" not in infos[0]
    if samples:
        assert f"{samples:,} residency histogram samples" in infos[0]
