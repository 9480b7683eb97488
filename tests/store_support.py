"""Store test helpers shared by the rollup property tests and the migration tests: a ``requests``
row tuple by column name, the rollup-vs-raw frame comparison, a database file made by the code
of an older schema, and ``requests`` rows inserted the way the code before the rollups did."""

from __future__ import annotations

from contextlib import contextmanager

import pandas as pd

from prefixscope.ingest.usage_read import _COLUMN_LIST, rows_to_arrow
from prefixscope.store import db as store_db
from prefixscope.store.schema import MIGRATIONS, REQUEST_KEY_SQL

REQUEST_COLUMNS = tuple(_COLUMN_LIST.split(", "))


def request_row(run_id: str, request_id: str, ts: float | None, *, line: int = 1,
                model: str | None = "m1", instance: str = "a", prompt: int | None = 100,
                cached: int | None = 50, ttft: float | None = None,
                latency: float | None = None, scope: str | None = None,
                tenant: str | None = None) -> tuple:
    """One ``requests`` row tuple in the column order of
    ``prefixscope.ingest.usage_read._COLUMNS`` (what ``save_usage_rows`` takes): source
    ``test``, a chat request of the ``openai`` shape with 7 completion tokens."""
    values = dict.fromkeys(REQUEST_COLUMNS)
    values.update(run_id=run_id, request_id=request_id, source_id="test", line=line,
                  ts_unix_s=ts, ts_estimated=False, model=model, instance=instance,
                  endpoint="chat", usage_shape="openai", prompt_tokens=prompt,
                  cached_tokens=cached, completion_tokens=7, ttft_ms=ttft, latency_ms=latency,
                  scope=scope, tenant_digest=tenant)
    return tuple(values[c] for c in REQUEST_COLUMNS)


def frames_equal(a, b) -> None:
    """Assert two query answers are the same: dicts equal, frames equal but for dtype and
    index (the rollup and the raw path may type an all-NULL column differently)."""
    if isinstance(a, dict):
        assert a == b
    else:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True),
                                      check_dtype=False)


@contextmanager
def older_schema(db_path: str, monkeypatch, *, before: int):
    """A connection to ``db_path`` migrated only by the migrations numbered below ``before``
    (a database made by the code of that time); closed, and the full migration list back in
    place, on leaving, so the next ``connect`` + ``migrate`` applies the rest."""
    monkeypatch.setattr(store_db, "MIGRATIONS", tuple(m for m in MIGRATIONS if m.number < before))
    con = store_db.connect(db_path)
    try:
        yield con
    finally:
        con.close()
        monkeypatch.setattr(store_db, "MIGRATIONS", MIGRATIONS)


def insert_requests_without_rollups(con, rows: list[tuple]) -> None:
    """Insert ``requests`` rows (``request_row`` tuples) with plain SQL, as the code before the
    rollup migrations wrote them: no rollup row is touched."""
    con.register("_old_requests", rows_to_arrow(rows))
    try:
        con.execute(f"INSERT INTO requests ({_COLUMN_LIST}, request_key) "
                    f"SELECT {_COLUMN_LIST}, {REQUEST_KEY_SQL} FROM _old_requests")
    finally:
        con.unregister("_old_requests")
