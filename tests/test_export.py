"""``prefixscope export``: DuckDB COPY of requests, hit-rate windows, breakers and runs to CSV and
Parquet (hive-partitioned by day), on a store built from the real captures through the real
ingest path; read back with DuckDB's own readers."""

from __future__ import annotations

import json

import duckdb
import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries.metrics import hit_rate_by_window
from tests import dashboard_support as ds


def _sql(query: str):
    """A query on a fresh in-memory DuckDB (its file readers read the exported files)."""
    return duckdb.connect().execute(query)


@pytest.fixture(scope="module")
def real_db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("exp") / "real.duckdb")
    ds.build_real_db(path)
    return path


def _requests(db):
    with store_db.reader(db) as con:
        return sorted(con.execute(
            "SELECT request_id, model, instance, prompt_tokens, cached_tokens, ts_unix_s "
            "FROM requests").fetchall())


def test_requests_to_parquet_by_day_read_back_as_one_table(cli, real_db, tmp_path):
    code, out, _ = cli(["export", "requests", "--out", tmp_path, "--db", real_db, "--json"])
    assert code == 0
    (r,) = json.loads(out)["exports"]
    assert r["format"] == "parquet" and r["by_day"] is True and r["rows"] == 31
    assert all("/requests/day=" in f and f.endswith(".parquet") for f in r["files"])
    got = _sql(
        f"SELECT request_id, model, instance, prompt_tokens, cached_tokens, ts_unix_s, day "
        f"FROM read_parquet('{tmp_path}/requests/**/*.parquet', hive_partitioning = true)"
    ).fetchall()
    assert sorted(g[:6] for g in got) == _requests(real_db)
    for g in got:  # the partition is the UTC day of the request time
        assert str(g[6]) == _sql(
            f"SELECT strftime(to_timestamp({g[5]}) AT TIME ZONE 'UTC', '%Y-%m-%d')").fetchone()[0]
    cols = _sql(f"DESCRIBE SELECT * FROM read_parquet('{tmp_path}/requests/**/*.parquet')"
                      ).fetchall()
    assert "request_key" not in {c[0] for c in cols} and "provider" in {c[0] for c in cols}


def test_requests_to_one_csv_and_filters(cli, real_db, tmp_path):
    code, out, _ = cli(["export", "requests", "--format", "csv", "--out", tmp_path, "--db",
                        real_db, "--model", ds.MODEL, "--json"])
    assert code == 0
    (r,) = json.loads(out)["exports"]
    assert r["files"] == [str(tmp_path / "requests.csv")] and r["by_day"] is False
    got = _sql(f"SELECT request_id, model, instance, prompt_tokens, cached_tokens, "
                     f"ts_unix_s FROM read_csv('{tmp_path}/requests.csv', header = true)").fetchall()
    assert sorted(got) == _requests(real_db)
    # a model that is not there exports a header and no rows; the same name again is refused
    code, out, err = cli(["export", "requests", "--format", "csv", "--out", tmp_path, "--db",
                          real_db, "--model", "nope"])
    assert code == 2 and "exists" in err
    code, out, _ = cli(["export", "requests", "--format", "csv", "--out", tmp_path, "--db",
                        real_db, "--model", "nope", "--overwrite", "--json"])
    assert code == 0 and json.loads(out)["exports"][0]["rows"] == 0


def test_hitrate_windows_equal_the_query(cli, real_db, tmp_path):
    code, out, _ = cli(["export", "hitrate", "--window", "1h", "--format", "csv",
                        "--out", tmp_path, "--db", real_db, "--json"])
    assert code == 0
    with store_db.reader(real_db) as con:
        want = hit_rate_by_window(con, window_s=3600, run_ids=[""])
    got = _sql(f"SELECT window_start_s, model, instance, hit_tokens, query_tokens "
                     f"FROM read_csv('{tmp_path}/hitrate.csv', header = true) "
                     "ORDER BY window_start_s, instance").fetchall()
    assert got == [tuple(r) for r in want[["window_start_s", "model", "instance", "hit_tokens",
                                            "query_tokens"]].itertuples(index=False)]
    assert json.loads(out)["exports"][0]["rows"] == len(want) > 0


def test_breakers_and_runs_of_a_real_diagnosis(cli, tmp_path, data_dir):
    db = str(tmp_path / "diag.duckdb")
    code, _, err = cli(["diagnose", data_dir / "captures/aider/chat-requests.jsonl", "--ingest",
                        "--db", db])
    assert code == 0, err
    code, out, _ = cli(["export", "breakers", "runs", "--out", tmp_path / "x", "--db", db,
                        "--json", "--single-file"])
    assert code == 0
    res = {r["table"]: r for r in json.loads(out)["exports"]}
    with store_db.reader(db) as con:
        n_breakers = con.execute("SELECT count(*) FROM breakers").fetchone()[0]
        n_runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    assert res["breakers"]["rows"] == n_breakers > 0 and res["runs"]["rows"] == n_runs > 0
    got = _sql(f"SELECT count(*), count(DISTINCT run_id) FROM "
                     f"read_parquet('{tmp_path}/x/breakers.parquet')").fetchone()
    assert got[0] == n_breakers and got[1] >= 1


def test_bad_arguments(cli, real_db, tmp_path):
    assert cli(["export", "nothing", "--db", real_db, "--out", tmp_path])[0] == 2
    code, _, err = cli(["export", "runs", "--model", "x", "--db", real_db, "--out", tmp_path])
    assert code == 2 and "cannot be filtered by model" in err
    assert cli(["export", "requests", "--format", "xlsx", "--db", real_db,
                "--out", tmp_path])[0] == 2


def test_savings_page_tables_have_download_buttons(real_db, monkeypatch):
    monkeypatch.setenv("PREFIXSCOPE_DB", real_db)
    at = ds.run_app(real_db, "views/savings.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    assert [b.label for b in at.get("download_button")][:2] == ["CSV", "Parquet"]
