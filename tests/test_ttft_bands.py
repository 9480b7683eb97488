"""Issue 14 item 3 (session 5, a): TTFT p50/p90 by the cached share of the prompt, not by
"cached_tokens = 0" (a prefix broken after the first block still caches that block, so the
"miss" line was empty on the demo).

A real DuckDB file built through the real usage-log ingest; the bands and the exact
``quantile_cont`` quantiles are checked against numpy's linear quantile of the same requests,
with requests on every band boundary; then the Requests page through Streamlit's AppTest: the
chart's legend names each band with its rule, one panel per model, and the caption states the
rule; the KPI reads "Requests with cached-token counts" with the field in its help.
"""

from __future__ import annotations

import numpy as np
import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries import serving
from tests import dashboard_support as ds
from tests.requests_support import write_jsonl

T0 = 1795860000.0  # 2026-11-28T10:00:00Z, the start of a 1 h window
#: (cached tokens of a 1,000-token prompt, ttft_ms, the band it belongs to); boundaries:
#: 99 cached = 9.9% is cold, 100 = 10% partial, 799 partial, 800 = 80% warm.
ROWS = [
    (0, 300.0, "cold"), (16, 310.0, "cold"), (99, 330.0, "cold"),
    (100, 150.0, "partial"), (480, 120.0, "partial"), (799, 90.0, "partial"),
    (800, 40.0, "warm"), (928, 35.0, "warm"), (992, 30.0, "warm"), (992, 31.0, "warm"),
]


