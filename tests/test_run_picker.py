"""The run picker of the pages that show one run or compare chosen runs (issue 14 item 2):
every run listed, newest first, searchable, the newest picked at first; runs never mix by
default (the picked run alone is shown, whole)."""

from __future__ import annotations

import pytest

from prefixscope.dashboard.filters import default_runs, run_option_label
from prefixscope.store import db as store_db
from prefixscope.store.queries.replay import run_list
from tests import dashboard_support as ds


@pytest.fixture(scope="module")
def runs_db(tmp_path_factory):
    """The real captures, the bundled multi-tenant replay and the demo's replay runs, each
    through the normal ingest path."""
    from prefixscope.cli.demo_replay import run_demo_replays
    from prefixscope.cli.demo_scopes import run_demo_scopes

    d = tmp_path_factory.mktemp("runs")
    db = ds.build_real_db(d / "runs.duckdb")
    run_demo_scopes(db, str(d / "scopes"), key=bytes(range(32)))
    run_demo_replays(db, str(d / "replays"))
    return db


def test_run_list_is_newest_first_and_filters(runs_db):
    with store_db.reader(runs_db) as con:
        every = run_list(con)
        sims = run_list(con, kinds=["replay-sim"])
        decided = run_list(con, with_decisions=True)
    made = every["created_unix_s"].tolist()
    assert made == sorted(made, reverse=True) and len(every) == 6
    assert set(sims["kind"]) == {"replay-sim"}
    assert decided["run_id"].tolist() == ["demo-scopes"]


def test_option_labels_and_default():
    assert run_option_label("r1", "aider A", "replay-sim", 1796122800.0) == \
        "aider A · replay-sim · made 2026-12-01 11:00 UTC"
    assert run_option_label("r1", None, None, None) == "r1"
    assert default_runs(["c", "b", "a"], n=2) == ["c", "b"]
    assert default_runs(["c"], n=2) == ["c"]


def test_replay_page_lists_every_run_and_starts_on_the_newest(runs_db, use_db):
    at = ds.run_app(use_db(runs_db), "views/replay.py")
    ds.assert_clean(at)
    picker = at.multiselect(key="replay_runs")
    with store_db.reader(runs_db) as con:
        sims = run_list(con, kinds=["replay-sim", "replay-live"])
    assert len(picker.options) == len(sims) == 6  # all of them, not the newest 8 only
    assert list(picker.value) == sims["run_id"].tolist()[:2]
    assert ds.metrics(at)["Runs shown"] == "2"
    assert picker.placeholder == "Type to search the runs"


@pytest.mark.parametrize("page, key", [("views/scopes.py", "scopes_runs"),
                                       ("views/rejections.py", "rejections_runs"),
                                       ("views/invariants.py", "invariants_runs")])
def test_scope_pages_pick_one_run_by_default(runs_db, use_db, page, key):
    at = ds.run_app(use_db(runs_db), page)
    ds.assert_clean(at)
    picker = at.multiselect(key=key)
    assert list(picker.value) == ["demo-scopes"] and len(picker.options) == 1


def test_picker_selection_survives_a_rerun(runs_db, use_db):
    at = ds.run_app(use_db(runs_db), "views/replay.py")
    picker = at.multiselect(key="replay_runs")
    oldest = picker.options[-1]
    with store_db.reader(runs_db) as con:
        oldest_id = run_list(con, kinds=["replay-sim"])["run_id"].tolist()[-1]
    picker.set_value([oldest_id]).run(timeout=120)
    at.run(timeout=120)  # what the live refresh does: the whole app again
    assert list(at.multiselect(key="replay_runs").value) == [oldest_id]
    assert ds.metrics(at)["Runs shown"] == "1"
    assert oldest.startswith("multi-tenant scope demo")
