"""Queries on per-request usage (table ``requests``): per-request hit rate, coverage, the
report line.

Definitions (``docs/metrics.md`` "Per-request hit rate and coverage"):

- A request *reported* cached tokens when ``cached_tokens IS NOT NULL`` (0 counts as reported).
- ``hit_rate`` = Σ cached_tokens / Σ prompt_tokens over the **reported** requests only
  (``reported_prompt_tokens``); NULL when that sum is 0. A fraction in [0, 1].
- ``coverage`` = reported requests / all requests; NULL when there are no requests.

Filters: ``start_s``/``end_s`` select ``start_s <= ts_unix_s < end_s`` (None = unbounded);
``models``/``instances``/``run_ids`` are lists (None = all). Windows are
``[window_start_s, window_start_s + window_s)`` aligned to ``origin_s + k * window_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pandas as pd
import pyarrow as pa

from prefixscope.core.errors import InvalidArgument
from prefixscope.core.report import format_report_line
from prefixscope.store.queries import archive
from prefixscope.store.queries import scope_rollup
from prefixscope.store.schema import (LATENCY_BAND_SQL, LATENCY_BANDS, LATENCY_BIN_RATIO,
                                      LATENCY_ROLLUP_COLUMNS, LATENCY_ROLLUP_SELECT_SQL,
                                      REQUEST_KEY_SQL)
from prefixscope.store.sqlhelpers import bucket_split

#: Columns a query may group by (identifiers cannot be bound as parameters: whitelist).
GROUPABLE = ("model", "instance", "run_id", "endpoint", "usage_shape", "scope", "tenant_digest")


def _by_columns(by: Sequence[str]) -> list[str]:
    cols = list(by)
    bad = [c for c in cols if c not in GROUPABLE]
    if bad:
        raise InvalidArgument(f"cannot group requests by {bad}: choose from {list(GROUPABLE)}")
    return cols


def _where(start_s: float | None, end_s: float | None, models: Sequence[str] | None,
           instances: Sequence[str] | None, run_ids: Sequence[str] | None,
           alias: str = "") -> tuple[str, list]:
    """WHERE clause and its parameters for the common filters."""
    a = f"{alias}." if alias else ""
    parts = ["TRUE"]
    params: list = []
    if start_s is not None:
        parts.append(f"{a}ts_unix_s >= ?")
        params.append(float(start_s))
    if end_s is not None:
        parts.append(f"{a}ts_unix_s < ?")
        params.append(float(end_s))
    for col, values in (("model", models), ("instance", instances), ("run_id", run_ids)):
        if values is not None:
            parts.append(f"list_contains(?::VARCHAR[], {a}{col})")
            params.append([str(v) for v in values])
    return " AND ".join(parts), params


# ---------------------------------------------------------------------------------------------
# Per-minute rollup (migration 71, table request_rollup_1m)
# ---------------------------------------------------------------------------------------------

#: Length of a rollup bucket, seconds: buckets are ``[k * 60, (k + 1) * 60)`` in Unix time.
ROLLUP_S = 60.0
#: Columns a rollup row is grouped by (besides its bucket).
ROLLUP_GROUPS = ("run_id", "model", "instance", "scope")
_BUCKET_SQL = "floor(ts_unix_s / 60.0) * 60.0"
#: The rollup's measures, as computed from ``requests`` rows.
_FACT_AGG = """
    count(*) AS requests,
    count(cached_tokens) AS reported_requests,
    count(*) FILTER (WHERE cached_tokens > 0) AS hit_requests,
    count(ttft_ms) FILTER (WHERE cached_tokens IS NOT NULL) AS with_ttft,
    count(latency_ms) FILTER (WHERE cached_tokens IS NOT NULL) AS with_latency,
    CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
    CAST(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS BIGINT)
        AS reported_prompt_tokens,
    CAST(sum(cached_tokens) AS BIGINT) AS cached_tokens,
    min(ts_unix_s) AS min_ts_unix_s,
    max(ts_unix_s) AS max_ts_unix_s
"""
_FACT_COLUMNS = ("bucket_start_s, run_id, model, instance, scope, requests, reported_requests, "
                 "hit_requests, with_ttft, with_latency, prompt_tokens, reported_prompt_tokens, "
                 "cached_tokens, min_ts_unix_s, max_ts_unix_s")
#: ``request_rollup_1m`` rows of the requests matched by a WHERE on ``requests`` (``{where}``).
ROLLUP_SELECT_SQL = (f"SELECT {_BUCKET_SQL} AS bucket_start_s, run_id, model, instance, scope, "
                     f"{_FACT_AGG} FROM requests WHERE {{where}} GROUP BY ALL")


def _rollup_select(rel: str, where: str) -> str:
    """:data:`ROLLUP_SELECT_SQL` over the relation ``rel`` (:func:`archive.relation`)."""
    return ROLLUP_SELECT_SQL.replace(" FROM requests WHERE ", f" FROM {rel} WHERE ").format(
        where=where)


def rebuild_request_rollup(con: duckdb.DuckDBPyConnection) -> int:
    """Rebuild ``request_rollup_1m`` from every stored request (after rows were written with
    SQL rather than through :func:`insert_request_rows`). Runs in the caller's transaction.

    Returns:
        Rollup rows written.
    """
    con.execute("DELETE FROM request_rollup_1m")
    row = con.execute(f"INSERT INTO request_rollup_1m ({_FACT_COLUMNS}) "
                      + _rollup_select(archive.relation(con, "requests"), "TRUE")).fetchone()
    archive.trim_rollup(con, "requests")
    return int(row[0]) if row else 0


def _refresh_rollup(con: duckdb.DuckDBPyConnection, batch: str) -> None:
    """Recompute the rollup rows of every minute (and the no-time bucket) the batch ``batch``
    (a registered table with ``ts_unix_s``) touches, from ``requests``: exact whether the
    batch's rows were all new, partly stored already or repeated. The time range narrows
    the scan of ``requests`` to the batch's minutes."""
    lo, hi, untimed = con.execute(
        f"SELECT min({_BUCKET_SQL}), max({_BUCKET_SQL}), bool_or(ts_unix_s IS NULL) "
        f"FROM {batch}").fetchone()
    if lo is not None:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _ps_buckets AS SELECT DISTINCT {_BUCKET_SQL} AS b "
                    f"FROM {batch} WHERE ts_unix_s IS NOT NULL")
        con.execute("DELETE FROM request_rollup_1m WHERE bucket_start_s >= ? AND "
                    "bucket_start_s <= ? AND bucket_start_s IN (SELECT b FROM _ps_buckets)",
                    [lo, hi])
        where = (f"ts_unix_s >= ? AND ts_unix_s < ? AND {_BUCKET_SQL} IN "
                 "(SELECT b FROM _ps_buckets)")
        rel = archive.relation(con, "requests", lo, hi + ROLLUP_S)
        con.execute(f"INSERT INTO request_rollup_1m ({_FACT_COLUMNS}) "
                    + _rollup_select(rel, where), [lo, hi + ROLLUP_S])
        con.execute("DROP TABLE _ps_buckets")
        archive.trim_rollup(con, "requests")
    if untimed:
        con.execute("DELETE FROM request_rollup_1m WHERE bucket_start_s IS NULL")
        con.execute(f"INSERT INTO request_rollup_1m ({_FACT_COLUMNS}) "
                    + ROLLUP_SELECT_SQL.format(where="ts_unix_s IS NULL"))


