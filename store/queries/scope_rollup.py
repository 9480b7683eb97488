"""Maintenance of ``scope_rollup_5m`` (migration 75): the 5-bucket rollup of gateway decisions
joined to usage rows (:mod:`prefixscope.store.scope_sql`), read by
:mod:`prefixscope.store.queries.scopes`.

A join row's time is its usage row's ``ts_unix_s``, else its decision's; so a request that
arrives after its decision moves the row from the decision's bucket to the request's, and a
decision that arrives after its request changes that request's bucket. Both writers
(:func:`refresh_for_requests` from ``insert_request_rows``, :func:`refresh_for_decisions` from
``insert_decision_rows``) therefore recompute, from the tables, every 5-bucket bucket that
holds a row of the batch before or after the write (and the no-time bucket when it is touched): exact in
either order of arrival, for repeated rows and rows already stored. Runs inside the caller's
transaction.
"""

from __future__ import annotations

import duckdb

from prefixscope.store.queries import archive
from prefixscope.store.scope_sql import (BUCKET_SQL, ON_KEY, ROLLUP_COLUMNS, ROLLUP_DIMS, ROLLUP_S,
                                         ROLLUP_SELECT_SQL, ROWS_SQL)

_COLS = ", ".join(ROLLUP_COLUMNS)
_IN_BUCKETS = (f"ts_unix_s >= ? AND ts_unix_s < ? AND {BUCKET_SQL} IN "
               "(SELECT b FROM _ps_scope_buckets)")


def _recompute(con: duckdb.DuckDBPyConnection, *, untimed: bool) -> None:
    """Recompute the rollup rows of the buckets in temp table ``_ps_scope_buckets (b)``, and of
    the no-time bucket when ``untimed``."""
    lo, hi = con.execute("SELECT min(b), max(b) FROM _ps_scope_buckets").fetchone()
    if lo is not None:
        rng = [float(lo), float(hi) + ROLLUP_S]
        con.execute("DELETE FROM scope_rollup_5m WHERE bucket_start_s >= ? AND bucket_start_s <= ?"
                    " AND bucket_start_s IN (SELECT b FROM _ps_scope_buckets)", [lo, hi])
        # the tables, and the archive for buckets of archived days (a late row recomputes a
        # bucket that also counts archived rows); partners up to a day apart
        d_rel = archive.relation(con, "gateway_decisions", rng[0] - 86400.0, rng[1] + 86400.0)
        r_rel = archive.relation(con, "requests", rng[0] - 86400.0, rng[1] + 86400.0)
        # rows whose usage row is in these buckets, with their decision if any
        usage = ROWS_SQL.format(source=f"{d_rel} d RIGHT JOIN (SELECT * FROM {r_rel} "
                                       f"WHERE {_IN_BUCKETS}) r ON {ON_KEY}")
        con.execute(f"INSERT INTO scope_rollup_5m ({_COLS}) "
                    + ROLLUP_SELECT_SQL.format(rows=usage, where="TRUE"), rng)
        # decisions in these buckets without a timed usage row
        dec = ROWS_SQL.format(source=f"(SELECT * FROM {d_rel} WHERE {_IN_BUCKETS}) d "
                                     f"LEFT JOIN {r_rel} r ON {ON_KEY} "
                                     "WHERE r.ts_unix_s IS NULL")
        con.execute(f"INSERT INTO scope_rollup_5m ({_COLS}) "
                    + ROLLUP_SELECT_SQL.format(rows=dec, where="TRUE"), rng)
    if untimed:
        con.execute("DELETE FROM scope_rollup_5m WHERE bucket_start_s IS NULL")
        rows = ROWS_SQL.format(source="gateway_decisions d RIGHT JOIN (SELECT * FROM requests "
                                      f"WHERE ts_unix_s IS NULL) r ON {ON_KEY} "
                                      "WHERE d.request_id IS NULL")
        con.execute(f"INSERT INTO scope_rollup_5m ({_COLS}) "
                    + ROLLUP_SELECT_SQL.format(rows=rows, where="TRUE"))
    con.execute("DROP TABLE IF EXISTS _ps_scope_buckets").fetchall()


