"""The stored miss ledger (issue 26 item 6): ``replay fleet --ingest`` and ``diagnose --ingest``
write ``ledger.json`` into the run directory, ``ingest/ledger.py`` stores it in
``ledger_totals`` (safe twice, counts only), the Miss ledger page draws it (AppTest over a real
store and an empty one), and ``largest_loss_by_model`` names the largest loss class."""

from __future__ import annotations

import json
import shutil

import duckdb
import pytest

from prefixscope.store.queries.ledger import CLASS_COLUMNS
from tests import dashboard_support as ds
from tests.replay_io_support import AIDER_TRACE

MODEL = "aider-fleet"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The aider capture replayed on 3 instances under round robin and longest-prefix,
    stored with ``--ingest`` (``--model`` names every request's model); returns (db, json)."""
    from prefixscope.cli import run

    d = tmp_path_factory.mktemp("fleet")
    db = str(d / "fleet.duckdb")
    out = d / "out.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = run(["replay", "fleet", str(AIDER_TRACE), "--instances", "3", "--router",
                    "round-robin,longest-prefix", "--ingest", "--db", db, "--out",
                    str(d / "run"), "--model", MODEL, "--json"])
    assert code == 0, buf.getvalue()
    doc = json.loads(buf.getvalue())
    out.write_text(buf.getvalue())
    return db, doc


def _sums(db: str) -> dict[str, dict[str, int]]:
    con = duckdb.connect(db, read_only=True)
    try:
        rows = con.execute(
            f"SELECT router, sum(prompt_tokens), {', '.join(f'sum({c})' for c in CLASS_COLUMNS)} "
            "FROM ledger_totals GROUP BY router").fetchall()
    finally:
        con.close()
    return {r[0]: dict(zip(("prompt_tokens", *CLASS_COLUMNS), map(int, r[1:]))) for r in rows}


def test_fleet_ingest_stores_each_policys_ledger(fleet):
    db, doc = fleet
    ing = doc["ingested"]
    assert ing["ledger_rows_added"] > 0 and ing["run_id"].startswith("fleet-chat-requests-")
    sums = _sums(db)
    assert set(sums) == {"round-robin", "longest-prefix"}
    for p in doc["policies"]:
        s = sums[p["router"]]
        assert s["prompt_tokens"] == p["prompt_tokens"]
        assert {c: s[f"{c}_tokens"] for c in p["ledger"]} == p["ledger"]
    con = duckdb.connect(db, read_only=True)
    try:
        kind, label = con.execute("SELECT kind, label FROM runs WHERE run_id = ?",
                                  [ing["run_id"]]).fetchone()
        assert kind == "replay-fleet"
        assert label == "chat-requests fleet: 3 instances, round-robin, longest-prefix"
        ranks = dict(con.execute("SELECT DISTINCT router, policy_rank FROM ledger_totals")
                     .fetchall())
        assert ranks == {"round-robin": 0, "longest-prefix": 1}
        assert {r[0] for r in con.execute("SELECT DISTINCT instance FROM ledger_totals")
                .fetchall()} == {"i0", "i1", "i2"}
        assert {r[0] for r in con.execute("SELECT DISTINCT model FROM ledger_totals")
                .fetchall()} == {MODEL}
        assert {r[0] for r in con.execute("SELECT DISTINCT scope FROM ledger_totals")
                .fetchall()} == {"none"}
    finally:
        con.close()


def test_ledger_file_holds_no_prompt_text_and_ingests_once(fleet, tmp_path):
    from prefixscope.ingest.ledger import ingest_ledger_file
    from prefixscope.store import db as store_db

    db, doc = fleet
    path = doc["ingested"]["ledger_file"]
    text = open(path, encoding="utf-8").read()
    for needle in ("Current date", "messages", "You are", str(AIDER_TRACE.parent)):
        assert needle not in text
    copy = str(tmp_path / "copy.duckdb")
    shutil.copyfile(db, copy)
    before = _sums(copy)
    with store_db.writer(copy) as con:
        assert ingest_ledger_file(con, path) == 0  # stored before: nothing added
    assert _sums(copy) == before


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["policies"][0]["rows"][0].update(cold_tokens=1 + d["policies"][0]["rows"][0]
                                                  ["cold_tokens"]), "$.policies[0].rows[0]"),
    (lambda d: d["policies"][0]["rows"][0].update(scope="tenant-acme"),
     "$.policies[0].rows[0].scope"),
    (lambda d: d["policies"][1]["rows"][0].update(requests="7"),
     "$.policies[1].rows[0].requests"),
    (lambda d: d.update(kind="diagnosis"), "$.kind"),
])
def test_ledger_file_with_a_bad_field_is_refused_by_name(fleet, tmp_path, edit, field):
    from prefixscope.core.errors import ConfigError
    from prefixscope.ingest.ledger import ingest_ledger_file
    from prefixscope.store import db as store_db

    _, doc = fleet
    d = json.loads(open(doc["ingested"]["ledger_file"], encoding="utf-8").read())
    edit(d)
    bad = tmp_path / "ledger.json"
    bad.write_text(json.dumps(d))
    db = ds.build_empty_db(tmp_path / "e.duckdb")
    with store_db.writer(db) as con:
        with pytest.raises(ConfigError) as e:
            ingest_ledger_file(con, bad)
        assert field in str(e.value) and "acme" not in str(e.value)
        assert con.execute("SELECT count(*) FROM ledger_totals").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_largest_loss_by_model_is_routing_under_round_robin(fleet):
    from prefixscope.store.queries.ledger import largest_loss_by_model

    db, doc = fleet
    rr = next(p for p in doc["policies"] if p["router"] == "round-robin")
    con = duckdb.connect(db, read_only=True)
    try:
        got = largest_loss_by_model(con, [MODEL, "other"])
        assert largest_loss_by_model(con, []) == {}
    finally:
        con.close()
    assert set(got) == {MODEL}
    g = got[MODEL]
    assert (g["class"], g["router"], g["tokens"]) == ("routing", "round-robin",
                                                       rr["ledger"]["routing"])
    assert g["share_of_missed"] == pytest.approx(rr["routing_share_of_missed"])