def _refresh_latency_rollup(con: duckdb.DuckDBPyConnection, batch: str, *, all_new: bool
                            ) -> None:
    """Maintain ``latency_rollup_1d`` (migration 77) for the batch ``batch`` just inserted:
    when every row of it was added (``all_new``), its bins are added to the stored ones of the
    same days (counts and sums add, min/max combine: any order of arrival gives the same
    table); else the days it touches are recomputed from ``requests`` (exact for repeats and
    rows stored already)."""
    con.execute("CREATE OR REPLACE TEMP TABLE _ps_lat_days AS SELECT DISTINCT "
                f"floor(ts_unix_s / 86400.0) * 86400.0 AS b FROM {batch}")
    in_days = ("(bucket_start_s IN (SELECT b FROM _ps_lat_days) OR (bucket_start_s IS NULL AND "
               "EXISTS (SELECT 1 FROM _ps_lat_days WHERE b IS NULL)))")
    if all_new:
        fresh = LATENCY_ROLLUP_SELECT_SQL.replace("FROM requests", f"FROM {batch}").format(
            where="TRUE")
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _ps_lat AS
            SELECT bucket_start_s, run_id, model, instance, measure, band, bin,
                   sum(requests) AS requests, sum(sum_ms) AS sum_ms, min(min_ms) AS min_ms,
                   max(max_ms) AS max_ms
            FROM ({fresh} UNION ALL
                  SELECT {LATENCY_ROLLUP_COLUMNS} FROM latency_rollup_1d WHERE {in_days})
            GROUP BY ALL
        """)
        con.execute(f"DELETE FROM latency_rollup_1d WHERE {in_days}")
        con.execute(f"INSERT INTO latency_rollup_1d ({LATENCY_ROLLUP_COLUMNS}) "
                    f"SELECT {LATENCY_ROLLUP_COLUMNS} FROM _ps_lat")
        con.execute("DROP TABLE _ps_lat")
    else:
        lo, hi = con.execute("SELECT min(b), max(b) FROM _ps_lat_days").fetchall()[0]
        rel = ("requests" if lo is None  # untimed rows only: never archived
               else archive.relation(con, "requests", lo, hi + 86400.0))
        con.execute(f"DELETE FROM latency_rollup_1d WHERE {in_days}")
        con.execute(f"INSERT INTO latency_rollup_1d ({LATENCY_ROLLUP_COLUMNS}) "
                    + LATENCY_ROLLUP_SELECT_SQL.replace("FROM requests", f"FROM {rel}").format(
                        where="floor(ts_unix_s / 86400.0) * 86400.0 IN (SELECT b FROM "
                              "_ps_lat_days) OR (ts_unix_s IS NULL AND EXISTS (SELECT 1 FROM "
                              "_ps_lat_days WHERE b IS NULL))"))
    con.execute("DROP TABLE _ps_lat_days").fetchall()
    archive.trim_rollup(con, "requests")


def rebuild_latency_rollup(con: duckdb.DuckDBPyConnection) -> int:
    """Rebuild ``latency_rollup_1d`` from every stored request (after rows were written with
    SQL). Runs in the caller's transaction. Returns the rollup rows written."""
    con.execute("DELETE FROM latency_rollup_1d")
    rel = archive.relation(con, "requests")
    row = con.execute(f"INSERT INTO latency_rollup_1d ({LATENCY_ROLLUP_COLUMNS}) "
                      + LATENCY_ROLLUP_SELECT_SQL.replace("FROM requests", f"FROM {rel}").format(
                          where="TRUE")).fetchone()
    archive.trim_rollup(con, "requests")
    return int(row[0]) if row else 0


def rollup_current(con: duckdb.DuckDBPyConnection) -> bool:
    """True when ``request_rollup_1m`` counts every stored request (it is maintained by the
    ingest transactions; rows written with SQL make it stale until
    :func:`rebuild_request_rollup`): the queries then read it, else ``requests``. Archived
    requests whose rollup is kept count as stored (:func:`archive.rollup_balance`)."""
    try:
        n, r = archive.rollup_balance(con, "requests")
    except duckdb.CatalogException:
        return False
    return n == r


def _aligned(x: float | None) -> bool:
    return x is None or float(x) % ROLLUP_S == 0.0


def _facts(con: duckdb.DuckDBPyConnection, start_s: float | None, end_s: float | None,
           models: Sequence[str] | None, instances: Sequence[str] | None,
           run_ids: Sequence[str] | None, rollup: bool | None) -> tuple[str, list]:
    """A subquery of rollup-shaped rows (:data:`_FACT_COLUMNS`) for the requests of the
    range and filters: per-minute rollup rows for the whole minutes inside ``[start_s,
    end_s)``, and rows aggregated from ``requests`` for the part minutes at either end; or
    everything aggregated from ``requests`` (``rollup`` False, or None and the rollup not
    :func:`rollup_current`). Summed, both give the same numbers. Raw rows are read through
    :func:`archive.relation` (the table and, for archived days, their Parquet files), and
    before the rollup's floor (:func:`archive.rollup_floor`, rollups past ``[retention]
    rollup_days``) the range is aggregated from them."""
    use = rollup_current(con) if rollup is None else bool(rollup)
    split = (bucket_split(start_s, end_s, ROLLUP_S, floor_s=archive.rollup_floor(con, "requests"))
             if use else None)
    if split is None:  # no rollup, the range inside one minute or before the rollup's floor
        where, params = _where(start_s, end_s, models, instances, run_ids)
        rel = archive.relation(con, "requests", start_s, end_s)
        return f"({_rollup_select(rel, where)})", params
    gwhere, gparams = _where(None, None, models, instances, run_ids)
    mid, mid_params = split.whole_where("bucket_start_s", null_below=start_s is None)
    parts = [f"SELECT {_FACT_COLUMNS} FROM request_rollup_1m WHERE {gwhere} AND {mid}"]
    params: list = [*gparams, *mid_params]
    if split.head is not None:
        where, p = _where(start_s, None, models, instances, run_ids)
        rel = archive.relation(con, "requests", *split.head)
        parts.append(_rollup_select(rel, f"{where} AND {_BUCKET_SQL} < ?"))
        params += [*p, split.lo]
    if split.tail is not None:
        where, p = _where(start_s, end_s, models, instances, run_ids)
        rel = archive.relation(con, "requests", *split.tail)
        parts.append(_rollup_select(rel, f"{where} AND {_BUCKET_SQL} >= ?"))
        params += [*p, split.hi]
    return "(" + " UNION ALL ".join(parts) + ")", params


_SUM_FACTS = """
    CAST(sum(requests) AS BIGINT) AS requests,
    CAST(sum(reported_requests) AS BIGINT) AS reported_requests,
    CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
    CAST(sum(reported_prompt_tokens) AS BIGINT) AS reported_prompt_tokens,
    CAST(sum(cached_tokens) AS BIGINT) AS cached_tokens
"""


#: The staged batch: its rows with their ``request_key`` (a temporary table: memory only).
_STAGED = "_ps_new_requests"


def _stage(con: duckdb.DuckDBPyConnection, name: str, columns: str, *, ordinal: bool) -> None:
    """Claim the ``requests`` write for this transaction (:func:`_claim_writer`) and stage
    the registered batch ``name`` with each row's key (and its position ``_ps_ord`` when
    ``ordinal``) in the temporary table :data:`_STAGED`."""
    _claim_writer(con)
    ordc = ", _ps_ord" if ordinal else ""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_STAGED} AS "
                f"SELECT {columns}, {REQUEST_KEY_SQL} AS request_key{ordc} FROM {name}")


def _claim_writer(con: duckdb.DuckDBPyConnection) -> None:
    """Update the one row of ``requests_writer`` (migration 79) in the caller's transaction.
    The key check reads the committed keys and the transaction's own: two write transactions
    open at the same time (two connections of one process; two processes cannot open the file
    for writing) would each miss the other's keys. Both update this row, so DuckDB fails the
    second with a write-write conflict (``duckdb.TransactionException``), and one of them
    rolls back: a key is never stored twice."""
    con.execute("UPDATE requests_writer SET transactions = transactions + 1 WHERE id = 1")


