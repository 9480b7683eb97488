"""Archived decision days from before a migration added a column: ``gateway_decisions.bypass``
(migration 81) is missing from a day archived by the code before it, and present in a day
archived after. A query over both reads them by name (the older file's ``bypass`` is NULL).
Without ``union_by_name`` the first file's columns won: with the older day first the newer day's
``bypass`` was dropped without a word (its bypass counted as a shadow accept), with the newer
first DuckDB refused the pair ("schema mismatch in glob"). Real DuckDB file, real Parquet."""

from __future__ import annotations

from prefixscope.store import db as store_db
from prefixscope.store.queries import archive as arc
from prefixscope.store.queries import scopes as q
from prefixscope.store.queries.decisions import DECISION_COLUMNS
from prefixscope.store.sqlhelpers import insert_rows_bulk
from tests.store_support import older_schema

DAY = 86_400.0
T0 = 20_700 * DAY  # 2026-09-02 00:00 UTC


def _decision(request_id: str, ts: float, *, bypass: bool | None, tokens: int) -> dict:
    row = dict.fromkeys(DECISION_COLUMNS)
    row.update(run_id="", request_id=request_id, source_id="decisions.jsonl", line=1,
               ts_unix_s=ts, instance="gateway", model="m1", scope="TENANT",
               namespace_digest="0123456789abcdef", decision="accept", reasons="",
               candidate_cached_tokens=tokens,
               accepted_cached_tokens=0 if bypass else tokens, salt_applied=False,
               bypass=bypass)
    return row


def test_a_day_archived_before_the_bypass_column_reads_beside_one_after(tmp_path, monkeypatch):
    path, root = str(tmp_path / "db.duckdb"), str(tmp_path / "archive")
    with older_schema(path, monkeypatch, before=81) as con:
        store_db.migrate(con)
        cols = [c for c in DECISION_COLUMNS if c != "bypass"]
        assert "bypass" not in {r[0] for r in con.execute(
            "DESCRIBE gateway_decisions").fetchall()}
        shadow = _decision("d-1", T0 + 60, bypass=None, tokens=64)
        insert_rows_bulk(con, "gateway_decisions", cols, [tuple(shadow[c] for c in cols)])
        assert arc.archive_day(con, "gateway_decisions", T0, root) is not None
    with store_db.writer(path) as con:  # migration 81 now
        bypassed = _decision("d-2", T0 + DAY + 60, bypass=True, tokens=96)
        insert_rows_bulk(con, "gateway_decisions", DECISION_COLUMNS,
                         [tuple(bypassed[c] for c in DECISION_COLUMNS)])
        assert arc.archive_day(con, "gateway_decisions", T0 + DAY, root) is not None
        assert con.execute("SELECT count(*) FROM gateway_decisions").fetchone()[0] == 0
    with store_db.reader(path) as con:
        assert len(arc.archived_files(con, "gateway_decisions", T0, T0 + 2 * DAY)) == 2
        # both archived days in one read: the older day is a shadow accept, the newer a bypass
        assert q.unserved_accepts(con, start_s=T0, end_s=T0 + 2 * DAY, run_ids=[""]) == (
            1, 64, 1, 96)
        rel = arc.relation(con, "gateway_decisions", T0, T0 + 2 * DAY)
        assert con.execute(f"SELECT request_id, bypass FROM {rel} ORDER BY request_id"
                           ).fetchall() == [("d-1", None), ("d-2", True)]
