"""Ingest a diagnosis's ``breakers.json`` (written by ``prefixscope.replay.diagnose_store``)
into the ``diagnoses`` and ``breakers`` tables, under its replay run.

The file holds structure, kinds, counts, lost tokens and value digests only; a record with a
field of the wrong type is refused with ``file: field: reason`` (never its value).
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from prefixscope.core.documents import load_summary_file
from prefixscope.core.errors import ConfigError, problem_text

_INT = ("rank", "level", "requests", "distinct_values", "lost_tokens")
_TEXT = ("kind", "segment", "role", "transform_types", "schema_key_digest")


def ingest_breakers_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str]) -> int:
    """Store one ``breakers.json``; returns breakers added (0 when it was stored before).

    Raises:
        SourceUnavailable: no such file. ConfigError: not valid JSON, or a bad field.
    """
    from prefixscope.store.queries.breakers import insert_diagnosis

    p = Path(path)
    doc = load_summary_file(p)
    if not isinstance(doc, dict) or doc.get("kind") != "diagnosis":
        raise ConfigError(problem_text(str(p), 1, "not a diagnosis breakers file", "$.kind"))
    for key in ("diagnosis_id", "run_id"):
        if not isinstance(doc.get(key), str):
            raise ConfigError(problem_text(str(p), 1, "missing or not a string", f"$.{key}"))
    rows = doc.get("breakers")
    if not isinstance(rows, list):
        raise ConfigError(problem_text(str(p), 1, "missing or not a list", "$.breakers"))
    for i, b in enumerate(rows):
        for key in _INT:
            if isinstance(b.get(key), bool) or not isinstance(b.get(key), int):
                raise ConfigError(problem_text(str(p), 1, "missing or not an integer",
                                               f"$.breakers[{i}].{key}"))
        for key in _TEXT:
            if b.get(key) is not None and not isinstance(b[key], str):
                raise ConfigError(problem_text(str(p), 1, "not a string", f"$.breakers[{i}].{key}"))
        digests = b.get("value_digests") or []
        if not all(isinstance(x, str) and len(x) == 16 for x in digests):
            raise ConfigError(problem_text(str(p), 1, "not a list of 16-hex digests",
                                           f"$.breakers[{i}].value_digests"))
    diag = dict(doc)
    diag["source_id"] = f"breakers:{p.resolve()}"
    con.execute("BEGIN")
    try:
        added = insert_diagnosis(con, diag, rows)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return added
