"""The Replay dashboard page through Streamlit's AppTest, on runs ingested the normal way."""

from __future__ import annotations

import json

import pytest

from prefixscope.ingest.prices import load_prices
from prefixscope.ingest.runs import ingest_run_dir
from prefixscope.replay.runner import SimRunSpec, run_compare
from prefixscope.store import db as store_db
from tests.dashboard_support import assert_clean, build_empty_db, chart_count, run_app, texts
from tests.replay_io_support import AIDER_TRACE, DATA, LAYOUT_DATE_FIRST_USER, MOONCAKE_CONVERSATION

PAGE = "views/replay.py"


@pytest.fixture(scope="module")
def replay_db(tmp_path_factory):
    d = tmp_path_factory.mktemp("replaydb")
    db = str(d / "r.duckdb")
    cmp = run_compare(trace=str(AIDER_TRACE), layout_b=str(LAYOUT_DATE_FIRST_USER),
                      out_dir=d / "cmp", format="chat", block_size=16, limit=40)
    from prefixscope.replay.runner import run_sim

    mc = run_sim(SimRunSpec(trace=str(MOONCAKE_CONVERSATION), block_size=512,
                            capacity_blocks=400, algo="fast", limit=200, label="mooncake 400"),
                 d / "mc")
    with store_db.writer(db) as con:
        load_prices(con, DATA / "prices.toml")
        for run_dir in (cmp.a.out_dir, cmp.b.out_dir, mc.out_dir):
            ingest_run_dir(con, run_dir)
    return db


def test_replay_page_shows_runs_side_by_side(replay_db, monkeypatch):
    monkeypatch.setenv("PREFIXSCOPE_DB", replay_db)
    at = run_app(replay_db, PAGE)
    assert_clean(at)
    assert at.title[0].value == "Replay"
    # the picker lists every run, newest first, and starts on the two newest
    picker = at.multiselect(key="replay_runs")
    assert len(picker.options) == 3 and picker.options[0].startswith("mooncake 400")
    assert len(picker.value) == 2
    picker.set_value(list(picker.value) + [r for r in _all_runs(replay_db)
                                           if r not in picker.value]).run(timeout=120)
    assert_clean(at)
    table = at.dataframe[0].value
    assert len(table) == 3
    assert set(table["Layout"]) >= {"as recorded", "date-in-first-user"}
    assert any("shadow price" in t for t in texts(at, "info"))
    assert chart_count(at) >= 3  # hit rate bars, cost bars, hit rate over run time
    assert at.selectbox[0].value == "tiny-llama-random"  # the shadow-priced entry by default
    # issue 14 (session 5, b, c): the hit rate is said to be this run's own layout and cache;
    # the key columns come first, costs in a table of their own, kind and id only in the download
    assert list(table.columns[:4]) == ["Run", "Hit rate", "Layout", "Cache"]
    assert set(table["Cache"]) == {"B=16, unbounded", "B=512, 400 blocks"}
    columns = json.loads(at.dataframe[0].proto.columns)
    assert columns["Kind"]["hidden"] and columns["Run id"]["hidden"]
    assert "the run's own layout and cache" in columns["Hit rate"]["help"]
    captions = " ".join(texts(at, "caption"))
    assert ("Hit rate: each run's trace replayed through the exact cache model with the run's "
            "own layout") in captions
    assert "The Breakers page's what-ifs are other replays of the diagnosed trace" in captions
    cost = at.dataframe[1].value
    assert list(cost.columns) == ["Run", "Without cache", "With cache", "Saved", "Price"]
    assert len(cost) == 3 and set(cost["Price"]) == {"shadow"}
    assert all(v.startswith("$") for v in cost["Without cache"])


def test_replay_page_without_runs_explains_how_to_make_one(tmp_path, monkeypatch):
    db = build_empty_db(tmp_path / "empty.duckdb")
    monkeypatch.setenv("PREFIXSCOPE_DB", db)
    at = run_app(db, PAGE)
    assert_clean(at)
    assert any("prefixscope replay sim" in t for t in texts(at, "info"))


def _all_runs(db):
    with store_db.reader(db) as con:
        return [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_unix_s DESC")
                .fetchall()]
