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
def use_db(monkeypatch):
    """Point the dashboard (``PREFIXSCOPE_DB``) at a store for this test:
    ``at = run_app(use_db(db), page)``; returns the path it was given."""
    def _use(db: str) -> str:
        monkeypatch.setenv("PREFIXSCOPE_DB", db)
        return db
    return _use


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


def _ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Under ``CI=true`` a module skipped while it is collected (``pytest.skip(...,
    allow_module_level=True)``, ``pytest.importorskip``) is a failure too: such a skip never
    reaches :func:`pytest_runtest_makereport`, so its tests would vanish without a line."""
    outcome = yield
    report = outcome.get_result()
    if _ci() and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"module skipped under CI=true, which must run every test: {reason}"


def pytest_deselected(items):
    """Under ``CI=true`` nothing may be deselected (``-m``, ``-k``, ``--deselect``): CI runs the
    whole suite, so a marker expression left in ``addopts`` or the command fails loudly."""
    if _ci() and items:
        names = ", ".join(i.nodeid for i in items[:5])
        raise pytest.UsageError(
            f"{len(items)} tests deselected under CI=true, which must run every test: {names}"
            + (" ..." if len(items) > 5 else ""))
