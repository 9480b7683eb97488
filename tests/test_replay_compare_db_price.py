"""``replay compare --price-as MODEL`` prices with the database's price table, as the dashboard
does (shadow prices included), before the ``[pricing]`` file (session 5, new-user walk, bug 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "data" / "captures" / "aider" / "chat-requests.jsonl"
LAYOUT = ROOT / "data" / "layouts" / "date-in-first-user.yaml"

PRICES = '''dated = "2026-11"

[models."coder-7b"]
currency = "USD"
input = 0.30
cached_input = 0.03
output = 0.60
shadow = true
source = "shadow price: test price for a hosted 7B model"
'''


@pytest.fixture
def priced_db(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./prefixscope.toml, [pricing] prices_file not present
    (tmp_path / "p.toml").write_text(PRICES)
    db = tmp_path / "p.duckdb"
    code, _, err = cli(["ingest", "prices", tmp_path / "p.toml", "--db", db])
    assert code == 0, err
    (tmp_path / "p.toml").unlink()  # only the database knows the price now
    return db


def _compare(cli, tmp_path, db, *extra):
    return cli(["replay", "compare", TRACE, "--format", "chat", "--layout-b", LAYOUT,
                "--price-as", "coder-7b", "--db", db, "--out", tmp_path / "cmp", *extra])


def test_compare_uses_the_shadow_price_of_the_database(priced_db, cli, tmp_path):
    code, out, err = _compare(cli, tmp_path, priced_db)
    assert code == 0, err
    assert ("cost at the shadow price of coder-7b (shadow price: test price for a hosted 7B "
            "model (table dated 2026-11))") in out
    assert "no price" not in out
    code, out, err = _compare(cli, tmp_path, priced_db, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["price"]["model"] == "coder-7b" and doc["price"]["shadow"] is True
    assert doc["price"]["currency"] == "USD"


def test_unpriced_model_says_where_it_looked(priced_db, cli, tmp_path):
    code, out, err = cli(["replay", "compare", TRACE, "--format", "chat", "--layout-b", LAYOUT,
                          "--price-as", "nobody-1b", "--db", priced_db, "--out", tmp_path / "c2"])
    assert code == 0, err
    assert ("cost: no price for nobody-1b in the database's price table nor in the price file "
            "(give --price-as MODEL, or --prices FILE)") in out
