"""Shared fixtures: an in-memory migrated DuckDB, paths to bundled data, and a CLI runner."""

from __future__ import annotations

import os
import re
import shutil
import time
from datetime import date, datetime, timezone
from pathlib import Path
from typing import NamedTuple

import pytest

from prefixscope.store import db as store_db

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory) -> Path:
    """A DuckDB file with the full schema applied, migrated once per test run (migrating takes
    0.25-1 s; copying the file, about 0.03 s)."""
    path = tmp_path_factory.mktemp("template") / "template.duckdb"
    with store_db.writer(str(path)):
        pass
    return path


@pytest.fixture
def con(migrated_template, tmp_path):
    """A DuckDB with the full schema applied: a private copy of the run's migrated template
    (:func:`migrated_template`), so each test starts from an empty, fully migrated store."""
    import duckdb

    target = tmp_path / "con.duckdb"
    shutil.copyfile(migrated_template, target)
    c = duckdb.connect(str(target))
    yield c
    c.close()


#: The clock of the one demo build of a test run (:func:`demo_build`): 00:30 UTC on the day the
#: run started. The story's week is the seven whole UTC days before that day whatever the hour,
#: so the figures are those of a build at any hour (``make demo`` builds at "now"), and the
#: default 7d range, which ends now, still shows the week.
DEMO_END_S = time.time() // 86400 * 86400 + 1800.0


class DemoBuild(NamedTuple):
    """The demo database built once per test run: its path (read it, never write it: a test
    that writes takes :func:`demo_copy`), the build's report, its clock and the story's release
    day (day 5 of the week, ``YYYY-MM-DD``)."""

    path: str
    report: object
    end_unix_s: float
    release_day: str


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory) -> DemoBuild:
    """The full demo (bundled captures, the replay and scope demos, the story's week), built
    ONCE per test run at :data:`DEMO_END_S` and shared by every test that reads the demo
    (tests/test_demo.py, test_demo_browser.py, test_demo_story_pages.py,
    test_dashboard_tables.py): a build takes 1.5-6 minutes on two cores, and four builds were a
    fifth of the suite's time (issue 30)."""
    from prefixscope.cli.demo import build_demo

    path = tmp_path_factory.mktemp("demo-once") / "demo.duckdb"
    report = build_demo(str(path), end_unix_s=DEMO_END_S)
    line = next(s for s in report.steps if "the week is in the database" in s)
    release_day = re.search(r"\(day 5, (\d{4}-\d\d-\d\d): the release", line).group(1)
    day = datetime.fromtimestamp(DEMO_END_S, tz=timezone.utc).date()
    assert date.fromisoformat(release_day) == date.fromordinal(day.toordinal() - 3)
    return DemoBuild(str(path), report, DEMO_END_S, release_day)


@pytest.fixture
def demo_copy(demo_build, tmp_path) -> str:
    """A private copy of the run's demo database, for a test that writes to it."""
    dest = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_build.path, dest)
    return str(dest)


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
