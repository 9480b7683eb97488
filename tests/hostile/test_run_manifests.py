"""``ingest replay-run DIR`` on a ``run.json`` of the wrong shape (hand-edited, or not a replay
run's): each is refused with ``run.json: $.field: reason`` (exit 2, as a manifest that is not
JSON), never a ``KeyError``/``TypeError`` traceback; a FIFO ``run.json`` and a missing folder are
called what they are (were "no run.json"). Through the real CLI on real folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hostile.support import fresh_db, run_cli

CASES = [
    ("not-object", "[1]", "$", "not a JSON object (a replay run manifest)"),
    ("no-run-id", '{"a": 1}', "$.run_id", "missing or empty"),
    ("run-id-bool", '{"run_id": true}', "$.run_id", "missing or empty"),
    ("files-list", '{"run_id": "r", "files": []}', "$.files", "not an object"),
    ("params-number", '{"run_id": "r", "params": 3}', "$.params", "not an object"),
    ("model-number", '{"run_id": "r", "model": 3}', "$.model", "not text"),
    ("metric-no-time", '{"run_id": "r", "files": {"metrics": [{"path": "m.prom"}]}}',
     "$.files.metrics[0].at_unix_s", "missing or not a finite number"),
    ("metric-not-object", '{"run_id": "r", "files": {"metrics": [3]}}',
     "$.files.metrics[0]", "not an object"),
    ("usage-number", '{"run_id": "r", "files": {"usage": 3}}', "$.files.usage",
     "not text (a file name)"),
]


@pytest.mark.parametrize("case,text,fld,reason", CASES, ids=[c[0] for c in CASES])
def test_manifest_of_the_wrong_shape_names_the_field(tmp_path: Path, case, text, fld, reason):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(text)
    (run / "requests.jsonl").write_text("")
    code, out, err = run_cli(["ingest", "replay-run", str(run), "--db", fresh_db(tmp_path)])
    assert code == 2, err
    assert f"error: {run / 'run.json'}: {fld}: {reason}" in err, err


def test_fifo_manifest_and_missing_folder_are_named(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "run.json")
    code, _, err = run_cli(["ingest", "replay-run", str(run), "--db", fresh_db(tmp_path)])
    assert code == 3 and "not a regular file: it is a FIFO (named pipe)" in err, err
    code, _, err = run_cli(["ingest", "replay-run", str(tmp_path / "gone"), "--db",
                            str(tmp_path / "x.duckdb")])
    assert code == 3 and f"error: {tmp_path / 'gone'}: no such folder" in err, err


LIVE_CASES = [
    ("not-object", "[1]", "$", "not a JSON object (a live replay run manifest)"),
    ("params-number", '{"run_id": "r", "instance": "i", "params": 3}', "$.params",
     "not an object"),
    ("ts-text", '{"run_id": "r", "instance": "i", "before_ts_unix_s": "x", '
     '"after_ts_unix_s": 2}', "$.before_ts_unix_s", "not a finite number"),
    ("deltas-number", '{"run_id": "r", "instance": "i", "before_ts_unix_s": 1, '
     '"after_ts_unix_s": 2, "deltas": 5}', "$.deltas", "not an object"),
    ("delta-text", '{"run_id": "r", "instance": "i", "before_ts_unix_s": 1, '
     '"after_ts_unix_s": 2, "deltas": {"vllm:x": "y"}}', "$.deltas",
     "entry 1 is not a finite number"),
    ("label-number", '{"run_id": "r", "instance": "i", "params": {"label": 3}}',
     "$.params.label", "not text"),
]


@pytest.mark.parametrize("case,text,fld,reason", LIVE_CASES, ids=[c[0] for c in LIVE_CASES])
def test_live_run_manifest_of_the_wrong_shape_names_the_field(tmp_path: Path, case, text, fld,
                                                              reason):
    """``ingest live-run DIR``: was an AttributeError / ValueError traceback."""
    run = tmp_path / "live"
    run.mkdir()
    (run / "run.json").write_text(text)
    (run / "requests.jsonl").write_text("")
    code, out, err = run_cli(["ingest", "live-run", str(run), "--db", fresh_db(tmp_path)])
    assert code == 4, err
    assert f"error: {run / 'run.json'}: {fld}: {reason}" in err, err


def test_live_run_fifo_manifest_and_missing_folder_are_named(tmp_path: Path):
    run = tmp_path / "live"
    run.mkdir()
    os.mkfifo(run / "run.json")
    code, _, err = run_cli(["ingest", "live-run", str(run), "--db", fresh_db(tmp_path)])
    assert code == 3 and "not a regular file: it is a FIFO (named pipe)" in err, err
    code, _, err = run_cli(["ingest", "live-run", str(tmp_path / "gone"), "--db",
                            str(tmp_path / "x.duckdb")])
    assert code == 3 and f"error: {tmp_path / 'gone'}: no such folder" in err, err
