"""Queries on diagnoses and their breakers (tables ``diagnoses``, ``breakers``; migration 30).

Rows hold structure, kinds, counts, lost tokens and value digests, never prompt text
(``docs/diagnose.md#stored``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pandas as pd

DIAGNOSIS_COLUMNS = ("diagnosis_id", "run_id", "model", "created_unix_s", "block_size",
                     "capacity_blocks", "requests", "prompt_tokens", "cached_tokens", "hit_rate",
                     "what_if_hit_rate", "what_if_cached_tokens", "what_if_cost_delta",
                     "currency", "cold_requests", "levels", "source_id")
BREAKER_COLUMNS = ("diagnosis_id", "rank", "level", "kind", "segment", "message_index", "role",
                   "line", "schema_key_digest", "requests", "distinct_values", "lost_tokens",
                   "lost_tokens_measured", "share", "fixable", "transform_types",
                   "what_if_hit_rate", "what_if_cached_tokens", "value_digests")


def insert_diagnosis(con: duckdb.DuckDBPyConnection, diagnosis: Mapping[str, Any],
                     breakers: Sequence[Mapping[str, Any]]) -> int:
    """Insert one diagnosis and its breakers; an existing ``diagnosis_id`` is kept unchanged
    (safe to run twice). Runs inside the caller's transaction. Returns breakers added."""
    did = diagnosis["diagnosis_id"]
    if con.execute("SELECT count(*) FROM diagnoses WHERE diagnosis_id = ?", [did]).fetchone()[0]:
        return 0
    con.execute(f"INSERT INTO diagnoses ({', '.join(DIAGNOSIS_COLUMNS)}) VALUES "
                f"({', '.join('?' * len(DIAGNOSIS_COLUMNS))})",
                [diagnosis.get(c) for c in DIAGNOSIS_COLUMNS])
    rows = [[did if c == "diagnosis_id" else b.get(c) for c in BREAKER_COLUMNS] for b in breakers]
    if rows:
        con.executemany(f"INSERT INTO breakers ({', '.join(BREAKER_COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(BREAKER_COLUMNS))})", rows)
    return len(rows)


def diagnoses(con: duckdb.DuckDBPyConnection, *, run_ids: Sequence[str] | None = None,
              limit: int = 200) -> pd.DataFrame:
    """Diagnoses, newest first (columns :data:`DIAGNOSIS_COLUMNS` plus ``run_label``)."""
    where, params = "", []
    if run_ids:
        where = f"WHERE d.run_id IN ({', '.join('?' * len(run_ids))})"
        params = list(run_ids)
    return con.execute(
        f"SELECT d.*, r.label AS run_label FROM diagnoses d LEFT JOIN runs r USING (run_id) "
        f"{where} ORDER BY d.created_unix_s DESC LIMIT {int(limit)}", params).df()


def breakers_of(con: duckdb.DuckDBPyConnection, diagnosis_id: str) -> pd.DataFrame:
    """The ranked breakers of one diagnosis (columns :data:`BREAKER_COLUMNS`), by rank."""
    return con.execute("SELECT * FROM breakers WHERE diagnosis_id = ? ORDER BY rank",
                       [diagnosis_id]).df()


def top_breaker_by_model(con: duckdb.DuckDBPyConnection,
                         models: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """model -> its newest diagnosis's rank-1 breaker (``kind, segment, message_index, role,
    line, lost_tokens, share, fixable, diagnosis_id, run_id``); models without one are absent."""
    rows = con.execute(
        """
        SELECT model, kind, segment, message_index, role, line, lost_tokens, share, fixable,
               diagnosis_id, run_id
        FROM (SELECT d.model, b.*, d.run_id,
                     row_number() OVER (PARTITION BY d.model ORDER BY d.created_unix_s DESC) AS n
              FROM diagnoses d JOIN breakers b USING (diagnosis_id)
              WHERE b.rank = 1 AND d.model IS NOT NULL)
        WHERE n = 1
        """).fetchall()
    cols = ("kind", "segment", "message_index", "role", "line", "lost_tokens", "share",
            "fixable", "diagnosis_id", "run_id")
    out = {r[0]: dict(zip(cols, r[1:])) for r in rows}
    if models is not None:
        out = {m: v for m, v in out.items() if m in set(models)}
    return out
