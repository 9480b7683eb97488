"""Overview on a selection where one model has vLLM counters and another only usage-log rows
(a gateway in front of an engine whose /metrics is not scraped): both get a KPI card and a
table row naming their source, the ALERT banner covers the same models and names its source,
and its "Why" points at the Breakers page only when a diagnosis of that model is stored (else
it gives the diagnose command). Real captures through the real ingest path, AppTest."""

from __future__ import annotations

import json
import shutil

import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries.requests import request_hit_rate_totals
from tests import dashboard_support as ds
from tests.replay_io_support import AIDER_TRACE

USAGE_ONLY = "gw-model"


def _fmt_pct(x: float) -> str:
    return f"{x * 100:.1f}%"


@pytest.fixture(scope="module")
def mixed_db(tmp_path_factory):
    """The real counters and probe requests of tiny-llama-random (production), plus the probe's
    cold requests and two warm ones re-sent through a gateway as ``gw-model`` on instance
    ``gw-1`` (no counters for it): about 10% of its prompt tokens from cache, ALERT."""
    from prefixscope.ingest.usage import ingest_usage_file

    d = tmp_path_factory.mktemp("mixed")
    path = ds.build_real_db(d / "mixed.duckdb")
    rows = [json.loads(line) for line in ds.PROBE_REQUESTS.read_text().splitlines() if line]
    cold = [r for r in rows if r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0]
    warm = [r for r in rows if r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0][:2]
    out = d / "gw.jsonl"
    out.write_text("".join(json.dumps({**r, "model": USAGE_ONLY,
                                       "request_id": "gw/" + r["request_id"]}) + "\n"
                           for r in cold + warm))
    with store_db.writer(path) as con:
        ingest_usage_file(con, out, instance="gw-1")
        con.execute("CHECKPOINT")
    return path


def _all(at):
    at.radio(key="filter_range").set_value("all")


def _banner(at, model):
    found = [w for w in ds.texts(at, "warning") if f"**{model} below" in w]
    assert len(found) == 1, ds.texts(at, "warning")
    return found[0]


def test_usage_only_model_gets_its_card_and_source(mixed_db, use_db):
    with store_db.reader(mixed_db) as con:
        t = request_hit_rate_totals(con, by=("model",), models=[USAGE_ONLY]).iloc[0]
    rate = t["cached_tokens"] / t["reported_prompt_tokens"]
    assert rate < 0.5  # the fixture's premise: an ALERT model
    at = ds.run_app(use_db(mixed_db), setup=_all)
    ds.assert_clean(at)
    m = ds.metrics(at)
    assert m[f"{USAGE_ONLY} · whole range"] == _fmt_pct(rate)
    assert f"{ds.MODEL} · whole range" in m  # the counters' model keeps its card
    md = ds.texts(at, "markdown")
    assert any(x.endswith(f"{int(t['cached_tokens']):,} of {int(t['reported_prompt_tokens']):,} "
                          "tokens (usage log)") for x in md), md
    assert any(x.endswith("tokens (vLLM counters)") for x in md), md
    assert any(f"No vLLM counters for `{USAGE_ONLY}` in this selection" in i
               for i in ds.texts(at, "info"))
    table = at.dataframe[0].value
    by_model = dict(zip(table["Model"], table["Source"]))
    assert by_model == {ds.MODEL: "vLLM counters", USAGE_ONLY: "usage log"}
    # the banner covers the model of the card and names its source; no diagnosis stored
    banner = _banner(at, USAGE_ONLY)
    assert "daily hit rate from the usage log:" in banner
    assert f"The whole range reads {_fmt_pct(rate)} (usage log)" in banner
    assert "Why: the Breakers page" not in banner
    assert (f"No diagnosis of `{USAGE_ONLY}` yet: `prefixscope diagnose <log> --model "
            f"{USAGE_ONLY} --ingest` puts one on the Breakers page") in banner


def test_banner_points_at_breakers_once_a_diagnosis_is_stored(mixed_db, use_db, tmp_path):
    from prefixscope.cli import run

    db = str(tmp_path / "diagnosed.duckdb")
    shutil.copy(mixed_db, db)
    assert run(["diagnose", str(AIDER_TRACE), "--out", str(tmp_path / "out"), "--ingest",
                "--db", db, "--model", USAGE_ONLY, "--json"]) == 0
    at = ds.run_app(use_db(db), setup=_all)
    ds.assert_clean(at)
    banner = _banner(at, USAGE_ONLY)
    assert "Why: the Breakers page; the day's report: Alerts." in banner
    assert "No diagnosis" not in banner
