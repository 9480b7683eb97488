"""Counters and the per-request figure of the same traffic, both shown with the reason beside
them wherever they meet (issue 11, item 4).

Real data: the bundled multi-tenant trace (``data/multitenant/trace.jsonl``, the demo's run)
through ``replay gateway``. The counters read 74.9% (641,536 / 856,368) and the per-request
figure 62.1% (641,536 / 1,032,930): the 52 rejected requests are forwarded with
``skip_reading_prefix_cache``, which vLLM leaves out of its prefix-cache counters, while the
per-request figure counts their 176,562 prompt tokens. Before the fix every place showed one of
the two numbers with no word about the other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import dashboard_support as ds

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "data" / "multitenant" / "trace.jsonl"
NOTE = ("counters 641,536 of 856,368 (74.9%), per request 641,536 of 1,032,930 (62.1%): vLLM's "
        "counters leave out the 176,562 prompt tokens of 52 rejected requests (sent with "
        "skip_reading_prefix_cache), the per-request figure counts them")


@pytest.fixture(scope="module")
def gateway_db(tmp_path_factory):
    from prefixscope.cli import run

    d = tmp_path_factory.mktemp("gw")
    key = d / "hmac.key"
    key.write_bytes(bytes(range(32)))
    db = str(d / "gw.duckdb")
    assert run(["replay", "gateway", str(TRACE), "--hmac-key-file", str(key), "--run-id",
                "mt-1", "--db", db, "--out", str(d / "out"), "--json"]) == 0
    return db, d


def test_gateway_replay_prints_both_figures(tmp_path, cli):
    key = tmp_path / "hmac.key"
    key.write_bytes(bytes(range(32)))
    code, out, err = cli(["replay", "gateway", TRACE, "--hmac-key-file", key, "--run-id", "x",
                          "--no-ingest", "--out", tmp_path / "o"])
    assert code == 0, err
    assert "641,536 of 1,032,930 prompt tokens from cache (62.1%)" in out
    assert NOTE in out
    code, out, _ = cli(["replay", "gateway", TRACE, "--hmac-key-file", key, "--run-id", "x",
                        "--no-ingest", "--out", tmp_path / "o2", "--json"])
    doc = json.loads(out)
    assert (doc["counter_cached_tokens"], doc["counter_prompt_tokens"]) == (641_536, 856_368)
    assert (doc["uncounted_requests"], doc["uncounted_prompt_tokens"]) == (52, 176_562)
    assert doc["prompt_tokens"] - doc["uncounted_prompt_tokens"] == doc["counter_prompt_tokens"]


def test_hitrate_and_report_name_both(gateway_db, cli):
    db, _ = gateway_db
    code, out, err = cli(["hitrate", "--db", db, "--run", "mt-1", "--window", "1d"])
    assert code == 0, err
    assert "74.9%" in out and f"note: {NOTE}" in out
    code, out, err = cli(["report", "--db", db, "--run", "mt-1"])
    assert code == 0, err
    assert "641,536 of 856,368 prompt tokens from cache (74.9%): OK" in out
    assert f"note: {NOTE}" in out
    code, out, _ = cli(["report", "--db", db, "--run", "mt-1", "--source", "requests", "--json"])
    doc = json.loads(out)
    assert doc["lines"][-1]["prompt_tokens"] == 1_032_930 and doc["note"] == NOTE


def test_production_without_rejections_has_no_note(gateway_db, cli):
    db, _ = gateway_db
    code, out, _ = cli(["report", "--db", db, "--json"])  # production: no rows, no note
    assert json.loads(out)["note"] is None


def _pick_run(at):
    # the database holds one run only: the sidebar has no Run filter and shows it
    at.radio(key="filter_range").set_value("all")


@pytest.mark.parametrize("page, figure", [("views/overview.py", "74.9%"),
                                          ("views/scopes.py", None)])
def test_dashboard_pages_show_both(gateway_db, monkeypatch, page, figure):
    db, _ = gateway_db
    monkeypatch.setenv("PREFIXSCOPE_DB", db)
    at = ds.run_app(db, page, setup=_pick_run)
    ds.assert_clean(at)
    infos = " ".join(ds.texts(at, "info"))
    assert f"Two figures for this traffic: {NOTE}." in infos
    if figure is not None:  # the whole-range table beside the note
        assert at.dataframe[0].value["Hit rate"].tolist() == [figure]