def insert_request_rows(con: duckdb.DuckDBPyConnection, batch: pa.Table, columns: str) -> int:
    """Insert an Arrow batch of request rows; rows whose (run_id, request_id) is stored are
    skipped (also repeats inside the batch: the first is kept). The per-minute rollup
    (``request_rollup_1m``) of the minutes the batch touches is recomputed in the same
    transaction, as are the scope rollup's minutes (``scope_rollup_5m``,
    :mod:`prefixscope.store.queries.scope_rollup`); the daily latency histogram
    (``latency_rollup_1d``) gains the batch's counts when every row was new, else its days
    are recomputed. The pair is checked through ``request_key``
    (:data:`prefixscope.store.schema.REQUEST_KEY_SQL`, computed here): an anti-join of the
    batch's keys against the stored ones, in the caller's transaction (``requests`` has no
    index since migration 79; :func:`_claim_writer` keeps two open transactions from both
    passing it).

    Args:
        batch: Arrow table whose columns are ``columns`` (comma-separated ``requests`` columns,
            without ``request_key``), built by ``prefixscope.ingest.usage.rows_to_arrow``.

    Returns:
        Rows added.

    Raises:
        duckdb.TransactionException: another connection's open transaction is writing
            ``requests`` (roll back, then try again).
    """
    import numpy as np

    name = "_prefixscope_request_batch"
    con.register(name, batch)
    ordered = name + "_ord"
    con.register(ordered, batch.append_column("_ps_ord", pa.array(np.arange(batch.num_rows))))
    # on failure the views stay registered (an aborted transaction refuses to unregister
    # them); the next call's register replaces them
    _stage(con, ordered, columns, ordinal=True)
    row = con.execute(
        f"INSERT INTO requests ({columns}, request_key) "
        f"SELECT {columns}, request_key FROM {_STAGED} n WHERE NOT EXISTS "
        f"(SELECT 1 FROM requests r WHERE r.request_key = n.request_key) "
        f"QUALIFY row_number() OVER (PARTITION BY request_key ORDER BY _ps_ord) = 1"
    ).fetchone()
    con.execute(f"DROP TABLE {_STAGED}")
    con.unregister(ordered)
    _refresh_rollup(con, name)
    added = int(row[0]) if row else 0
    _refresh_latency_rollup(con, name, all_new=added == batch.num_rows)
    scope_rollup.refresh_for_requests(con, name, all_new=added == batch.num_rows)
    con.unregister(name)
    return added


def insert_new_request_rows(con: duckdb.DuckDBPyConnection, batch: pa.Table, columns: str) -> int:
    """Insert an Arrow batch of request rows that are all expected to be new, and maintain the
    rollups (per-minute requests, daily latency histogram, per-minute scopes). The keys are
    checked first (any stored, any repeated in the batch: two aggregates over the staged
    batch, cheaper than :func:`insert_request_rows`' filtered insert), then inserted as they
    are. A batch that carries a ``request_key`` column (the usage-log parser computes it,
    ``ingest/usage_read.py`` ``_keys``) is checked and inserted as it is, without staging
    (0.4-0.5 s of CPU per 1 M rows less); the table's CHECK verifies every key.

    Returns:
        Rows added (= the batch's rows).

    Raises:
        duckdb.ConstraintException: a (run_id, request_id) already exists or repeats in the
            batch (its ``request_key`` does); nothing was inserted, but the caller's
            transaction should be rolled back (then use :func:`insert_request_rows`).
        duckdb.TransactionException: as :func:`insert_request_rows`.
    """
    name = "_prefixscope_request_batch"
    con.register(name, batch)  # on failure it stays registered; the next register replaces it
    keyed = "request_key" in batch.schema.names
    if keyed:  # the parser computed the keys (the CHECK verifies each at the insert)
        _claim_writer(con)
        source = name
    else:
        _stage(con, name, columns, ordinal=False)
        source = _STAGED
    stored = con.execute(f"SELECT count(*) FROM {source} WHERE request_key IN "
                         "(SELECT request_key FROM requests)").fetchone()[0]
    distinct = con.execute(f"SELECT count(DISTINCT request_key) FROM {source}").fetchone()[0]
    if stored or distinct != batch.num_rows:
        if not keyed:
            con.execute(f"DROP TABLE {_STAGED}")
        raise duckdb.ConstraintException(
            f"requests: {stored} keys of the batch are stored, "
            f"{batch.num_rows - distinct} repeat inside it")
    row = con.execute(f"INSERT INTO requests ({columns}, request_key) "
                      f"SELECT {columns}, request_key FROM {source}").fetchone()
    if not keyed:
        con.execute(f"DROP TABLE {_STAGED}")
    _refresh_rollup(con, name)
    _refresh_latency_rollup(con, name, all_new=True)
    scope_rollup.refresh_for_requests(con, name, all_new=True)
    con.unregister(name)
    return int(row[0]) if row else 0


_AGG = """
    count(*) AS requests,
    count(cached_tokens) AS reported_requests,
    CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
    CAST(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS BIGINT)
        AS reported_prompt_tokens,
    CAST(sum(cached_tokens) AS BIGINT) AS cached_tokens
"""
_RATES = """
    CAST(cached_tokens AS DOUBLE) / NULLIF(reported_prompt_tokens, 0) AS hit_rate,
    CAST(reported_requests AS DOUBLE) / NULLIF(requests, 0) AS coverage
"""


def request_hit_rate_by_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                               end_s: float | None = None, window_s: float = 3600,
                               by: Sequence[str] = ("model",),
                               models: Sequence[str] | None = None,
                               instances: Sequence[str] | None = None,
                               run_ids: Sequence[str] | None = None,
                               origin_s: float = 0.0,
                               rollup: bool | None = None) -> pd.DataFrame:
    """Per-request hit rate and coverage per time window (requests with a time only).

    Returns:
        Columns ``window_start_s, window_end_s, <by...>, requests, reported_requests,
        prompt_tokens, reported_prompt_tokens, cached_tokens`` (tokens), ``hit_rate``
        (Σ cached / reported_prompt_tokens, fraction, NULL when 0), ``coverage`` (reported /
        requests). Oldest window first, then by the ``by`` columns.

    Windows that are whole minutes (``window_s`` and ``origin_s`` multiples of
    :data:`ROLLUP_S`) grouped by :data:`ROLLUP_GROUPS` columns are summed from the per-minute
    rollup (``rollup`` None: when :func:`rollup_current`; False: from ``requests``); the
    numbers are the same.

    Raises:
        InvalidArgument: ``window_s`` not positive, or a ``by`` column not in :data:`GROUPABLE`.
    """
    if not window_s or window_s <= 0:
        raise InvalidArgument(f"window_s must be positive, got {window_s}")
    cols = _by_columns(by)
    if (rollup is not False and float(window_s) % ROLLUP_S == 0 and _aligned(origin_s)
            and set(cols) <= set(ROLLUP_GROUPS)):
        facts, fparams = _facts(con, start_s, end_s, models, instances, run_ids, rollup)
        sel = "".join(f", {c}" for c in cols)
        sql = f"""
            WITH w AS (
                SELECT ? + floor((bucket_start_s - ?) / ?) * ? AS window_start_s, *
                FROM {facts} f WHERE bucket_start_s IS NOT NULL
            ), a AS (
                SELECT window_start_s{sel}, {_SUM_FACTS} FROM w GROUP BY window_start_s{sel}
            )
            SELECT window_start_s, window_start_s + ? AS window_end_s{sel},
                   requests, reported_requests, prompt_tokens, reported_prompt_tokens,
                   cached_tokens, {_RATES}
            FROM a ORDER BY window_start_s{sel}
        """
        p = [float(origin_s), float(origin_s), float(window_s), float(window_s), *fparams,
             float(window_s)]
        return con.execute(sql, p).df()
    where, params = _where(start_s, end_s, models, instances, run_ids)
    rel = archive.relation(con, "requests", start_s, end_s)
    sel = "".join(f", {c}" for c in cols)
    sql = f"""
        WITH w AS (
            SELECT ? + floor((ts_unix_s - ?) / ?) * ? AS window_start_s{sel},
                   prompt_tokens, cached_tokens
            FROM {rel} WHERE ts_unix_s IS NOT NULL AND {where}
        ), a AS (
            SELECT window_start_s{sel}, {_AGG} FROM w GROUP BY ALL
        )
        SELECT window_start_s, window_start_s + ? AS window_end_s{sel},
               requests, reported_requests, prompt_tokens, reported_prompt_tokens,
               cached_tokens, {_RATES}
        FROM a ORDER BY window_start_s{sel}
    """
    p = [float(origin_s), float(origin_s), float(window_s), float(window_s), *params,
         float(window_s)]
    return con.execute(sql, p).df()


