"""Shared fixtures: an in-memory migrated DuckDB, paths to bundled data, and a CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefixscope.store import db as store_db

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``CI=true`` a skip is a failure (a missing engine, browser or server must never pass
    silently): `make test` installs everything before pytest starts. Only tests marked
    ``may_skip`` (a condition of the interpreter itself, not something to install) may skip."""
    outcome = yield
    report = outcome.get_result()
    if (os.environ.get("CI", "").lower() == "true" and report.skipped
            and not hasattr(report, "wasxfail") and item.get_closest_marker("may_skip") is None):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run every test: {reason}"