#: Rollup rows of usage rows without a decision, from a relation ``{rows}`` of ``requests``
#: rows: :data:`ROLLUP_SELECT_SQL` over :data:`ROWS_SQL` when no decision joins, written out
#: (every decision column NULL, so the invariant counts are 0).
_USAGE_ONLY_SQL = (
    f"SELECT {BUCKET_SQL} AS bucket_start_s, run_id, model, COALESCE(scope, 'UNSCOPED') AS scope, "
    "tenant_digest AS namespace_digest, CAST(NULL AS VARCHAR) AS decision, "
    "CAST(NULL AS VARCHAR) AS first_mismatch, CAST(NULL AS VARCHAR) AS refused, "
    "count(*) AS requests, count(*) AS usage_rows, "
    "count(cached_tokens) AS reported_requests, "
    "CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens, "
    "CAST(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS BIGINT) "
    "AS reported_prompt_tokens, CAST(sum(cached_tokens) AS BIGINT) AS cached_tokens, "
    "CAST(NULL AS BIGINT) AS accepted_cached_tokens, "
    "CAST(NULL AS BIGINT) AS candidate_cached_tokens, "
    "CAST(sum(prompt_tokens - cached_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS BIGINT)"
    " AS miss_tokens, "
    + ", ".join(f"CAST(0 AS BIGINT) AS {n}" for n in ROLLUP_COLUMNS[-4:])
    + " FROM {rows} GROUP BY ALL")
_NDIMS = 1 + len(ROLLUP_DIMS)  # bucket_start_s and the grouping columns
_SUMMED = ROLLUP_COLUMNS[_NDIMS:]  # every measure adds (counts, and sums that are NULL when empty)


