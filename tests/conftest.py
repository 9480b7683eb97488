"""Shared fixtures: an in-memory migrated DuckDB, paths to bundled data, and a CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import db as store_db

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


@pytest.fixture
def con():
    """An in-memory DuckDB with the full schema applied."""
    c = store_db.memory()
    yield c
    c.close()


@pytest.fixture
def data_dir() -> Path:
    """The repository's ``data/`` folder (bundled real captures and traces)."""
    return DATA


@pytest.fixture
def db_path(tmp_path) -> str:
    """A path for a fresh DuckDB file in a temporary folder."""
    return str(tmp_path / "test.duckdb")


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: ``code, out, err = cli(["hitrate", "--json"])``."""
    from prefixscope.cli import run

    def _run(args):
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run
