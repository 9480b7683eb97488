"""Issue 27 #5: a Langfuse or LiteLLM API answer saved as returned (``curl > obs.json``: one
line, ``{"data": [...], "meta": {...}}``) loads as the same document pretty-printed does; so do
API pages appended one after another, and JSON lines whose first line is longer than the format
sniff once read (4 KiB). Real DuckDB files, the real CLI, the bundled real-shaped samples."""

from __future__ import annotations

import json

from tests.test_litellm_langfuse_ingest import _rows

META = {"page": 1, "limit": 50, "totalItems": 3, "totalPages": 1}


def _observations(data_dir) -> list[dict]:
    return json.loads((data_dir / "langfuse/observations.json").read_text())["data"]


def _spendlogs(data_dir) -> list[dict]:
    return [json.loads(ln) for ln in
            (data_dir / "litellm/spendlogs.jsonl").read_text().splitlines() if ln.strip()]


def _ingest(cli, command, path, db):
    code, out, err = cli(["ingest", command, path, "--db", db, "--json"])
    assert code == 0, err
    return json.loads(out)["files"][0]


def test_langfuse_api_answer_on_one_line_loads_like_the_pretty_one(cli, tmp_path, data_dir):
    pretty = tmp_path / "pretty.duckdb"
    _ingest(cli, "langfuse", data_dir / "langfuse/observations.json", pretty)
    saved = tmp_path / "obs.json"
    saved.write_text(json.dumps({"data": _observations(data_dir), "meta": META}))  # no newline
    one = tmp_path / "one.duckdb"
    summary = _ingest(cli, "langfuse", saved, one)
    assert summary["rows_quarantined"] == 0
    assert _rows(one) == _rows(pretty) and len(_rows(one)) == 3
    # with the newline curl -w '\n' or an editor adds: the same
    saved.write_text(json.dumps({"data": _observations(data_dir), "meta": META}) + "\n")
    nl = tmp_path / "nl.duckdb"
    _ingest(cli, "langfuse", saved, nl)
    assert _rows(nl) == _rows(pretty)


def test_langfuse_api_pages_appended_load_every_page(cli, tmp_path, data_dir):
    obs = _observations(data_dir)
    saved = tmp_path / "pages.json"
    saved.write_text("".join(json.dumps({"data": [o], "meta": {**META, "page": i + 1}}) + "\n"
                             for i, o in enumerate(obs)))
    db = tmp_path / "p.duckdb"
    _ingest(cli, "langfuse", saved, db)
    pretty = tmp_path / "pretty.duckdb"
    _ingest(cli, "langfuse", data_dir / "langfuse/observations.json", pretty)
    assert _rows(db) == _rows(pretty)


def test_langfuse_json_lines_with_a_first_line_past_4_kib(cli, tmp_path, data_dir):
    obs = _observations(data_dir)
    obs[0] = {**obs[0], "metadata": {"note": "x" * 6000}}  # a long first line, no prompt text
    saved = tmp_path / "obs.json"
    saved.write_text("".join(json.dumps(o) + "\n" for o in obs))
    db = tmp_path / "l.duckdb"
    summary = _ingest(cli, "langfuse", saved, db)
    assert summary["rows_quarantined"] == 0 and len(_rows(db)) == 3


def test_litellm_api_answer_on_one_line_loads_like_json_lines(cli, tmp_path, data_dir):
    lines = tmp_path / "lines.duckdb"
    _ingest(cli, "litellm", data_dir / "litellm/spendlogs.jsonl", lines)
    saved = tmp_path / "spend.json"
    saved.write_text(json.dumps({"data": _spendlogs(data_dir),
                                 "meta": {"total": 5, "page": 1, "page_size": 50}}))
    one = tmp_path / "one.duckdb"
    summary = _ingest(cli, "litellm", saved, one)
    assert (summary["rows_read"], summary["rows_added"], summary["rows_quarantined"]) == (4, 4, 0)
    assert _rows(one) == _rows(lines)
    # and as a one-line array (LiteLLM's /spend/logs answers a list)
    saved.write_text(json.dumps(_spendlogs(data_dir)))
    arr = tmp_path / "arr.duckdb"
    _ingest(cli, "litellm", saved, arr)
    assert _rows(arr) == _rows(lines)


def test_a_data_key_that_is_not_an_array_is_still_refused(cli, tmp_path, db_path):
    saved = tmp_path / "odd.json"
    saved.write_text(json.dumps({"data": {"id": "x"}, "meta": {}}, indent=2))
    code, _, err = cli(["ingest", "langfuse", saved, "--db", db_path])
    assert code == 4 and 'expected an array of records or {"data": [...]}' in err, err


BOM = b"\xef\xbb\xbf"


def test_a_saved_answer_starting_with_a_bom_loads_as_without_it(cli, tmp_path, data_dir):
    # a UTF-8 BOM (Windows editors, PowerShell's Out-File) before a JSON document is skipped as
    # before a JSON-lines file: one line with or without the final newline, pretty-printed
    docs = {"langfuse": {"data": _observations(data_dir), "meta": META},
            "litellm": {"data": _spendlogs(data_dir), "meta": {"total": 4, "page": 1}}}
    for command, doc in docs.items():
        plain = tmp_path / f"{command}-plain.json"
        plain.write_text(json.dumps(doc))
        want = _rows(tmp_path / f"{command}-plain.duckdb") if _ingest(
            cli, command, plain, tmp_path / f"{command}-plain.duckdb") else None
        assert want
        for form, text in (("one-line", json.dumps(doc)), ("newline", json.dumps(doc) + "\n"),
                           ("pretty", json.dumps(doc, indent=2))):
            saved = tmp_path / f"{command}-{form}.json"
            saved.write_bytes(BOM + text.encode())
            db = tmp_path / f"{command}-{form}.duckdb"
            summary = _ingest(cli, command, saved, db)
            assert summary["rows_quarantined"] == 0, (command, form, summary)
            assert _rows(db) == want, (command, form)


def test_a_one_line_json_lines_file_with_a_bom_and_no_newline_is_read(cli, tmp_path, data_dir):
    saved = tmp_path / "one.jsonl"
    saved.write_bytes(BOM + json.dumps(_spendlogs(data_dir)[0]).encode())
    summary = _ingest(cli, "litellm", saved, tmp_path / "one.duckdb")
    assert summary["rows_added"] == 1, summary