def request_hit_rate_totals(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                            end_s: float | None = None, by: Sequence[str] = ("model",),
                            models: Sequence[str] | None = None,
                            instances: Sequence[str] | None = None,
                            run_ids: Sequence[str] | None = None,
                            rollup: bool | None = None) -> pd.DataFrame:
    """Per-request hit rate and coverage over the whole range, per group.

    Returns:
        Columns ``<by...>, requests, reported_requests, prompt_tokens, reported_prompt_tokens,
        cached_tokens, hit_rate, coverage, first_ts_unix_s, last_ts_unix_s``; ordered by the
        ``by`` columns (NULLs last). ``by=()`` gives one overall row (none without requests).
        Grouped by :data:`ROLLUP_GROUPS` columns only, it is summed from the per-minute rollup
        (``rollup`` as in :func:`request_hit_rate_by_window`).
    """
    cols = _by_columns(by)
    if rollup is not False and set(cols) <= set(ROLLUP_GROUPS):
        facts, fparams = _facts(con, start_s, end_s, models, instances, run_ids, rollup)
        sel = "".join(f"{c}, " for c in cols)
        group = f"GROUP BY {', '.join(cols)}" if cols else ""
        order = f"ORDER BY {', '.join(c + ' NULLS LAST' for c in cols)}" if cols else ""
        return con.execute(f"""
            WITH a AS (
                SELECT {sel}{_SUM_FACTS}, min(min_ts_unix_s) AS first_ts_unix_s,
                       max(max_ts_unix_s) AS last_ts_unix_s
                FROM {facts} f {group}
            )
            SELECT {sel}requests, reported_requests, prompt_tokens, reported_prompt_tokens,
                   cached_tokens, {_RATES}, first_ts_unix_s, last_ts_unix_s
            FROM a WHERE requests > 0 {order}
        """, fparams).df()
    where, params = _where(start_s, end_s, models, instances, run_ids)
    rel = archive.relation(con, "requests", start_s, end_s)
    sel = "".join(f"{c}, " for c in cols)
    group = f"GROUP BY {', '.join(cols)}" if cols else ""
    order = f"ORDER BY {', '.join(c + ' NULLS LAST' for c in cols)}" if cols else ""
    sql = f"""
        WITH a AS (
            SELECT {sel}{_AGG}, min(ts_unix_s) AS first_ts_unix_s,
                   max(ts_unix_s) AS last_ts_unix_s
            FROM {rel} WHERE {where} {group}
        )
        SELECT {sel}requests, reported_requests, prompt_tokens, reported_prompt_tokens,
               cached_tokens, {_RATES}, first_ts_unix_s, last_ts_unix_s
        FROM a WHERE requests > 0 {order}
    """
    return con.execute(sql, params).df()


#: Most rows :func:`newest_requests` returns per page.
MAX_PAGE_ROWS = 1000


def newest_requests(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                    end_s: float | None = None, models: Sequence[str] | None = None,
                    instances: Sequence[str] | None = None,
                    run_ids: Sequence[str] | None = None, limit: int = 500,
                    offset: int = 0) -> pd.DataFrame:
    """One page of the requests that reported cached tokens, newest first (the Requests
    page's table). DuckDB keeps a top-(offset + limit) heap while it scans: memory is bounded
    by the page, not by the range. When the range reaches archived days but the table alone
    holds the page's rows newer than the newest archived day, the archive is not read.

    Args:
        limit: rows per page, 1..:data:`MAX_PAGE_ROWS`.
        offset: rows skipped (page number x limit), >= 0.

    Returns:
        Columns ``run_id, request_id, ts_unix_s, model, instance, endpoint, prompt_tokens,
        cached_tokens, hit_rate`` (cached / prompt, NULL when prompt is 0), ``ttft_ms,
        latency_ms, scope, tenant_digest``; newest first (requests without a time last), ties
        by run_id, request_id.

    Raises:
        InvalidArgument: ``limit`` outside 1..MAX_PAGE_ROWS or ``offset`` negative.
    """
    if not 1 <= int(limit) <= MAX_PAGE_ROWS:
        raise InvalidArgument(f"limit must be in 1..{MAX_PAGE_ROWS}, got {limit}")
    if int(offset) < 0:
        raise InvalidArgument(f"offset must be >= 0, got {offset}")
    where, params = _where(start_s, end_s, models, instances, run_ids)
    rel = "requests"
    newest_archived = archive.archived_end_s(con, "requests", start_s, end_s)
    if newest_archived is not None:
        # the archived days are older than the page when the table alone holds offset + limit
        # rows at or after the newest archived day's end: then the table only is read
        row = con.execute(f"""
            SELECT ts_unix_s FROM requests WHERE cached_tokens IS NOT NULL AND {where}
            ORDER BY ts_unix_s DESC NULLS LAST, run_id, request_id LIMIT 1 OFFSET ?
        """, [*params, int(offset) + int(limit) - 1]).fetchall()
        if not (row and row[0][0] is not None and float(row[0][0]) >= newest_archived):
            rel = archive.relation(con, "requests", start_s, end_s)
    return con.execute(f"""
        SELECT run_id, request_id, ts_unix_s, model, instance, endpoint, prompt_tokens,
               cached_tokens, CAST(cached_tokens AS DOUBLE) / NULLIF(prompt_tokens, 0) AS hit_rate,
               ttft_ms, latency_ms, scope, tenant_digest
        FROM {rel} WHERE cached_tokens IS NOT NULL AND {where}
        ORDER BY ts_unix_s DESC NULLS LAST, run_id, request_id
        LIMIT ? OFFSET ?
    """, [*params, int(limit), int(offset)]).df()


def request_counts(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                   end_s: float | None = None, models: Sequence[str] | None = None,
                   instances: Sequence[str] | None = None,
                   run_ids: Sequence[str] | None = None,
                   rollup: bool | None = None) -> dict[str, int]:
    """Request counts of the range (one aggregate row; from the per-minute rollup when it is
    current, ``rollup`` as in :func:`request_hit_rate_by_window`).

    Returns:
        ``requests`` (all), ``reported_requests`` (cached_tokens reported, 0 included),
        ``hit_requests`` (cached_tokens > 0), ``with_ttft`` and ``with_latency`` (reporting
        requests with ``ttft_ms`` / ``latency_ms``); all 0 on an empty range.
    """
    facts, params = _facts(con, start_s, end_s, models, instances, run_ids, rollup)
    row = con.execute(f"""
        SELECT sum(requests), sum(reported_requests), sum(hit_requests), sum(with_ttft),
               sum(with_latency)
        FROM {facts} f
    """, params).fetchone()
    keys = ("requests", "reported_requests", "hit_requests", "with_ttft", "with_latency")
    return {k: int(v or 0) for k, v in zip(keys, row)}


#: Quantiles :func:`request_latency_quantiles` returns (fractions), named ``p05`` ... ``p95``.
LATENCY_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


#: Relative error bound of the quantiles :func:`request_latency_quantiles` returns by default:
#: sqrt(1.02) - 1 (bins of ``latency_rollup_1d`` span a factor 1.02).
LATENCY_QUANTILE_ERROR = math.sqrt(LATENCY_BIN_RATIO) - 1.0


def latency_rollup_current(con: duckdb.DuckDBPyConnection) -> bool:
    """True when ``latency_rollup_1d`` counts every reporting request with a time to first
    token and with a latency (checked against the current per-minute rollup's ``with_ttft``
    and ``with_latency``): the quantiles then read it."""
    if not rollup_current(con):
        return False
    try:
        row = con.execute("""
            SELECT (SELECT coalesce(sum(with_ttft), 0) FROM request_rollup_1m),
                   (SELECT coalesce(sum(with_latency), 0) FROM request_rollup_1m),
                   coalesce(sum(requests) FILTER (WHERE measure = 'ttft_ms'), 0),
                   coalesce(sum(requests) FILTER (WHERE measure = 'latency_ms'), 0)
            FROM latency_rollup_1d""").fetchone()
    except duckdb.CatalogException:
        return False
    return int(row[0]) == int(row[2]) and int(row[1]) == int(row[3])