def test_diagnose_ingest_stores_the_one_instance_ledger(tmp_path):
    from prefixscope.cli import run

    db = str(tmp_path / "d.duckdb")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run(["diagnose", str(AIDER_TRACE), "--out", str(tmp_path / "out"), "--ingest",
                    "--db", db, "--model", "tiny-llama-random", "--json"]) == 0
    doc = json.loads(buf.getvalue())
    assert doc["ingested"]["ledger_rows_added"] > 0
    assert (tmp_path / "out" / "run" / "ledger.json").is_file()
    s = _sums(db)
    assert set(s) == {"single"}
    assert {c: s["single"][f"{c}_tokens"] for c in doc["ledger"]["classes"]} == \
        doc["ledger"]["classes"]
    assert s["single"]["hit_tokens"] == doc["cached_tokens"]
    con = duckdb.connect(db, read_only=True)
    try:
        runs = con.execute("SELECT DISTINCT l.run_id, r.kind, d.run_id FROM ledger_totals l "
                           "JOIN runs r USING (run_id) JOIN diagnoses d USING (run_id)").fetchall()
        models = con.execute("SELECT DISTINCT model, instance FROM ledger_totals").fetchall()
    finally:
        con.close()
    assert len(runs) == 1 and runs[0][1] == "replay-sim"  # the breakers' run, the same id
    assert models == [("tiny-llama-random", "i0")]


# --- the page -------------------------------------------------------------------------------


def test_miss_ledger_page_draws_both_policies(fleet, use_db):
    db, doc = fleet
    at = ds.run_app(use_db(db), "views/miss_ledger.py")
    ds.assert_clean(at)
    assert [t.value for t in at.title] == ["Miss ledger"]
    charts = ds.charts(at)
    fig = charts["Where the prompt tokens went"]
    traces = fig["data"]
    assert [t["type"] for t in traces] == ["waterfall", "waterfall"]
    assert [t["name"] for t in traces] == ["round-robin", "longest-prefix"]
    by = {p["router"]: p for p in doc["policies"]}
    for t in traces:
        p = by[t["name"]]
        assert t["x"] == ["prompt tokens", "engine granularity", "routing", "capacity",
                          "isolation", "prompt change", "cold", "from cache"]
        assert t["y"][0] == p["prompt_tokens"] and t["y"][-1] == p["cached_tokens"]
        assert t["y"][2] == -p["ledger"]["routing"]
    classes = at.dataframe[0].value
    routing = classes[classes["Class"] == "routing"].iloc[0]
    rr = by["round-robin"]
    assert routing["Tokens · round-robin"] == f"{rr['ledger']['routing']:,}"
    assert routing["Of missed · round-robin"] == f"{100 * rr['routing_share_of_missed']:.1f}%"
    assert routing["Tokens · longest-prefix"] == "0"
    policies = at.dataframe[1].value
    assert list(policies["Router"]) == ["round-robin", "longest-prefix"]
    assert list(policies["Largest loss"])[0] == "routing"
    fixes = at.dataframe[3].value
    top = fixes.iloc[0]
    gain = by["longest-prefix"]["cached_tokens"] - rr["cached_tokens"]
    assert top["Fix"] == "route by longest-prefix instead of round-robin"
    assert top["Tokens recovered"] == f"{gain:,}"
    assert top["Hit rate after"] == f"{100 * by['longest-prefix']['hit_rate']:.1f}%"


def test_miss_ledger_page_picks_one_instance(fleet, use_db):
    db, _ = fleet

    def pick(at):
        ds.switch(at, "views/miss_ledger.py")
        at.run()
        at.selectbox(key="ledger_instance").set_value("i1")

    at = ds.run_app(use_db(db), setup=pick)
    ds.assert_clean(at)
    assert "Where the prompt tokens went (instance i1)" in ds.charts(at)
    inst = at.dataframe[2].value
    assert set(inst["Instance"]) == {"i1"}


def test_miss_ledger_page_on_an_empty_database(tmp_path, use_db):
    db = ds.build_empty_db(tmp_path / "empty.duckdb")
    at = ds.run_app(use_db(db), "views/miss_ledger.py")
    ds.assert_clean(at)
    assert any("prefixscope replay fleet TRACE --ingest" in t and
               "prefixscope diagnose TRACE --ingest" in t for t in ds.texts(at, "info"))


def test_fleet_store_options_need_ingest(cli):
    code, out, err = cli(["replay", "fleet", str(AIDER_TRACE), "--instances", "2",
                          "--model", "m"])
    assert code == 2, (out, err)
    assert "--out, --model and --label name what --ingest stores: add --ingest" in err
    assert "Traceback" not in err


def test_fleet_ingest_text_names_the_page(cli, tmp_path):
    db = str(tmp_path / "t.duckdb")
    code, out, _ = cli(["replay", "fleet", str(AIDER_TRACE), "--instances", "2", "--router",
                        "round-robin", "--ingest", "--db", db, "--out", str(tmp_path / "run")])
    assert code == 0
    assert f"stored in {db}: run fleet-chat-requests-" in out
    assert "ledger rows (Miss ledger page)" in out
    assert (tmp_path / "run" / "ledger.json").is_file()
