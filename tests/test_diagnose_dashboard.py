"""The Breakers page through Streamlit's AppTest on a database filled by the real
``prefixscope diagnose --ingest`` of the bundled aider capture; the Replay page links to it."""

from __future__ import annotations

import pytest

from tests import dashboard_support as ds
from tests.replay_io_support import AIDER_TRACE

#: The top breaker's hit rate alone fixed (its date replaced by a placeholder; diagnose's
#: JSON what_if.hit_rate of breaker #1 on the aider capture).
ALONE_TOP = "94.4%"


@pytest.fixture(scope="module")
def diag_db(tmp_path_factory):
    from prefixscope.cli import run

    d = tmp_path_factory.mktemp("diag")
    db = str(d / "diag.duckdb")
    assert run(["diagnose", str(AIDER_TRACE), "--out", str(d / "out"), "--ingest", "--db", db,
                "--model", "tiny-llama-random", "--json"]) == 0
    return db


def test_breakers_page_ranks_the_stored_breakers(diag_db, use_db):
    at = ds.run_app(use_db(diag_db), "views/breakers.py")
    ds.assert_clean(at)
    assert [t.value for t in at.title] == ["Breakers"]
    m = ds.metrics(at)
    assert m["Hit rate as recorded"] == "86.9%"
    assert m["With all fixes"] == "93.6%"  # short: not cut at 1280 px (the wording in help)
    assert m["Requests"] == "124"
    table = at.dataframe[0].value
    top = table.iloc[0].to_dict()
    assert (top["Rank"], top["Level"], top["Kind"], top["Where"]) == (
        "1", "1", "timestamp", "message 0 (system), line 5")
    assert top["Requests"] == "17" and top["Fix"] == "move_lines"
    assert top["If only this fixed"] == ALONE_TOP
    assert "Lost tokens per breaker (light: upper bound, not measured)" in ds.charts(at)
    # issue 14 (b): each hit rate says which replay it is, so a reader sees why they differ
    caption = " ".join(ds.texts(at, "caption"))
    assert ("replayed through the exact cache model (block size 16, unbounded capacity): "
            "as recorded 86.9%; with the suggested layout, every fixable breaker fixed by its "
            f"own transform, 93.6%; \"If only this fixed\" is one breaker's span alone made "
            f"to match, e.g. by a placeholder (#1: {ALONE_TOP})") in caption, caption
    assert "The Replay page's runs replay a layout file you chose" in caption
    helps = {m.label: m.proto.help for m in at.metric}
    assert helps["With all fixes"].startswith("If all fixable breakers were fixed: the "
                                              "suggested layout (suggested-layout.yaml")
    assert "unbounded capacity" in helps["Hit rate as recorded"]
    page = " ".join(ds.texts(at, "markdown") + ds.texts(at, "caption") + ds.texts(at, "info"))
    assert "Current date" not in page and "2024-08" not in page


def test_breakers_page_on_an_empty_database(tmp_path, use_db):
    db = ds.build_empty_db(tmp_path / "empty.duckdb")
    at = ds.run_app(use_db(db), "views/breakers.py")
    ds.assert_clean(at)
    assert any("prefixscope diagnose TRACE --ingest" in t for t in ds.texts(at, "info"))


def test_replay_page_links_to_breakers(diag_db, use_db):
    at = ds.run_app(use_db(diag_db), "views/replay.py")
    ds.assert_clean(at)
    links = at.get("page_link")
    assert any("Breakers" in e.proto.label for e in links)