def _latency_bins(con: duckdb.DuckDBPyConnection, column: str, start_s: float | None,
                  end_s: float | None, models, instances, run_ids,
                  rollup: bool | None) -> tuple[str, list]:
    """A subquery of histogram rows (``band, bin, requests, sum_ms, min_ms, max_ms``; band
    NULL for requests without prompt tokens) of the reporting requests in the range: ``latency_rollup_1d`` rows for the whole UTC days inside
    it and the requests of the part days binned on the fly; or every request binned on the fly
    (``rollup`` False, or None and not :func:`latency_rollup_current`). Both give the same
    bins."""
    raw = LATENCY_ROLLUP_SELECT_SQL.split(" UNION ALL ")[0 if column == "ttft_ms" else 1]
    use = latency_rollup_current(con) if rollup is None else bool(rollup)
    split = bucket_split(start_s, end_s, 86400.0) if use else None
    floor_s = archive.rollup_floor(con, "requests") if split is not None else None
    if floor_s is not None and (split.lo is None or split.lo < floor_s):
        split = None  # the range reaches before the rollups kept (docs/retention.md)
    if split is None:
        where, params = _where(start_s, end_s, models, instances, run_ids)
        rel = archive.relation(con, "requests", start_s, end_s)
        return f"({raw.replace('FROM requests', f'FROM {rel}').format(where=where)})", params
    gwhere, params = _where(None, None, models, instances, run_ids)
    mid, mid_params = split.whole_where("bucket_start_s")
    params = [*params, column, *mid_params]
    cols = "band, bin, requests, sum_ms, min_ms, max_ms"
    parts = [f"SELECT {cols} FROM latency_rollup_1d WHERE {gwhere} AND measure = ? AND {mid}"]
    if split.head is not None:
        where, p = _where(start_s, None, models, instances, run_ids)
        r0 = raw.replace("FROM requests", f"FROM {archive.relation(con, 'requests', *split.head)}")
        parts.append(f"SELECT {cols} FROM ({r0.format(where=f'{where} AND ts_unix_s < ?')})")
        params += [*p, split.lo]
    if split.tail is not None:
        where, p = _where(start_s, end_s, models, instances, run_ids)
        r1 = raw.replace("FROM requests", f"FROM {archive.relation(con, 'requests', *split.tail)}")
        parts.append(f"SELECT {cols} FROM ({r1.format(where=f'{where} AND ts_unix_s >= ?')})")
        params += [*p, split.hi]
    return "(" + " UNION ALL ".join(parts) + ")", params


def request_latency_quantiles(con: duckdb.DuckDBPyConnection, *, column: str = "ttft_ms",
                              start_s: float | None = None, end_s: float | None = None,
                              models: Sequence[str] | None = None,
                              instances: Sequence[str] | None = None,
                              run_ids: Sequence[str] | None = None, exact: bool = False,
                              rollup: bool | None = None) -> pd.DataFrame:
    """Latency of reporting requests per cached-share band (``cold`` < 10% of the prompt
    from the cache, ``partial``, ``warm`` >= 80%: the bands of the TTFT panels,
    ``prefixscope.store.queries.serving.TTFT_BANDS``, ``docs/metrics.md``), as quantiles: the
    box plot's statistics computed in DuckDB, never the rows. A band by share, not
    ``cached_tokens > 0``: a prefix that broke after the first block still caches that block.
    Requests without prompt tokens (no share) are left out.

    By default the quantiles come from a histogram in log-spaced bins (factor
    :data:`~prefixscope.store.schema.LATENCY_BIN_RATIO` = 1.02; the daily rollup
    ``latency_rollup_1d`` for whole UTC days, the part days binned on the fly): each is
    ``quantile_cont``'s linear interpolation between the two order statistics around it, each
    order statistic replaced by its bin's geometric middle (clamped to the bin's smallest and
    largest value), so it is within a relative :data:`LATENCY_QUANTILE_ERROR` (< 1%) of the
    exact ``quantile_cont`` of the same requests (values > 0 ms; a value <= 0 is represented
    by the middle of the smallest and largest such value). ``requests``, ``min_ms`` and
    ``max_ms`` are exact, ``mean_ms`` exact up to floating-point rounding. ``exact`` = the
    exact ``quantile_cont`` over the requests (reads every row).

    Args:
        column: ``ttft_ms`` or ``latency_ms`` (milliseconds; requests without it left out).
        rollup: histogram from the rollup (None: when :func:`latency_rollup_current`) or
            binned from ``requests`` (False); the same numbers.

    Returns:
        Columns ``band`` (``cold``, ``partial``, ``warm``), ``requests``, ``min_ms``,
        ``p05_ms``, ``p25_ms``, ``p50_ms``, ``p75_ms``, ``p95_ms``, ``max_ms``, ``mean_ms``;
        bands in that order; a band without requests is absent.

    Raises:
        InvalidArgument: ``column`` is not ``ttft_ms`` or ``latency_ms``.
    """
    if column not in ("ttft_ms", "latency_ms"):
        raise InvalidArgument(f"column must be ttft_ms or latency_ms, got {column!r}")
    names = ", ".join(f"q[{i + 1}] AS p{round(q * 100):02d}_ms"
                      for i, q in enumerate(LATENCY_QUANTILES))
    order = "CASE band " + " ".join(f"WHEN '{n}' THEN {k}" for k, n in
                                    enumerate(LATENCY_BANDS)) + " END"
    if exact:
        where, params = _where(start_s, end_s, models, instances, run_ids)
        qs = ", ".join(str(q) for q in LATENCY_QUANTILES)
        return con.execute(f"""
            WITH a AS (
                SELECT {LATENCY_BAND_SQL} AS band,
                       count(*) AS requests, min({column}) AS min_ms, max({column}) AS max_ms,
                       avg({column}) AS mean_ms, quantile_cont({column}, [{qs}]) AS q
                FROM {archive.relation(con, "requests", start_s, end_s)}
                WHERE cached_tokens IS NOT NULL AND {column} IS NOT NULL AND prompt_tokens > 0
                  AND {where}
                GROUP BY 1
            )
            SELECT band, requests, min_ms, {names}, max_ms, mean_ms FROM a ORDER BY {order}
        """, params).df()
    bins, params = _latency_bins(con, column, start_s, end_s, models, instances, run_ids, rollup)
    qlist = "[" + ", ".join(repr(float(q)) for q in LATENCY_QUANTILES) + "]"
    return con.execute(f"""
        WITH h AS (
            SELECT band, coalesce(bin, -2147483648) AS k, sum(requests) AS n, sum(sum_ms) AS s,
                   min(min_ms) AS lo, max(max_ms) AS hi, bool_and(bin IS NULL) AS nonpos
            FROM {bins} b WHERE band IS NOT NULL GROUP BY band, coalesce(bin, -2147483648)
        ), c AS (
            SELECT band, k, n, sum(n) OVER (PARTITION BY band ORDER BY k) AS cum,
                   CASE WHEN nonpos THEN (lo + hi) / 2
                        ELSE least(greatest(pow({LATENCY_BIN_RATIO}, k + 0.5), lo), hi) END AS rep
            FROM h
        ), g AS (
            SELECT band, sum(n) AS total, min(lo) AS min_ms, max(hi) AS max_ms,
                   sum(s) / sum(n) AS mean_ms
            FROM h GROUP BY band
        ), qs AS (
            SELECT g.*, qi, (total - 1) * ({qlist})[qi] AS pos
            FROM g, range(1, {len(LATENCY_QUANTILES) + 1}) t(qi)
        ), v AS (
            SELECT qs.band, qs.qi, any_value(qs.pos) AS pos,
                   arg_min(c.rep, c.k) FILTER (WHERE c.cum > floor(qs.pos)) AS a,
                   arg_min(c.rep, c.k) FILTER (WHERE c.cum > ceil(qs.pos)) AS b
            FROM qs JOIN c ON c.band = qs.band GROUP BY qs.band, qs.qi
        ), q AS (
            SELECT band, list(a + (b - a) * (pos - floor(pos)) ORDER BY qi) AS q FROM v
            GROUP BY band
        )
        SELECT band, CAST(g.total AS BIGINT) AS requests, g.min_ms, {names}, g.max_ms,
               g.mean_ms
        FROM g JOIN q USING (band) ORDER BY {order}
    """, params).df()