def _add_usage_only(con: duckdb.DuckDBPyConnection, batch: str) -> None:
    """``scope_rollup_5m`` += the rows of ``batch`` (all new, no decision stored at all, nothing
    archived): its aggregates merged with the stored rows of its buckets (the no-time bucket
    included), the same numbers as :func:`_recompute` without reading ``requests`` and the
    decision join again."""
    con.execute("CREATE OR REPLACE TEMP TABLE _ps_scope_fresh AS "
                + _USAGE_ONLY_SQL.format(rows=batch))
    lo, hi, untimed = con.execute(
        "SELECT min(bucket_start_s), max(bucket_start_s), bool_or(bucket_start_s IS NULL) "
        "FROM _ps_scope_fresh").fetchone()
    if lo is not None or untimed:
        timed = ("FALSE" if lo is None else
                 f"(bucket_start_s >= {float(lo)!r} AND bucket_start_s <= {float(hi)!r} AND "
                 "bucket_start_s IN (SELECT bucket_start_s FROM _ps_scope_fresh))")
        in_buckets = f"({timed} OR bucket_start_s IS NULL)" if untimed else timed
        sums = ", ".join(f"sum({c}) AS {c}" for c in _SUMMED)
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _ps_scope_merged AS
            SELECT {', '.join(ROLLUP_COLUMNS[:_NDIMS])}, {sums}
            FROM (SELECT {_COLS} FROM _ps_scope_fresh UNION ALL
                  SELECT {_COLS} FROM scope_rollup_5m WHERE {in_buckets})
            GROUP BY ALL
        """)
        con.execute(f"DELETE FROM scope_rollup_5m WHERE {in_buckets}")
        con.execute(f"INSERT INTO scope_rollup_5m ({_COLS}) SELECT {_COLS} FROM _ps_scope_merged")
        con.execute("DROP TABLE _ps_scope_merged").fetchall()
    con.execute("DROP TABLE _ps_scope_fresh").fetchall()


def refresh_for_requests(con: duckdb.DuckDBPyConnection, batch: str, *,
                         all_new: bool = False) -> None:
    """After a batch of requests was written: recompute the buckets of the batch's times and of
    the stored decisions of the same requests (the rows that move to the request's bucket).

    When every row of the batch was added (``all_new``), no decision is stored or archived and
    no request is archived (the usage ingest of a deployment without the gateway), the batch's
    aggregates are added to the stored rows of its buckets instead (:func:`_add_usage_only`:
    the same numbers; the recompute's join and invariant predicates cost the usage ingest
    about 5% of its time).

    Args:
        batch: a registered relation with ``run_id, request_id, ts_unix_s`` (Unix s), and
            for ``all_new`` the ``requests`` columns ``model, scope, tenant_digest,
            prompt_tokens, cached_tokens``.
    """
    any_decision = con.execute("SELECT EXISTS (SELECT 1 FROM gateway_decisions)").fetchone()[0]
    if all_new and not any_decision and archive.archived_rows(con, "requests") == 0 \
            and archive.archived_rows(con, "gateway_decisions") == 0:
        _add_usage_only(con, batch)
        return
    moved = ""
    if any_decision:
        moved = (f" UNION SELECT floor(d.ts_unix_s / 300.0) * 300.0 FROM gateway_decisions d "
                 f"JOIN {batch} r ON {ON_KEY}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _ps_scope_buckets AS SELECT DISTINCT {BUCKET_SQL} "
                f"AS b FROM {batch} WHERE ts_unix_s IS NOT NULL{moved}")
    untimed = con.execute(f"SELECT coalesce(bool_or(ts_unix_s IS NULL), FALSE) FROM {batch}"
                          ).fetchone()[0]
    _recompute(con, untimed=bool(untimed))


def refresh_for_decisions(con: duckdb.DuckDBPyConnection, batch: str) -> None:
    """After a batch of decisions was written: recompute the buckets of the decisions' times
    and of the stored usage rows of the same requests (those rows gain the decision), and the
    no-time bucket when one of those usage rows has no time.

    Args:
        batch: a registered relation with ``run_id, request_id, ts_unix_s``.
    """
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ps_scope_match AS
        SELECT r.ts_unix_s FROM {batch} d JOIN requests r ON {ON_KEY}
    """)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _ps_scope_buckets AS SELECT DISTINCT {BUCKET_SQL} "
                f"AS b FROM {batch} UNION SELECT {BUCKET_SQL} FROM _ps_scope_match "
                "WHERE ts_unix_s IS NOT NULL")
    untimed = con.execute("SELECT coalesce(bool_or(ts_unix_s IS NULL), FALSE) FROM "
                          "_ps_scope_match").fetchone()[0]
    con.execute("DROP TABLE _ps_scope_match").fetchall()
    _recompute(con, untimed=bool(untimed))


def rebuild(con: duckdb.DuckDBPyConnection) -> int:
    """Rebuild ``scope_rollup_5m`` from every stored decision and request (after rows were
    written with SQL). Runs in the caller's transaction.

    Returns:
        Rollup rows written.
    """
    from prefixscope.store.scope_sql import ROLLUP_FILL_SQL

    con.execute("DELETE FROM scope_rollup_5m")
    row = con.execute(ROLLUP_FILL_SQL).fetchone()
    return int(row[0]) if row else 0


def current(con: duckdb.DuckDBPyConnection) -> bool:
    """True when ``scope_rollup_5m`` counts every stored request and decision (its
    ``usage_rows`` sum to the rows of ``requests``, its decided rows to the rows of
    ``gateway_decisions``, archived rows included): the queries then read it."""
    try:
        n_r, n_d, u, d = con.execute("""
            SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM gateway_decisions),
                   coalesce(sum(usage_rows), 0),
                   coalesce(sum(requests) FILTER (WHERE decision IS NOT NULL), 0)
            FROM scope_rollup_5m""").fetchone()
    except duckdb.CatalogException:
        return False
    n_r = int(n_r) + archive.archived_rows(con, "requests")  # archived: still counted here
    n_d = int(n_d) + archive.archived_rows(con, "gateway_decisions")
    return n_r == int(u) and n_d == int(d)
