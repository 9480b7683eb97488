"""Every dashboard page on a store whose usage log has no cached counts for one model (vLLM's
default without ``--enable-prompt-tokens-details``) and no counters at all: no exception, no
"None"/"nan"/"<NA>" text, and the missing count shown as "not reported", never as 0.

Two requests (the new user's ``hostile/na.jsonl``): plain-a 1,500 of 2,000 prompt tokens cached,
plain-b 2,000 prompt tokens and no ``prompt_tokens_details``.
"""

from __future__ import annotations

import json
import re

import pytest

from tests import dashboard_support as ds

ALL_PAGES = [p[0] for p in ds.page_entries()]
ROWS = [
    {"id": "n1", "model": "plain-a", "created": 1796100000,
     "usage": {"prompt_tokens": 2000, "completion_tokens": 1,
               "prompt_tokens_details": {"cached_tokens": 1500}}},
    {"id": "n2", "model": "plain-b", "created": 1796100001,
     "usage": {"prompt_tokens": 2000, "completion_tokens": 1}},
]
BAD = re.compile(r"\bNone\b|\bnan\b|<NA>|\bNaN\b")


@pytest.fixture(scope="module")
def na_db(tmp_path_factory) -> str:
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    d = tmp_path_factory.mktemp("na")
    log = d / "na.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    path = d / "na.duckdb"
    with store_db.writer(path) as con:
        summary = ingest_usage_file(con, log)
        con.execute("CHECKPOINT")
    assert summary.rows_inserted == 2 if hasattr(summary, "rows_inserted") else True
    return str(path)


def _all_text(at) -> list[str]:
    out = []
    for kind in ("markdown", "caption", "info", "warning", "metric", "text", "subheader",
                 "title", "header"):
        for e in getattr(at, kind):
            out.append(str(e.value))
            if kind == "metric":
                out.append(str(e.label))
    for df in at.dataframe:
        frame = df.value
        out += [str(c) for c in frame.columns]
        out += [str(v) for v in frame.astype(str).to_numpy().ravel()]
    for t in at.table:
        frame = t.value
        out += [str(v) for v in frame.astype(str).to_numpy().ravel()]
    return out


@pytest.mark.parametrize("page", ALL_PAGES)
def test_every_page_renders_without_cached_counts(na_db, use_db, page):
    at = ds.run_app(use_db(na_db), page,
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    assert at.title, f"{page} drew no title"
    bad = [t for t in _all_text(at) if BAD.search(t)]
    assert not bad, bad


def test_overview_says_not_reported(na_db, use_db):
    at = ds.run_app(use_db(na_db), "views/overview.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    text = " ".join(_all_text(at))
    assert "not reported" in text
    assert "plain-a" in text and "plain-b" in text


def test_requests_says_not_reported(na_db, use_db):
    at = ds.run_app(use_db(na_db), "views/requests.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    text = " ".join(_all_text(at))
    assert "plain-b: cached tokens not reported by 1 of 1 requests (0.0% reported)" in text, text
    assert "plain-b / None" not in text


@pytest.fixture(scope="module")
def mixed_db(tmp_path_factory) -> str:
    """The bundled vLLM captures (counters, 31 probe requests) plus the two requests above:
    counters for one model, usage with and without cached counts for two others."""
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    d = tmp_path_factory.mktemp("mixed")
    path = ds.build_real_db(d / "mixed.duckdb")
    log = d / "na.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    with store_db.writer(path) as con:
        ingest_usage_file(con, log)
        con.execute("CHECKPOINT")
    return path


@pytest.mark.parametrize("page", ALL_PAGES)
def test_every_page_renders_with_counters_and_unreported_usage(mixed_db, use_db, page):
    at = ds.run_app(use_db(mixed_db), page,
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    bad = [t for t in _all_text(at) if BAD.search(t)]
    assert not bad, bad