#: Quantiles of per-request hit rate per window (:func:`request_hit_rate_bands`).
BAND_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def request_hit_rate_bands(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                           end_s: float | None = None, window_s: float = 3600,
                           by: Sequence[str] = ("model",),
                           models: Sequence[str] | None = None,
                           instances: Sequence[str] | None = None,
                           run_ids: Sequence[str] | None = None,
                           origin_s: float = 0.0) -> pd.DataFrame:
    """Distribution of per-request hit rate (cached / prompt tokens, requests that reported
    cached tokens and had prompt tokens) per window: the quantile bands the Requests page draws
    instead of one dot per request.

    Returns:
        Columns ``window_start_s, window_end_s, <by...>, requests, p10, p25, p50, p75, p90``
        (fractions, exact ``quantile_cont``); oldest window first, then by the ``by`` columns.

    Raises:
        InvalidArgument: ``window_s`` not positive, or a ``by`` column not in :data:`GROUPABLE`.
    """
    if not window_s or window_s <= 0:
        raise InvalidArgument(f"window_s must be positive, got {window_s}")
    cols = _by_columns(by)
    where, params = _where(start_s, end_s, models, instances, run_ids)
    rel = archive.relation(con, "requests", start_s, end_s)
    sel = "".join(f", {c}" for c in cols)
    qs = ", ".join(str(q) for q in BAND_QUANTILES)
    names = ", ".join(f"q[{i + 1}] AS p{round(q * 100):02d}" for i, q in enumerate(BAND_QUANTILES))
    sql = f"""
        WITH w AS (
            SELECT ? + floor((ts_unix_s - ?) / ?) * ? AS window_start_s{sel},
                   CAST(cached_tokens AS DOUBLE) / prompt_tokens AS rate
            FROM {rel}
            WHERE ts_unix_s IS NOT NULL AND cached_tokens IS NOT NULL AND prompt_tokens > 0
              AND {where}
        ), a AS (
            SELECT window_start_s{sel}, count(*) AS requests, quantile_cont(rate, [{qs}]) AS q
            FROM w GROUP BY ALL
        )
        SELECT window_start_s, window_start_s + ? AS window_end_s{sel}, requests, {names}
        FROM a ORDER BY window_start_s{sel}
    """
    p = [float(origin_s), float(origin_s), float(window_s), float(window_s), *params,
         float(window_s)]
    return con.execute(sql, p).df()


