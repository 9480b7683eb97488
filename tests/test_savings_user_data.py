"""Savings on a user's own data (issue 28 findings 1 and 2): a usage log whose model is in
ALERT, with no price table or only some models priced, and with requests that did not report
``cached_tokens`` (``prompt_tokens_details: null``).

The store (UTC days, threshold 50%): model ``m-alert`` serves 10 requests a day of 1,000 prompt
tokens; on 2026-01-01..03 each has 800 cached (80%), on 2026-01-04..05 each 200 (20%, ALERT).
On the ALERT days 2 requests a day report no cached tokens (``prompt_tokens_details: null``),
so 16 of 20 report. Model ``m-ok`` (priced when asked) serves 5 requests a day at 90%.

Hand computation of "What the regression cost" for ``m-alert`` (docs/metrics.md
#what-a-regression-cost), reporting requests only: baseline b = 24,000 / 30,000 = 80%; since
2026-01-04: P = 16 x 1,000 = 16,000, C = 16 x 200 = 3,200 (20.0%); X = round(0.8 x 16,000 -
3,200) = 9,600 tokens. Counting the unreported requests' tokens as uncached (the bug) gives
P = 20,000, C = 3,200 (16.0%) and X = 12,800.
"""

from __future__ import annotations

import pytest

from tests import dashboard_support as ds
from tests.requests_support import write_jsonl

DAY0 = 1767225600.0  # 2026-01-01 00:00 UTC


def _records() -> list[dict]:
    out = []
    for d in range(5):
        for k in range(10):
            alert = d >= 3
            usage = {"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010,
                     "prompt_tokens_details": {"cached_tokens": 200 if alert else 800}}
            if alert and k < 2:
                usage["prompt_tokens_details"] = None
            out.append({"request_id": f"a-{d}-{k}", "ts_unix_s": DAY0 + d * 86400 + 3600 + k * 60,
                        "model": "m-alert", "usage": usage})
        for k in range(5):
            out.append({"request_id": f"o-{d}-{k}", "ts_unix_s": DAY0 + d * 86400 + 7200 + k * 60,
                        "model": "m-ok",
                        "usage": {"prompt_tokens": 1000, "completion_tokens": 10,
                                  "total_tokens": 1010,
                                  "prompt_tokens_details": {"cached_tokens": 900}}})
    return out


def _build(path, *, prices: str | None) -> str:
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    log = write_jsonl(path.with_suffix(".jsonl"), _records())
    with store_db.writer(path) as con:
        ingest_usage_file(con, log)
        if prices is not None:
            from prefixscope.ingest.prices import load_prices

            toml = path.with_suffix(".toml")
            toml.write_text(prices, encoding="utf-8")
            load_prices(con, toml)
        con.execute("CHECKPOINT")
    return str(path)


PRICES_SOME = """
[models."m-ok"]
currency = "USD"
input = 1.0
cached_input = 0.1
output = 2.0
source = "list price: example.test 2026-01"
"""

PRICES_ALL = PRICES_SOME + """
[models."m-alert"]
currency = "USD"
input = 1.0
cached_input = 0.5
output = 2.0
source = "list price: example.test 2026-01"
"""


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("savings_user")
    return {"none": _build(d / "none.duckdb", prices=None),
            "some": _build(d / "some.duckdb", prices=PRICES_SOME),
            "all": _build(d / "all.duckdb", prices=PRICES_ALL)}


def _savings(db: str):
    at = ds.run_app(db, "views/savings.py", timeout_s=120)
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("shape", ["none", "some"])
def test_savings_renders_when_the_model_in_alert_has_no_price(stores, use_db, shape):
    """Issue 28 finding 1: no price table, or a price for m-ok only: the page renders (was
    ``TypeError: boolean value of NA is ambiguous`` in price_label) and says "no price"."""
    at = _savings(use_db(stores[shape]))
    assert ds.texts(at, "subheader").count("What the regression cost") == 1
    kpi = ds.metrics(at)
    assert kpi["m-alert: cost since 2026-01-04"] == "no price"
    help_text = [m.proto.help for m in at.metric if m.label == "m-alert: cost since 2026-01-04"]
    assert help_text and "(no price)" in help_text[0], help_text
    assert "Per model" in ds.texts(at, "subheader")  # the rest of the page is drawn


def test_price_label_of_a_missing_price():
    import pandas as pd

    from prefixscope.core.formatting import price_label

    assert price_label(pd.NA, pd.NA) == "no price"
    assert price_label(None, None) == "no price"
    assert price_label(float("nan"), float("nan")) == "no price"
    assert price_label(pd.NA, "list price: x") == "price: list price: x"
    assert price_label(True, pd.NA) == "shadow price: source not given"
    assert price_label(False, "x") == "list price: x"
    assert price_label(True, "shadow price: y") == "shadow price: y"


def test_regression_cost_leaves_unreported_cached_tokens_out(stores, use_db):
    """Issue 28 finding 2: "What the regression cost" counts only the requests that reported
    cached tokens (the coverage rule of every hit rate), by the hand computation in the module
    docstring: 80.0% -> 20.0%, 9,600 tokens, at USD 0.50 per million missed tokens USD
    0.0048 (was 16.0%, 12,800 tokens and USD 0.0064); the coverage is said under it."""
    at = _savings(use_db(stores["all"]))
    kpi = ds.metrics(at)
    assert kpi["Hit rate: before → since"] == "80.0% → 20.0%"
    assert kpi["Tokens recomputed beyond the baseline"] == "9,600"
    assert kpi["m-alert: cost since 2026-01-04"] == "$0.00480"
    captions = ds.texts(at, "caption")
    assert any("m-alert: 16 of 20 requests since 2026-01-04 reported cached tokens (80.0%)" in c
               for c in captions), captions


def test_regression_cost_since_agrees_with_the_store_hit_rate(stores):
    """The "since" hit rate is the store's per-request hit rate of those days (the figure
    Overview, Alerts and ``hitrate`` show), not Σ cached ÷ Σ every prompt."""
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.requests import request_hit_rate_totals

    with store_db.reader(stores["all"]) as con:
        t = request_hit_rate_totals(con, start_s=DAY0 + 3 * 86400, end_s=None,
                                    models=("m-alert",)).iloc[0]
    assert (int(t["requests"]), int(t["reported_requests"])) == (20, 16)
    assert (int(t["reported_prompt_tokens"]), int(t["cached_tokens"])) == (16_000, 3_200)
    assert float(t["hit_rate"]) == pytest.approx(0.2)
