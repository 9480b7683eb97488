"""Data sources on files ingested from a long folder (the new user's ``/tmp/newuser8.YXCj/
hostile/...``, session 8): the file name is the first column of the Sources table and of the
Quarantine's "Where" (``name:line``), the folder its own last column, so a long folder no
longer cuts every row to the same ``/tmp/newuser8.YXCj/hostile,``."""

from __future__ import annotations

import json

from tests import dashboard_support as ds
from tests.hostile.support import fresh_db, run_cli


def test_file_names_first_folder_last(tmp_path, use_db):
    folder = tmp_path / ("a-long-folder-name-" * 4) / "hostile"
    folder.mkdir(parents=True)
    good = {"ts": 1_796_000_000.0, "model": "tiny", "request_id": "r1",
            "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 40}}}
    (folder / "nan.jsonl").write_text(json.dumps(good) + "\n{not json\n")
    (folder / "deep.jsonl").write_text("[" * 100 + "]" * 100 + "\n")
    db = fresh_db(tmp_path)
    for name in ("nan.jsonl", "deep.jsonl"):
        code, out, err = run_cli(["ingest", "requests", str(folder / name), "--db", db])
        assert code in (0, 4), (out, err)
    at = ds.run_app(use_db(db), "views/data_sources.py")
    ds.assert_clean(at)
    sources, quarantine = at.dataframe[0].value, at.dataframe[1].value
    assert list(sources.columns)[:2] == ["Source", "Kind"]
    assert sorted(sources["Source"]) == ["deep.jsonl", "nan.jsonl"]
    assert set(sources["Folder"]) == {str(folder)}
    assert list(quarantine.columns)[0] == "Where" and list(quarantine.columns)[-1] == "Folder"
    assert sorted(quarantine["Where"]) == ["deep.jsonl:1", "nan.jsonl:2"]
    assert set(quarantine["Folder"]) == {str(folder)}
