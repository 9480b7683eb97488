"""``prefixscope hitrate``'s table at fixed terminal widths: numbers are never cut."""

from __future__ import annotations

import pytest
from rich.console import Console

from prefixscope.store import db as store_db
from prefixscope.store.schema import REQUEST_KEY_SQL

BIG = 12_345_678_901  # tokens: 14 characters with separators


@pytest.fixture
def wide_numbers_db(db_path):
    """Two long model names, huge token counts and a request without cached_tokens (so the
    requests source has a coverage note)."""
    with store_db.writer(db_path) as con:
        con.execute(
            "INSERT INTO requests (run_id, request_id, source_id, ts_unix_s, model, instance, "
            "prompt_tokens, cached_tokens, request_key) "
            f"SELECT *, {REQUEST_KEY_SQL} FROM (VALUES "
            "('', 'r1', 's', 1795961000, 'meta-llama/Llama-3.1-70B-Instruct', 'gpu-node-17:8000', ?, ?), "
            "('', 'r2', 's', 1795961010, 'meta-llama/Llama-3.1-70B-Instruct', 'gpu-node-17:8000', 100, NULL), "
            "('', 'r3', 's', 1795964700, 'Qwen/Qwen2.5-Coder-32B-Instruct', 'gpu-node-18:8000', ?, ?))"
            " t(run_id, request_id, source_id, ts_unix_s, model, instance, prompt_tokens, cached_tokens)",
            [BIG, BIG - 1_000_000_000, BIG, 987_654_321])
    return db_path


def _at_width(monkeypatch, width: int) -> None:
    monkeypatch.setattr("prefixscope.cli.commands.hitrate.out", Console(width=width, soft_wrap=True))


NUMBERS = ("12,345,678,901", "11,345,678,901", "987,654,321", "91.9%", "8.0%",
           "2026-11-29 14:00", "2026-11-29 15:00")


def test_80_columns_keep_every_number_whole(cli, wide_numbers_db, monkeypatch):
    _at_width(monkeypatch, 80)
    code, out, err = cli(["hitrate", "--source", "requests", "--db", wide_numbers_db])
    assert code == 0, err
    assert "…" not in out
    for number in NUMBERS:
        assert number in out, number
    assert max(len(line) for line in out.splitlines()) <= 80
    # no room for a notes column: the note is a line under the table
    assert "notes:\n  2026-11-29 14:00 meta-llama/Llama-3.1-70B-Instruct: coverage 50%" in out


def test_notes_column_when_it_fits(cli, wide_numbers_db, monkeypatch):
    _at_width(monkeypatch, 120)
    code, out, _ = cli(["hitrate", "--source", "requests", "--db", wide_numbers_db])
    assert code == 0 and "│ notes " not in out and "┃ notes" in out and "coverage 50%" in out
    assert "notes:" not in out and "meta-llama/Llama-3.1-70B-Instruct" in out


def test_window_start_keeps_seconds_unless_whole_minutes(cli, wide_numbers_db, monkeypatch):
    _at_width(monkeypatch, 120)
    code, out, _ = cli(["hitrate", "--source", "requests", "--window", "90s",
                        "--db", wide_numbers_db])
    assert code == 0 and "2026-11-29T14:03:00Z" in out and "2026-11-29T14:04:30Z" not in out


def test_notes_column_only_when_a_row_has_a_note(cli, wide_numbers_db, monkeypatch):
    _at_width(monkeypatch, 80)
    code, out, _ = cli(["hitrate", "--source", "requests", "--db", wide_numbers_db,
                        "--start", "2026-11-29T15:00:00Z"])
    assert code == 0 and "notes" not in out and "12,345,678,901" in out


@pytest.mark.parametrize(("width", "by"), [(80, "model,instance"), (40, "model")])
def test_too_narrow_terminal_prints_the_whole_table(cli, wide_numbers_db, monkeypatch,
                                                     width, by):
    _at_width(monkeypatch, width)
    code, out, _ = cli(["hitrate", "--source", "requests", "--by", by, "--db", wide_numbers_db])
    assert code == 0 and "…" not in out
    for number in NUMBERS:
        assert number in out, number


def test_null_scope_is_null_in_json_not_nan(cli, wide_numbers_db):
    code, out, _ = cli(["hitrate", "--source", "requests", "--by", "scope", "--json",
                        "--db", wide_numbers_db])
    assert code == 0 and "NaN" not in out and '"scope": null' in out