def request_hit_rate_histogram(con: duckdb.DuckDBPyConnection, *, bins: int = 20,
                               start_s: float | None = None, end_s: float | None = None,
                               models: Sequence[str] | None = None,
                               instances: Sequence[str] | None = None,
                               run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Distribution of per-request hit rate in ``bins`` equal bins over [0, 1].

    A request with hit rate exactly 1 falls in the last bin; rates above 1 (client-side
    token counts) are clipped into it too.

    Returns:
        Columns ``bin_start, bin_end`` (fractions), ``requests``; all bins, lowest first.

    Raises:
        InvalidArgument: ``bins`` < 1.
    """
    if bins < 1:
        raise InvalidArgument(f"bins must be at least 1, got {bins}")
    where, params = _where(start_s, end_s, models, instances, run_ids)
    rel = archive.relation(con, "requests", start_s, end_s)
    return con.execute(f"""
        WITH r AS (
            SELECT least(CAST(floor(CAST(cached_tokens AS DOUBLE) / prompt_tokens * ?) AS BIGINT),
                         ? - 1) AS b
            FROM {rel}
            WHERE cached_tokens IS NOT NULL AND prompt_tokens > 0 AND {where}
        ), g AS (SELECT range AS b FROM range(?))
        SELECT g.b / ? AS bin_start, (g.b + 1) / ? AS bin_end, count(r.b) AS requests
        FROM g LEFT JOIN r ON r.b = g.b GROUP BY g.b ORDER BY g.b
    """, [bins, bins, *params, bins, float(bins), float(bins)]).df()


def cached_tokens_coverage(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                           end_s: float | None = None, models: Sequence[str] | None = None,
                           instances: Sequence[str] | None = None,
                           run_ids: Sequence[str] | None = None,
                           rollup: bool | None = None) -> pd.DataFrame:
    """How many requests reported ``cached_tokens``, per model and instance (from the
    per-minute rollup when it is current, ``rollup`` as in :func:`request_hit_rate_by_window`).

    Returns:
        Columns ``model, instance, requests, reported_requests, coverage`` (fraction);
        ordered by model, instance (NULLs last).
    """
    facts, params = _facts(con, start_s, end_s, models, instances, run_ids, rollup)
    return con.execute(f"""
        WITH a AS (
            SELECT model, instance, CAST(sum(requests) AS BIGINT) AS requests,
                   CAST(sum(reported_requests) AS BIGINT) AS reported_requests
            FROM {facts} f GROUP BY model, instance
        )
        SELECT model, instance, requests, reported_requests,
               CAST(reported_requests AS DOUBLE) / requests AS coverage
        FROM a WHERE requests > 0 ORDER BY model NULLS LAST, instance NULLS LAST
    """, params).df()


def request_filter_values(con: duckdb.DuckDBPyConnection) -> dict[str, object]:
    """Values for the dashboard's filters (from the per-minute rollup when it is current: the
    same values, ~50x fewer rows).

    Returns:
        ``{"models": [...], "instances": [...], "run_ids": [...], "production_instances": [...]}``
        (sorted, NULLs dropped; ``production_instances`` have ``run_id = ''`` rows) and
        ``"min_ts_unix_s"``/``"max_ts_unix_s"`` (None without timed requests),
        ``"production_max_ts_unix_s"`` (the newest of production, ``run_id = ''``; None).
    """
    table = "request_rollup_1m" if rollup_current(con) else "requests"
    lo_col, hi_col = (("min_ts_unix_s", "max_ts_unix_s") if table != "requests"
                      else ("ts_unix_s", "ts_unix_s"))

    def distinct(col: str) -> list[str]:
        return [r[0] for r in con.execute(
            f"SELECT DISTINCT {col} FROM {table} WHERE {col} IS NOT NULL ORDER BY 1").fetchall()]

    lo, hi, hi_prod = con.execute(
        f"SELECT min({lo_col}), max({hi_col}), max({hi_col}) FILTER (WHERE run_id = '') "
        f"FROM {table}").fetchone()
    lo = archive.with_archived_start(con, "requests", lo)
    production = [r[0] for r in con.execute(
        f"SELECT DISTINCT instance FROM {table} WHERE run_id = '' AND instance IS NOT NULL "
        "ORDER BY 1").fetchall()]
    return {"models": distinct("model"), "instances": distinct("instance"),
            "run_ids": distinct("run_id"), "production_instances": production,
            "min_ts_unix_s": lo, "max_ts_unix_s": hi, "production_max_ts_unix_s": hi_prod}


def request_flag_counts(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                        end_s: float | None = None) -> pd.DataFrame:
    """Requests per flag (``exclusive-input-suspected``, ``cache-exceeds-prompt``, ...).

    Returns:
        Columns ``flag, requests``; most frequent first.
    """
    where, params = _where(start_s, end_s, None, None, None)
    rel = archive.relation(con, "requests", start_s, end_s)
    return con.execute(f"""
        SELECT flag, count(*) AS requests
        FROM (SELECT unnest(string_split(flags, ',')) AS flag FROM {rel}
              WHERE flags IS NOT NULL AND {where})
        GROUP BY flag ORDER BY requests DESC, flag
    """, params).df()


# ---------------------------------------------------------------------------------------------
# The report line
# ---------------------------------------------------------------------------------------------

#: Default report range: this many seconds ending at the newest data point.
DEFAULT_REPORT_RANGE_S = 86400.0


@dataclass(frozen=True, slots=True)
class ReportLine:
    """One line of ``prefixscope report``.

    Attributes:
        model: the model, or None for the overall line.
        cached_tokens: tokens served from cache (counter hits, or Σ cached_tokens).
        prompt_tokens: the denominator (counter queries, or Σ prompt_tokens of reporting requests).
        hit_rate: cached / prompt, fraction in [0, 1] (None when prompt is 0).
        status: ``OK`` (cached >= threshold x prompt) or ``ALERT``
            (:func:`prefixscope.core.report.format_report_line`).
        text: ``608,000 of 644,000 prompt tokens from cache (94.4%): OK``.
        source: ``counters`` or ``requests`` (the overall line: ``mixed`` when its models'
            sources differ).
        requests, reported_requests: request counts (requests source only, else None).
        legacy: True when counters came from the old ``vllm:gpu_prefix_cache_*`` names.
    """

    model: str | None
    cached_tokens: int
    prompt_tokens: int
    hit_rate: float | None
    status: str
    text: str
    source: str
    requests: int | None = None
    reported_requests: int | None = None
    legacy: bool = False


@dataclass(frozen=True, slots=True)
class ReportResult:
    """Lines plus the range and source actually used (``start_s``/``end_s`` Unix seconds,
    half-open)."""

    lines: list[ReportLine]
    source: str
    start_s: float | None
    end_s: float | None


def _num(x) -> int:
    if x is None or pd.isna(x):  # None, NaN or pandas' NA (nullable Int64 columns)
        return 0
    return int(round(float(x)))


def has_counters(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str] | None) -> bool:
    """True when ``metric_samples`` holds any sample of these runs (None = any run): the
    ``auto`` source of ``report`` and ``hitrate`` then uses the counters, else the requests."""
    return _has_counters(con, run_ids)


def _has_counters(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str] | None) -> bool:
    try:
        if run_ids is None:
            row = con.execute("SELECT count(*) FROM metric_samples").fetchone()
        else:
            row = con.execute("SELECT count(*) FROM metric_samples WHERE "
                              "list_contains(?::VARCHAR[], run_id)", [list(run_ids)]).fetchone()
    except duckdb.CatalogException:
        return False
    return bool(row and row[0])


def _counter_lines(con, start_s, end_s, threshold, run_ids) -> list[ReportLine]:
    from prefixscope.store.queries.metrics import hit_rate_totals  # H1's module; imported lazily

    df = hit_rate_totals(con, start_s=start_s, end_s=end_s, by=("model",), run_ids=run_ids)
    lines: list[ReportLine] = []
    total_hit = total_query = 0
    any_legacy = False
    for row in df.itertuples(index=False):
        hit, query = _num(row.hit_tokens), _num(row.query_tokens)
        if query <= 0:
            continue
        legacy = bool(getattr(row, "legacy", False))
        any_legacy |= legacy
        status, text = format_report_line(hit, query, threshold)
        lines.append(ReportLine(row.model, hit, query, hit / query, status, text, "counters",
                                legacy=legacy))
        total_hit += hit
        total_query += query
    if lines:
        status, text = format_report_line(total_hit, total_query, threshold)
        lines.append(ReportLine(None, total_hit, total_query, total_hit / total_query, status,
                                text, "counters", legacy=any_legacy))
    return lines


def _request_lines(con, start_s, end_s, threshold, run_ids) -> list[ReportLine]:
    lines: list[ReportLine] = []
    for by in (("model",), ()):
        df = request_hit_rate_totals(con, start_s=start_s, end_s=end_s, by=by, run_ids=run_ids)
        for row in df.itertuples(index=False):
            cached, prompt = _num(row.cached_tokens), _num(row.reported_prompt_tokens)
            if prompt <= 0:
                continue
            status, text = format_report_line(cached, prompt, threshold)
            lines.append(ReportLine(getattr(row, "model", None) if by else None, cached, prompt,
                                    cached / prompt, status, text, "requests",
                                    requests=int(row.requests),
                                    reported_requests=int(row.reported_requests)))
    return lines


def _with_usage_log_models(con, lines: list[ReportLine], start_s, end_s, threshold,
                           run_ids) -> list[ReportLine]:
    """``source=auto`` with counters: a model without counter query tokens in the range but
    with reporting requests in the usage log (e.g. a model only the gateway logs) gets its line
    from the usage log (``source`` ``requests``), as the Overview does per model; the overall
    line then sums every model line (``source`` ``mixed`` when the sources differ)."""
    counted = {ln.model for ln in lines if ln.model is not None}
    extra = [ln for ln in _request_lines(con, start_s, end_s, threshold, run_ids)
             if ln.model is not None and ln.model not in counted]
    if not extra:
        return lines
    models = sorted([ln for ln in lines if ln.model is not None] + extra,
                    key=lambda ln: str(ln.model))
    hit = sum(ln.cached_tokens for ln in models)
    query = sum(ln.prompt_tokens for ln in models)
    status, text = format_report_line(hit, query, threshold)
    overall = next(ln for ln in lines if ln.model is None)
    return [*models, ReportLine(None, hit, query, hit / query, status, text, "mixed",
                                legacy=overall.legacy)]


def report_lines(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                 end_s: float | None = None, threshold: float = 0.5,
                 source: str = "auto",
                 run_ids: Sequence[str] | None = ("",)) -> list[ReportLine]:
    """The report lines, per model then one overall line (``model`` None).

    See :func:`report` for the range and source rules; this returns only the lines.
    """
    return report(con, start_s=start_s, end_s=end_s, threshold=threshold, source=source,
                  run_ids=run_ids).lines


def report(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
           end_s: float | None = None, threshold: float = 0.5,
           source: str = "auto",
           run_ids: Sequence[str] | None = ("",)) -> ReportResult:
    """Build the report: per model and overall, cached of prompt tokens and OK/ALERT.

    Only production traffic by default (``run_ids=("",)``): replay runs have their own run id
    and are compared on the Replay page; None reports every run together.

    Range: ``[start_s, end_s)``. When both are None the range is the
    :data:`DEFAULT_REPORT_RANGE_S` (24 h) ending at the whole second after the newest data
    point of the source (so the newest point is included and both bounds are whole seconds); with only one given, the other is unbounded.

    Source: ``counters`` = vLLM counter increases (``prefixscope.store.queries.metrics.hit_rate_totals``:
    Δhits / Δqueries, restarts handled); ``requests`` = Σ cached_tokens / Σ prompt_tokens over
    requests that reported cached tokens; ``auto`` = counters when there are counter samples
    giving query tokens in the range, else requests; with counters, a model that has no counter
    query tokens in the range but reporting requests gets its line from the requests (line
    ``source`` ``requests``; the overall line's ``source`` is then ``mixed``).

    Args:
        threshold: ALERT below this hit rate (fraction in [0, 1]).

    Returns:
        :class:`ReportResult`; ``lines`` is empty when the range has no prompt tokens.

    Raises:
        InvalidArgument: unknown source, threshold outside [0, 1], or start after end.
    """
    if source not in ("auto", "counters", "requests"):
        raise InvalidArgument(f"unknown source {source!r}: use auto, counters or requests")
    if not 0.0 <= threshold <= 1.0:
        raise InvalidArgument(f"threshold must be a fraction in [0, 1], got {threshold}")
    if start_s is not None and end_s is not None and start_s >= end_s:
        raise InvalidArgument("--start must be before --end")

    def default_range(newest: float | None) -> tuple[float | None, float | None]:
        if start_s is not None or end_s is not None or newest is None:
            return start_s, end_s
        # the whole second after the newest point: exact bounds (nextafter printed
        # "start_unix_s": 1796083185.0000002 in --json), the newest point still inside
        end = float(math.floor(float(newest)) + 1)
        return end - DEFAULT_REPORT_RANGE_S, end

    runs = None if run_ids is None else list(run_ids)
    run_filter = "" if runs is None else " WHERE list_contains(?::VARCHAR[], run_id)"
    run_params = [] if runs is None else [runs]
    use_counters = source == "counters" or (source == "auto" and _has_counters(con, run_ids))
    if use_counters:
        newest = None
        if start_s is None and end_s is None:
            newest = con.execute("SELECT max(ts_unix_s) FROM metric_samples" + run_filter,
                                 run_params).fetchone()[0]
        lo, hi = default_range(newest)
        lines = _counter_lines(con, lo, hi, threshold, run_ids)
        if lines and source == "auto":
            lines = _with_usage_log_models(con, lines, lo, hi, threshold, run_ids)
        if lines or source == "counters":
            return ReportResult(_hinted(con, lines, lo, hi, run_ids), "counters", lo, hi)
    newest = None
    if start_s is None and end_s is None:
        newest = con.execute("SELECT max(ts_unix_s) FROM requests" + run_filter,
                             run_params).fetchone()[0]
    lo, hi = default_range(newest)
    return ReportResult(_hinted(con, _request_lines(con, lo, hi, threshold, run_ids), lo, hi,
                                run_ids), "requests", lo, hi)


def _hinted(con: duckdb.DuckDBPyConnection, lines: list[ReportLine], start_s: float | None,
            end_s: float | None, run_ids: Sequence[str] | None) -> list[ReportLine]:
    """``lines`` with each ALERT line's hint from
    :func:`prefixscope.store.queries.alerts.alert_hints` of the range (the daily report's
    rule: a stored diagnosis, else what the decision log says of the misses, else ``check the
    top of the prompt``)."""
    from dataclasses import replace

    from prefixscope.core.report import ALERT, ALERT_HINT
    from prefixscope.store.queries.alerts import alert_hints

    if not any(ln.status == ALERT for ln in lines):
        return lines
    hints = alert_hints(con, start_s=start_s, end_s=end_s, run_ids=run_ids)
    tail = f": {ALERT_HINT}"
    out = []
    for ln in lines:
        if ln.status == ALERT and ln.text.endswith(tail):
            ln = replace(ln, text=ln.text[:-len(tail)] + ": " + hints.hint(ln.model))
        out.append(ln)
    return out


#: Kinds of ``runs`` whose rejected requests were sent with ``skip_reading_prefix_cache``: the
#: replay model's (``replay/gateway.py``). Production and the live gateway are not among them.
SKIP_READING_KINDS = ("replay-sim",)


def _skip_reading_runs(con: duckdb.DuckDBPyConnection,
                       run_ids: Sequence[str] | None) -> list[str]:
    """The runs of ``run_ids`` (None = every run) of a kind in :data:`SKIP_READING_KINDS`."""
    try:
        rows = con.execute("SELECT run_id FROM runs WHERE list_contains(?::VARCHAR[], kind)",
                           [list(SKIP_READING_KINDS)]).fetchall()
    except duckdb.CatalogException:
        return []
    kinds = {r[0] for r in rows}
    if run_ids is None:
        return sorted(kinds)
    return [r for r in run_ids if r in kinds]


def uncounted_by_counters(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                          end_s: float | None = None, models: Sequence[str] | None = None,
                          instances: Sequence[str] | None = None,
                          run_ids: Sequence[str] | None = ("",),
                          rollup: bool | None = None) -> dict[str, int]:
    """Requests that the per-request figure counts and vLLM's counters leave out: those a cache
    gateway rejected (``gateway_decisions.decision = 'reject'``), which it forwards with
    ``skip_reading_prefix_cache`` so that they read no cached block; vLLM does not count such a
    request in ``prefix_cache_queries``/``hits`` (vLLM 0.33 ``vllm/v1/request.py``,
    ``docs/metrics.md#counters-and-per-request-figures``).

    Returns:
        ``{"requests": n, "prompt_tokens": Σ prompt_tokens, "cached_tokens": Σ cached_tokens}``
        over the usage rows (filters as :func:`request_hit_rate_totals`) joined to a reject
        decision on (run_id, request_id); zeros without any (or without the decisions table).
        Only the rejects of the replay model's runs (``runs.kind = 'replay-sim'``,
        :data:`SKIP_READING_KINDS`) count: the live gateway (production, run ``''``) sends a
        reject with a salt unique to the request instead (``docs/gateway.md`` step 6), which
        vLLM counts as a query like any other.
        Without a model or instance filter, the whole 5-minute buckets of the range from the
        scope rollup when it is current and the parts at either end from the join
        (:func:`prefixscope.store.queries.scopes.rejected_usage_totals`; ``rollup`` None =
        then, False = the join only); with one, from the join (the rollup's model is the
        decision's, and it has no instance).
    """
    run_ids = _skip_reading_runs(con, run_ids)
    if not run_ids:
        return {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0}
    if models is None and instances is None:
        from prefixscope.store.queries.scopes import rejected_usage_totals

        got = rejected_usage_totals(con, start_s=start_s, end_s=end_s, run_ids=run_ids,
                                    rollup=rollup)
        if got is not None:
            out, parts = got
            for lo, hi in parts:
                part = uncounted_by_counters(con, start_s=lo, end_s=hi, run_ids=run_ids,
                                             rollup=False)
                out = {k: out[k] + part[k] for k in out}
            return out
    where, params = _where(start_s, end_s, models, instances, run_ids, alias="r")
    try:
        lo = None if start_s is None else float(start_s) - 86400.0  # partners a day apart
        hi = None if end_s is None else float(end_s) + 86400.0
        row = con.execute(
            "SELECT count(*), coalesce(sum(r.prompt_tokens), 0), coalesce(sum(r.cached_tokens), 0)"
            f" FROM {archive.relation(con, 'requests', start_s, end_s)} r "
            f"JOIN {archive.relation(con, 'gateway_decisions', lo, hi)} d"
            " ON d.run_id = r.run_id AND d.request_id = r.request_id"
            f" WHERE d.decision = 'reject' AND {where}", params).fetchall()[0]
    except duckdb.CatalogException:
        return {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0}
    return {"requests": int(row[0]), "prompt_tokens": int(row[1]), "cached_tokens": int(row[2])}


def counters_and_requests(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                          end_s: float | None = None, models: Sequence[str] | None = None,
                          instances: Sequence[str] | None = None,
                          run_ids: Sequence[str] | None = ("",),
                          request_totals: pd.DataFrame | None = None) -> dict[str, int]:
    """Both figures of the same selection and what the counters leave out, for the note shown
    wherever the two meet (``prefixscope.core.report.uncounted_note``).

    Args:
        request_totals: the :func:`request_hit_rate_totals` rows of the same selection grouped
            by any columns (Overview has them by model): summed instead of read again, the
            same figures (every request is in one group).

    Returns:
        ``counter_hit_tokens``, ``counter_query_tokens`` (Δ counters,
        :func:`prefixscope.store.queries.metrics.hit_rate_totals`), ``request_cached_tokens``,
        ``request_prompt_tokens`` (Σ of the requests reporting cached tokens,
        :func:`request_hit_rate_totals`), ``uncounted_requests``, ``uncounted_prompt_tokens``
        (:func:`uncounted_by_counters`); tokens, 0 when absent.
    """
    from prefixscope.store.queries.metrics import hit_rate_totals

    c = hit_rate_totals(con, start_s=start_s, end_s=end_s, by=(), models=models,
                        instances=instances, run_ids=run_ids)
    r = (request_totals if request_totals is not None else
         request_hit_rate_totals(con, start_s=start_s, end_s=end_s, by=(), models=models,
                                 instances=instances, run_ids=run_ids))
    u = uncounted_by_counters(con, start_s=start_s, end_s=end_s, models=models,
                              instances=instances, run_ids=run_ids)
    return {
        "counter_hit_tokens": _num(c["hit_tokens"].iloc[0]) if len(c) else 0,
        "counter_query_tokens": _num(c["query_tokens"].iloc[0]) if len(c) else 0,
        "request_cached_tokens": sum(_num(x) for x in r["cached_tokens"]),
        "request_prompt_tokens": sum(_num(x) for x in r["reported_prompt_tokens"]),
        "uncounted_requests": u["requests"], "uncounted_prompt_tokens": u["prompt_tokens"],
    }