def _records() -> list[dict]:
    out = []
    for k, (cached, ttft, _band) in enumerate(ROWS):
        out.append({"request_id": f"r{k}", "ts_unix_s": T0 + 60 * k, "model": "m-a",
                    "endpoint": "chat", "ttft_ms": ttft, "latency_ms": ttft + 500,
                    "usage": {"prompt_tokens": 1000, "completion_tokens": 5,
                              "prompt_tokens_details": {"cached_tokens": cached}}})
    # another model in the same window: its own panel, never averaged with m-a
    out.append({"request_id": "b0", "ts_unix_s": T0 + 5, "model": "m-b", "endpoint": "chat",
                "ttft_ms": 9000.0, "latency_ms": 9500.0,
                "usage": {"prompt_tokens": 40000, "completion_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 39936}}})
    # left out: no cached-token count reported; a prompt of 0 tokens
    out.append({"request_id": "x0", "ts_unix_s": T0 + 7, "model": "m-a", "endpoint": "chat",
                "ttft_ms": 5000.0, "usage": {"prompt_tokens": 1000, "completion_tokens": 5}})
    return out


@pytest.fixture(scope="module")
def bands_db(tmp_path_factory) -> str:
    from prefixscope.ingest.usage import ingest_usage_file

    tmp = tmp_path_factory.mktemp("ttft-bands")
    path = tmp / "bands.duckdb"
    log = write_jsonl(tmp / "usage.jsonl", _records())
    with store_db.writer(path) as con:
        ingest_usage_file(con, log, instance="gpu-x")
        con.execute("CHECKPOINT")
    return str(path)


def test_band_sql_and_labels_state_the_rule():
    assert [b for b, _ in serving.TTFT_BANDS] == ["cold", "partial", "warm"]
    assert [serving.ttft_band_label(b) for b, _ in serving.TTFT_BANDS] == [
        "cold (< 10% cached)", "partial (10–80% cached)", "warm (≥ 80% cached)"]
    with pytest.raises(Exception, match="not a TTFT band: 'miss'"):
        serving.ttft_band_label("miss")


def test_bands_as_data_give_the_labels():
    """The store returns each band's parts (session 8); the text is formatted from them by
    core.formatting.fmt_share_band, the same words as before."""
    from prefixscope.core.formatting import fmt_share_band

    assert serving.ttft_bands() == (
        serving.TtftBand("cold", None, 0.10, "cached"),
        serving.TtftBand("partial", 0.10, 0.80, "cached"),
        serving.TtftBand("warm", 0.80, None, "cached"))
    assert serving.ttft_band("partial") == serving.TtftBand("partial", 0.10, 0.80, "cached")
    assert [fmt_share_band(b.low, b.high, b.unit) for b in serving.ttft_bands()] == [
        "< 10% cached", "10–80% cached", "≥ 80% cached"]
    with pytest.raises(Exception, match="not a TTFT band: 'miss'"):
        serving.ttft_band("miss")


def test_bands_by_cached_share_with_exact_quantiles(bands_db):
    with store_db.reader(bands_db) as con:
        df = serving.ttft_by_band_window(con, start_s=T0, end_s=T0 + 3600, window_s=3600)
    got = {(r.model, r.band): r for r in df.itertuples()}
    assert sorted(got) == [("m-a", "cold"), ("m-a", "partial"), ("m-a", "warm"), ("m-b", "warm")]
    assert list(df["band"][df["model"] == "m-a"]) == ["cold", "partial", "warm"]  # rule order
    for band in ("cold", "partial", "warm"):
        ttfts = np.array([t for _, t, b in ROWS if b == band])
        r = got[("m-a", band)]
        assert r.requests == len(ttfts)
        assert r.p50_ms == pytest.approx(float(np.quantile(ttfts, 0.5)))
        assert r.p90_ms == pytest.approx(float(np.quantile(ttfts, 0.9)))
        assert r.window_start_s == T0 and r.window_end_s == T0 + 3600
    assert got[("m-b", "warm")].requests == 1 and got[("m-b", "warm")].p50_ms == 9000.0
    # cold holds what "cached_tokens = 0" missed: 16 and 99 cached tokens are cold too
    assert got[("m-a", "cold")].requests == 3
    with store_db.reader(bands_db) as con:
        both = serving.ttft_by_band_window(con, start_s=None, end_s=None, window_s=3600, by=())
        only_b = serving.ttft_by_band_window(con, start_s=None, end_s=None, window_s=3600,
                                             models=["m-b"])
        with pytest.raises(Exception, match="window_s must be > 0"):
            serving.ttft_by_band_window(con, start_s=None, end_s=None, window_s=0)
    assert int(both.loc[both["band"] == "warm", "requests"].iloc[0]) == 5  # 4 of m-a + 1 of m-b
    assert "model" not in both.columns
    assert only_b["band"].tolist() == ["warm"]


def test_requests_page_draws_the_bands_with_their_rule(bands_db, monkeypatch):
    monkeypatch.setenv("PREFIXSCOPE_DB", bands_db)

    def pick(at):
        at.radio(key="filter_range").set_value("all")

    at = ds.run_app(bands_db, "views/requests.py", setup=pick)
    ds.assert_clean(at)
    assert ds.metrics(at)["Requests with cached-token counts"] == "11"
    kpi = next(m for m in at.metric if m.label == "Requests with cached-token counts")
    assert "usage.prompt_tokens_details.cached_tokens" in kpi.proto.help
    fig = ds.charts(at)["TTFT by cached share (usage log) per 1h window"]
    legend = [t["name"] for t in fig["data"] if t.get("showlegend", True)]
    assert legend == ["cold (< 10% cached)", "partial (10–80% cached)", "warm (≥ 80% cached)"]
    assert len(fig["data"]) == 2 * 4  # p50 and p90 of m-a's three bands and of m-b's warm
    assert fig["layout"]["legend"]["title"]["text"] == "p50 solid, p90 dotted:"
    assert [a["text"] for a in fig["layout"]["annotations"]] == ["m-a", "m-b"]  # panel per model
    p50 = {t["name"]: ds.values(t["y"]) for t in fig["data"]
           if t["line"]["dash"] == "solid" and t["xaxis"] == "x"}
    assert [v for v in p50["cold (< 10% cached)"] if v == v] == [310.0]
    captions = " ".join(ds.texts(at, "caption"))
    assert "cold (< 10% cached), partial (10–80% cached), warm (≥ 80% cached)" in captions
