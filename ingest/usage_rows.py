"""``requests`` rows from sources other than usage JSONL (OTLP spans, LiteLLM, Langfuse).

Those sources normalise a record to a dict of ``requests`` columns (the rules of
:mod:`prefixscope.ingest.usage_shapes`: inclusive prompt, NULL = not reported, digests only),
plus ``provider`` (migration 60). This module turns such dicts into the same Arrow batch the
usage-log reader builds and inserts it with the same writer
(``store/queries/requests.py``: ``request_key``, stored keys skipped), so every source
lands in one table under one rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from prefixscope.ingest.usage_read import _COLUMNS

#: ``requests`` columns written by these sources: the usage-log columns, then ``provider``.
ROW_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (*_COLUMNS, ("provider", pa.string()))
_SCHEMA = pa.schema([pa.field(n, t) for n, t in ROW_COLUMNS])
ROW_COLUMN_LIST = ", ".join(n for n, _ in ROW_COLUMNS)
_DEFAULTS = {"run_id": "", "ts_estimated": False}


_ID_FIELDS = ("request_id", "run_id", "model", "instance", "endpoint", "provider")
NOT_TEXT = "not text (a list, object, number or boolean where a name belongs)"
_MAX_MS = 1e9
MS_RANGE = "not a finite number of milliseconds from 0 to 10^9"


def row_problem(row: dict[str, Any]) -> tuple[str, str] | None:
    """The first bound a row breaks (``prefixscope.core.bounds``), as ``(column, reason)``:
    an identifier that is not text (a JSON list or object in ``model``) or is longer than 256
    characters, a time outside 1970-2100, ``ttft_ms``/``latency_ms`` not a finite number from 0
    to 10^9 ms, or None when the row is within bounds. Token counts are checked by each reader
    as it reads them. The reason never quotes the value."""
    from prefixscope.core.bounds import ID_TOO_LONG, TIME_RANGE, id_ok, time_ok

    for name in _ID_FIELDS:
        v = row.get(name)
        if v is None:
            continue
        if not isinstance(v, str):
            return name, NOT_TEXT
        if not id_ok(v):
            return name, ID_TOO_LONG
    ts = row.get("ts_unix_s")
    if ts is not None and (not isinstance(ts, (int, float)) or not time_ok(ts)):
        return "ts_unix_s", TIME_RANGE
    for name in ("ttft_ms", "latency_ms"):
        v = row.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not 0.0 <= v <= _MAX_MS):
            return name, MS_RANGE
    return None


def dict_rows_to_arrow(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Row dicts (keys: :data:`ROW_COLUMNS` names; a missing key is NULL, ``run_id`` '' and
    ``ts_estimated`` false) -> an Arrow table with the ``requests`` types."""
    cols = []
    for name, typ in ROW_COLUMNS:
        default = _DEFAULTS.get(name)
        cols.append(pa.array([r.get(name, default) if r.get(name) is not None else default
                              for r in rows], type=typ))
    return pa.Table.from_arrays(cols, schema=_SCHEMA)


def insert_dict_rows(con: duckdb.DuckDBPyConnection, rows: Sequence[dict[str, Any]] | pa.Table
                     ) -> int:
    """Insert rows (dicts or their :func:`dict_rows_to_arrow` table) into ``requests``;
    a (run_id, request_id) already stored, or repeated in the batch, is skipped. Runs inside
    the caller's transaction. Returns rows added."""
    from prefixscope.store.queries.requests import insert_request_rows

    table = rows if isinstance(rows, pa.Table) else dict_rows_to_arrow(rows)
    if table.num_rows == 0:
        return 0
    return insert_request_rows(con, table, ROW_COLUMN_LIST)
