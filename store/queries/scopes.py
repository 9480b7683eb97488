"""Queries on cache scope and acceptance: gateway decisions joined to usage rows.

Tables: ``gateway_decisions`` and ``gateway_events`` (migration 5, ``ingest/decisions.py``),
joined to ``requests`` on ``(run_id, request_id)``. Definitions (``docs/scopes.md#formulas``):

- Every request of either table is one row of the join. ``scope`` and ``namespace_digest`` come
  from the decision when there is one, else from the usage row (``requests.scope``,
  ``requests.tenant_digest``); a request with neither has scope ``UNSCOPED``.
- ``cached_tokens`` (= **saved prefill tokens**) are the tokens the engine reported from cache
  (usage ``cached_tokens``); ``hit_rate`` = Σ cached_tokens / Σ prompt_tokens over requests that
  reported cached tokens (a fraction, NULL when that sum is 0).
- ``accepted_cached_tokens`` / ``candidate_cached_tokens``: what the gateway accepted / could
  have supplied, from the decision log.
- A rejection's class follows its first mismatching field: ``cross_scope`` (scope, namespace,
  salt), ``version`` (model, tokenizer, runtime, adapter, prompt bundle, toolset digests, policy
  revision), ``generation`` (authorization epoch, cache epoch), ``collision`` (content digest).
- The three invariants (each must be 0) are computed from the logged digests, not from the
  gateway's own verdict, plus the usage join:
  *cross-scope acceptance* = accepts whose candidate scope or namespace differs from the
  request's, plus rejects of class cross_scope whose usage still shows cached tokens;
  *wrong-version acceptance* = accepts whose candidate content/version digests or policy
  revision differ, plus rejects of class version/collision with cached tokens;
  *old-generation use* = accepts whose candidate authorization or cache epoch differs, plus
  rejects of class generation with cached tokens. Candidate fields absent from a log are not
  compared (such accepts are counted as ``unverifiable_accepts``).

Filters: ``start_s <= ts_unix_s < end_s`` (None = unbounded); ``run_ids``, ``models``,
``instances``, ``scopes``, ``namespaces`` (None = all). Windows ``[window_start_s,
window_start_s + window_s)`` aligned to ``origin_s + k * window_s``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import duckdb
import pandas as pd

from prefixscope.core.errors import InvalidArgument
from prefixscope.store import scope_sql
from prefixscope.store.queries import archive, scope_rollup
from prefixscope.store.scope_sql import (COLLISION_REASONS, CROSS_SCOPE_REASONS,  # noqa: F401
                                         GENERATION_REASONS, INVARIANTS, VERSION_REASONS)
from prefixscope.store.scope_sql import VERSION_COLUMNS as _VERSION_COLUMNS
from prefixscope.store.sqlhelpers import bucket_split, window_start_sql

GROUPABLE = ("scope", "namespace_digest", "model", "instance", "run_id")

#: The rows of the gateway run of production traffic (``run_id`` ``''``): the requests with a
#: gateway decision (refused ones included: they have one), the selection whose span
#: ``run_list(with_decisions=True)`` gives; the usage rows of other production traffic (no
#: decision, scope ``UNSCOPED``) are not that run's. Other runs are kept whole. A condition on
#: the joined rows and on ``scope_rollup_5m`` alike (``decision`` NULL = no decision).
DECIDED_PRODUCTION_SQL = "(run_id <> '' OR decision IS NOT NULL)"

#: How far apart a request's decision and usage row may lie in time and still be joined when
#: one of them is archived: the archive is read this much beyond the range on either side.
PAIR_SKEW_S = 86400.0


def _production_decision_span(con: duckdb.DuckDBPyConnection) -> tuple[float, float] | None:
    """First and last ``ts_unix_s`` of the production run's decisions (run ``''``), or None
    when there are none or some are archived (the span is then not read from the table)."""
    if archive.archived_rows(con, "gateway_decisions"):
        return None
    lo, hi = con.execute("SELECT min(ts_unix_s), max(ts_unix_s) FROM gateway_decisions "
                         "WHERE run_id = ''").fetchall()[0]
    return None if lo is None else (float(lo), float(hi))


def _side_range(con: duckdb.DuckDBPyConnection, start_s: float | None, end_s: float | None,
                run_ids: Sequence[str] | None, decided_production: bool
                ) -> tuple[float | None, float | None]:
    """The times ``[lo, hi)`` each side of the join is read within (None = unbounded): the
    range widened by :data:`PAIR_SKEW_S` on either side, so that a row inside it meets its
    partner; for the production gateway run alone (``decided_production`` and ``run_ids``
    ``['']``: its rows are its decisions and their usage rows) also the span of its decisions
    so widened, so that a short live run after a month of usage rows reads a day either side
    of its span, not the month (docs/benchmarks.md "Dashboard at scale", session 8)."""
    lo = None if start_s is None else float(start_s) - PAIR_SKEW_S
    hi = None if end_s is None else float(end_s) + PAIR_SKEW_S
    if decided_production and run_ids is not None and {str(r) for r in run_ids} == {""}:
        span = _production_decision_span(con)
        if span is not None:
            first, last = span[0] - PAIR_SKEW_S, span[1] + PAIR_SKEW_S + 1.0
            lo = first if lo is None else max(lo, first)
            hi = last if hi is None else min(hi, last)
    return lo, hi


def _sources(con: duckdb.DuckDBPyConnection, start_s: float | None,
             end_s: float | None, *, run_ids: Sequence[str] | None = None,
             decided_production: bool = False) -> tuple[str, str]:
    """The relations of ``gateway_decisions`` and ``requests`` for a range (the tables, and the
    archive's Parquet files of the days the range reaches, :func:`archive.relation`), read
    within :func:`_side_range` (:data:`PAIR_SKEW_S` beyond the range, so that a row inside
    joins its partner just outside; a usage row without a time is always read). The filter
    sits on each table's own ``ts_unix_s``, so DuckDB prunes the row groups outside it (a
    filter on the joined rows' ``COALESCE`` time is not pushed into either scan)."""
    lo, hi = _side_range(con, start_s, end_s, run_ids, decided_production)
    d = archive.relation(con, "gateway_decisions", lo, hi)
    r = archive.relation(con, "requests", lo, hi)
    if lo is None and hi is None:
        return d, r
    cond = " AND ".join([*([f"ts_unix_s >= {lo!r}"] if lo is not None else []),
                         *([f"ts_unix_s < {hi!r}"] if hi is not None else [])])
    return (f"(SELECT * FROM {d} WHERE {cond})",
            f"(SELECT * FROM {r} WHERE ({cond}) OR ts_unix_s IS NULL)")


def _joined(con: duckdb.DuckDBPyConnection, start_s: float | None, end_s: float | None,
            **side: Any) -> str:
    """:data:`prefixscope.store.scope_sql.JOINED_SQL` over :func:`_sources` (every request of
    either table once, archived rows included when the range reaches them; ``side``:
    ``run_ids``, ``decided_production`` as in :func:`_side_range`)."""
    d, r = _sources(con, start_s, end_s, **side)
    return scope_sql.ROWS_SQL.format(source=f"{d} d FULL OUTER JOIN {r} r ON {scope_sql.ON_KEY}")

_CLASS = """CASE
    WHEN decision <> 'reject' THEN NULL
    WHEN list_contains(?, first_mismatch) THEN 'cross_scope'
    WHEN list_contains(?, first_mismatch) THEN 'version'
    WHEN list_contains(?, first_mismatch) THEN 'generation'
    ELSE 'collision' END"""
_CLASS_PARAMS = [CROSS_SCOPE_REASONS, VERSION_REASONS, GENERATION_REASONS]


def _filters(*, start_s: float | None, end_s: float | None, run_ids: Sequence[str] | None,
             models: Sequence[str] | None = None, instances: Sequence[str] | None = None,
             scopes: Sequence[str] | None = None,
             namespaces: Sequence[str] | None = None,
             decided_production: bool = False) -> tuple[str, list[Any]]:
    parts = ["TRUE"]
    params: list[Any] = []
    if decided_production:  # the gateway run of production traffic: its decided requests only
        parts.append(DECIDED_PRODUCTION_SQL)
    if start_s is not None:
        parts.append("ts_unix_s >= ?")
        params.append(float(start_s))
    if end_s is not None:
        parts.append("ts_unix_s < ?")
        params.append(float(end_s))
    for col, values in (("run_id", run_ids), ("model", models), ("instance", instances),
                        ("scope", scopes), ("namespace_digest", namespaces)):
        if values is not None:
            parts.append(f"list_contains(?, {col})")
            params.append(list(values))
    return " AND ".join(parts), params


def _side(run_ids: Sequence[str] | None, decided_production: bool = False) -> dict[str, Any]:
    """The keywords of :func:`_sources` a query passes on (its run filter and row selection)."""
    return {"run_ids": run_ids, "decided_production": bool(decided_production)}


def _base(con: duckdb.DuckDBPyConnection, start_s: float | None, end_s: float | None,
          where: str, **side: Any) -> str:
    """The joined rows of ``[start_s, end_s)`` (``where`` from :func:`_filters` of the same
    range and ``side``, the ``run_ids`` and ``decided_production`` of that call), archive
    included."""
    return (f"SELECT * FROM ({_joined(con, start_s, end_s, **side)}) j "
            f"WHERE ts_unix_s IS NOT NULL AND {where}")


def _base_decided(con: duckdb.DuckDBPyConnection, start_s: float | None, end_s: float | None,
                  where: str, **side: Any) -> str:
    """As :func:`_base` for the rows with a decision only (decisions LEFT JOIN usage: the same
    rows, without joining every usage row)."""
    d, r = _sources(con, start_s, end_s, **side)
    rows = scope_sql.ROWS_SQL.format(source=f"{d} d LEFT JOIN {r} r ON {scope_sql.ON_KEY}")
    return f"SELECT * FROM ({rows}) j WHERE ts_unix_s IS NOT NULL AND {where}"


_NO_ROWS = scope_sql.ROWS_SQL.format(
    source="(SELECT * FROM gateway_decisions LIMIT 0) d LEFT JOIN (SELECT * FROM requests "
           f"LIMIT 0) r ON {scope_sql.ON_KEY}")


def _by(by: Sequence[str]) -> list[str]:
    cols = list(by)
    bad = [c for c in cols if c not in GROUPABLE]
    if bad:
        raise InvalidArgument(f"cannot group scopes by {bad}: choose from {list(GROUPABLE)}")
    return cols


_AGG = """
    count(*) FILTER (WHERE refused IS NULL) AS requests,
    count(*) FILTER (WHERE has_decision AND refused IS NULL) AS decided_requests,
    count(*) FILTER (WHERE cached_tokens IS NOT NULL) AS reported_requests,
    COALESCE(sum(prompt_tokens), 0)::BIGINT AS prompt_tokens,
    COALESCE(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0)::BIGINT
        AS reported_prompt_tokens,
    COALESCE(sum(cached_tokens), 0)::BIGINT AS cached_tokens,
    COALESCE(sum(accepted_cached_tokens), 0)::BIGINT AS accepted_cached_tokens,
    COALESCE(sum(candidate_cached_tokens), 0)::BIGINT AS candidate_cached_tokens,
    count(*) FILTER (WHERE decision = 'accept' AND refused IS NULL) AS accepts,
    count(*) FILTER (WHERE decision = 'reject' AND refused IS NULL) AS rejects,
    count(*) FILTER (WHERE decision = 'miss' AND refused IS NULL) AS misses,
    count(*) FILTER (WHERE refused IS NOT NULL) AS refused_requests
"""
_RATE = """, cached_tokens AS saved_prefill_tokens,
    CASE WHEN reported_prompt_tokens > 0
         THEN cached_tokens::DOUBLE / reported_prompt_tokens END AS hit_rate"""


# --- the 5-minute rollup (migration 75, ``scope_rollup_5m``) ------------------------------

_ROLLUP_COLS = ", ".join(scope_sql.ROLLUP_COLUMNS)
#: The measures of :data:`_AGG` summed over rollup-shaped rows.
_FAGG = """
    CAST(COALESCE(sum(requests) FILTER (WHERE refused IS NULL), 0) AS BIGINT) AS requests,
    CAST(COALESCE(sum(requests) FILTER (WHERE decision IS NOT NULL AND refused IS NULL), 0)
         AS BIGINT) AS decided_requests,
    CAST(COALESCE(sum(reported_requests), 0) AS BIGINT) AS reported_requests,
    COALESCE(sum(prompt_tokens), 0)::BIGINT AS prompt_tokens,
    COALESCE(sum(reported_prompt_tokens), 0)::BIGINT AS reported_prompt_tokens,
    COALESCE(sum(cached_tokens), 0)::BIGINT AS cached_tokens,
    COALESCE(sum(accepted_cached_tokens), 0)::BIGINT AS accepted_cached_tokens,
    COALESCE(sum(candidate_cached_tokens), 0)::BIGINT AS candidate_cached_tokens,
    CAST(COALESCE(sum(requests) FILTER (WHERE decision = 'accept' AND refused IS NULL), 0)
         AS BIGINT) AS accepts,
    CAST(COALESCE(sum(requests) FILTER (WHERE decision = 'reject' AND refused IS NULL), 0)
         AS BIGINT) AS rejects,
    CAST(COALESCE(sum(requests) FILTER (WHERE decision = 'miss' AND refused IS NULL), 0)
         AS BIGINT) AS misses,
    CAST(COALESCE(sum(requests) FILTER (WHERE refused IS NOT NULL), 0) AS BIGINT)
        AS refused_requests
"""


def _facts(con: duckdb.DuckDBPyConnection, *, rollup: bool | None, start_s: float | None,
           end_s: float | None, window_s: float | None = None, origin_s: float = 0.0,
           by: Sequence[str] = (), **dims: Sequence[str] | None) -> tuple[str, list[Any]] | None:
    """A subquery of rollup-shaped rows (``bucket_start_s`` and the measures of
    :data:`prefixscope.store.scope_sql.ROLLUP_COLUMNS`, timed rows only) for the range and
    filters: ``scope_rollup_5m`` rows for the whole 5-minute buckets inside ``[start_s,
    end_s)`` and rows aggregated from the join for the part buckets at either end; summed, they
    give the numbers of the join. None when the rollup cannot serve the call (``rollup``
    False; None and the rollup not :func:`~prefixscope.store.queries.scope_rollup.current`;
    windows not whole buckets; a range inside one bucket; an instance filter or grouping:
    the rollup has no instance): the caller then reads the join."""
    if rollup is False or dims.get("instances") is not None or "instance" in by:
        return None
    if window_s is not None and (float(window_s) % scope_sql.ROLLUP_S
                                 or float(origin_s) % scope_sql.ROLLUP_S):
        return None
    split = bucket_split(start_s, end_s, scope_sql.ROLLUP_S)
    if split is None:
        return None
    if rollup is None and not scope_rollup.current(con):
        return None
    gwhere, gparams = _filters(start_s=None, end_s=None, **dims)
    whole, whole_params = split.whole_where("bucket_start_s")
    parts = [f"SELECT {_ROLLUP_COLS} FROM scope_rollup_5m WHERE {gwhere} AND "
             f"bucket_start_s IS NOT NULL AND {whole}"]
    params = [*gparams, *whole_params]
    for part, bound, cmp in ((split.head, split.lo, "<"), (split.tail, split.hi, ">=")):
        if part is None:
            continue
        where, p = _filters(start_s=start_s, end_s=end_s if cmp == ">=" else None, **dims)
        parts.append(scope_sql.ROLLUP_SELECT_SQL.format(
            rows=_joined(con, *part, run_ids=dims.get("run_ids"),
                         decided_production=bool(dims.get("decided_production"))),
            where=f"ts_unix_s IS NOT NULL AND {where} AND "
                                            f"{scope_sql.BUCKET_SQL} {cmp} ?"))
        params += [*p, bound]
    return "(" + " UNION ALL ".join(parts) + ")", params



def rejected_usage_totals(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                          end_s: float | None = None, run_ids: Sequence[str] | None = None,
                          rollup: bool | None = None
                          ) -> tuple[dict[str, int], list[tuple[float | None, float]]] | None:
    """Usage rows whose request has a ``reject`` decision, in the whole 5-minute buckets of
    ``[start_s, end_s)``, from the rollup (``usage_rows``, ``prompt_tokens``, ``cached_tokens``
    of its reject rows; ``rollup`` as in :func:`hit_rate_by_scope_window`): the figure of
    :func:`prefixscope.store.queries.requests.uncounted_by_counters` without joining every
    request (1.0 s at 10 M requests and 2 M decisions, benchmarks/dashboard_scale.py).

    A usage row without a time is in the rollup at its decision's time; for a bounded range
    it is taken out again (the join's figure filters on the usage row's time).

    Returns:
        (``{"requests", "prompt_tokens", "cached_tokens"}`` of the whole buckets (tokens), the
        ``(start_s, end_s)`` parts at either end that the caller reads from the join), or None
        when the rollup cannot serve the call (not current, ``rollup`` False, a range inside
        one bucket).
    """
    if rollup is False:
        return None
    split = bucket_split(start_s, end_s, scope_sql.ROLLUP_S)
    if split is None or (rollup is None and not scope_rollup.current(con)):
        return None
    gwhere, gparams = _filters(start_s=None, end_s=None, run_ids=run_ids)
    whole, whole_params = split.whole_where("bucket_start_s")
    row = con.execute(f"""
        SELECT coalesce(sum(usage_rows), 0), coalesce(sum(prompt_tokens), 0),
               coalesce(sum(cached_tokens), 0)
        FROM scope_rollup_5m
        WHERE decision = 'reject' AND bucket_start_s IS NOT NULL AND {gwhere} AND {whole}""",
                      [*gparams, *whole_params]).fetchall()[0]
    out = [int(v) for v in row]
    if start_s is not None or end_s is not None:
        # a usage row without a time sits in the rollup at its decision's time; the join's
        # figure of a bounded range leaves it out (its time is not in the range)
        dec = archive.relation(con, "gateway_decisions", split.lo, split.hi)
        dwhole, dparams = split.whole_where("d.bucket_start_s")
        untimed = con.execute(f"""
            SELECT count(*), coalesce(sum(r.prompt_tokens), 0), coalesce(sum(r.cached_tokens), 0)
            FROM (SELECT * FROM requests WHERE ts_unix_s IS NULL AND {gwhere}) r
            JOIN (SELECT run_id, request_id, {scope_sql.BUCKET_SQL} AS bucket_start_s
                  FROM {dec} WHERE decision = 'reject') d ON {scope_sql.ON_KEY}
            WHERE {dwhole}""", [*gparams, *dparams]).fetchall()[0]
        out = [a - int(b) for a, b in zip(out, untimed)]
    parts = [p for p in (split.head, split.tail) if p is not None]
    return dict(zip(("requests", "prompt_tokens", "cached_tokens"), out)), parts


def hit_rate_by_scope_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                             end_s: float | None = None, window_s: float = 3600,
                             by: Sequence[str] = ("scope",),
                             run_ids: Sequence[str] | None = None,
                             models: Sequence[str] | None = None,
                             instances: Sequence[str] | None = None,
                             scopes: Sequence[str] | None = None,
                             namespaces: Sequence[str] | None = None,
                             origin_s: float = 0.0, rollup: bool | None = None,
                             decided_production: bool = False) -> pd.DataFrame:
    """Hit rate and saved prefill tokens by scope (and/or namespace digest) per time window.

    Args:
        by: grouping columns from :data:`GROUPABLE` (``scope``, ``namespace_digest``, ...).
        window_s: window length in seconds (> 0).
        rollup: read the 5-minute rollup (``scope_rollup_5m``; None = when it is current,
            ``window_s`` and ``origin_s`` are whole 5 minutes and no instance is filtered or
            grouped by; False = the join itself). Both give the same numbers.
        decided_production: of production traffic (run ``''``) only the requests with a
            gateway decision, the gateway run (:data:`DECIDED_PRODUCTION_SQL`; the Scopes and
            Rejections pages); other runs whole. The same keyword on every query of the pages.

    Returns:
        Columns ``window_start_s, window_end_s, <by...>, requests, decided_requests,
        reported_requests, prompt_tokens, reported_prompt_tokens, cached_tokens`` (tokens),
        ``accepted_cached_tokens, candidate_cached_tokens`` (tokens), ``accepts, rejects,
        misses`` (requests), ``saved_prefill_tokens`` (= cached_tokens) and ``hit_rate``
        (fraction, NULL when no reported prompt tokens). Oldest window first.

    Raises:
        InvalidArgument: ``window_s`` not positive or a ``by`` column not groupable.
    """
    if not window_s or window_s <= 0:
        raise InvalidArgument(f"window_s must be positive, got {window_s}")
    cols = _by(by)
    dims = dict(run_ids=run_ids, models=models, instances=instances, scopes=scopes,
                namespaces=namespaces, decided_production=decided_production)
    sel = "".join(f", {c}" for c in cols)
    facts = _facts(con, rollup=rollup, start_s=start_s, end_s=end_s, window_s=window_s,
                   origin_s=origin_s, by=cols, **dims)
    if facts is not None:
        fsql, fparams = facts
        window_start, window_params = window_start_sql("bucket_start_s", window_s=window_s,
                                                       origin_s=origin_s)
        sql = f"""
            WITH w AS (SELECT {window_start} AS window_start_s, * FROM {fsql}),
                 a AS (SELECT window_start_s{sel}, {_FAGG} FROM w GROUP BY ALL)
            SELECT window_start_s, window_start_s + ? AS window_end_s{sel},
                   * EXCLUDE (window_start_s{sel}){_RATE}
            FROM a ORDER BY window_start_s{sel}
        """
        return con.execute(sql, [*window_params, *fparams, float(window_s)]).df()
    where, params = _filters(start_s=start_s, end_s=end_s, **dims)
    window_start, window_params = window_start_sql("ts_unix_s", window_s=window_s,
                                                   origin_s=origin_s)
    sql = f"""
        WITH w AS (SELECT {window_start} AS window_start_s, *
                   FROM ({_base(con, start_s, end_s, where, **_side(run_ids, decided_production))})),
             a AS (SELECT window_start_s{sel}, {_AGG} FROM w GROUP BY ALL)
        SELECT window_start_s, window_start_s + ? AS window_end_s{sel},
               * EXCLUDE (window_start_s{sel}){_RATE}
        FROM a ORDER BY window_start_s{sel}
    """
    p = [*window_params, *params, float(window_s)]
    return con.execute(sql, p).df()


def hit_rate_by_scope_totals(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                             end_s: float | None = None, by: Sequence[str] = ("scope",),
                             run_ids: Sequence[str] | None = None,
                             models: Sequence[str] | None = None,
                             instances: Sequence[str] | None = None,
                             scopes: Sequence[str] | None = None,
                             namespaces: Sequence[str] | None = None,
                             rollup: bool | None = None,
                             decided_production: bool = False) -> pd.DataFrame:
    """As :func:`hit_rate_by_scope_window` over the whole range: one row per group, largest
    ``prompt_tokens`` first."""
    cols = _by(by)
    dims = dict(run_ids=run_ids, models=models, instances=instances, scopes=scopes,
                namespaces=namespaces, decided_production=decided_production)
    sel = ", ".join(cols)
    facts = _facts(con, rollup=rollup, start_s=start_s, end_s=end_s, by=cols, **dims)
    if facts is not None:
        fsql, fparams = facts
        sql = f"""
            WITH a AS (SELECT {sel}, {_FAGG} FROM {fsql} GROUP BY ALL)
            SELECT *{_RATE} FROM a ORDER BY prompt_tokens DESC, {sel}
        """
        return con.execute(sql, fparams).df()
    where, params = _filters(start_s=start_s, end_s=end_s, **dims)
    sql = f"""
        WITH a AS (SELECT {sel}, {_AGG}
                   FROM ({_base(con, start_s, end_s, where, **_side(run_ids, decided_production))})
                   GROUP BY ALL)
        SELECT *{_RATE} FROM a ORDER BY prompt_tokens DESC, {sel}
    """
    return con.execute(sql, params).df()


def rejections_by_reason_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                                end_s: float | None = None, window_s: float = 3600,
                                run_ids: Sequence[str] | None = None,
                                scopes: Sequence[str] | None = None,
                                namespaces: Sequence[str] | None = None,
                                origin_s: float = 0.0, rollup: bool | None = None,
                                decided_production: bool = False
                                ) -> pd.DataFrame:
    """Rejected candidates per window and first mismatching field (``rollup`` as in
    :func:`hit_rate_by_scope_window`).

    Returns:
        Columns ``window_start_s, window_end_s, reason`` (first mismatching field),
        ``reason_class`` (cross_scope, version, generation, collision), ``rejects`` (requests),
        ``lost_candidate_tokens`` (Σ candidate_cached_tokens of those rejects). Oldest first.
    """
    if not window_s or window_s <= 0:
        raise InvalidArgument(f"window_s must be positive, got {window_s}")
    facts = _facts(con, rollup=rollup, start_s=start_s, end_s=end_s, window_s=window_s,
                   origin_s=origin_s, run_ids=run_ids, scopes=scopes, namespaces=namespaces,
                   decided_production=decided_production)
    if facts is not None:
        fsql, fparams = facts
        window_start, window_params = window_start_sql("bucket_start_s", window_s=window_s,
                                                       origin_s=origin_s)
        sql = f"""
            WITH w AS (SELECT {window_start} AS window_start_s, *,
                              {scope_sql.CLASS_SQL} AS reason_class
                       FROM {fsql} WHERE decision = 'reject' AND refused IS NULL)
            SELECT window_start_s, window_start_s + ? AS window_end_s,
                   first_mismatch AS reason, reason_class,
                   CAST(sum(requests) AS BIGINT) AS rejects,
                   COALESCE(sum(candidate_cached_tokens), 0)::BIGINT AS lost_candidate_tokens
            FROM w GROUP BY ALL ORDER BY window_start_s, reason
        """
        return con.execute(sql, [*window_params, *fparams, float(window_s)]).df()
    where, params = _filters(start_s=start_s, end_s=end_s, run_ids=run_ids, scopes=scopes,
                             namespaces=namespaces, decided_production=decided_production)
    window_start, window_params = window_start_sql("ts_unix_s", window_s=window_s,
                                                   origin_s=origin_s)
    sql = f"""
        WITH w AS (SELECT {window_start} AS window_start_s, *,
                          {_CLASS} AS reason_class
                   FROM ({_base(con, start_s, end_s, where, **_side(run_ids, decided_production))})
                   WHERE decision = 'reject' AND refused IS NULL)
        SELECT window_start_s, window_start_s + ? AS window_end_s,
               first_mismatch AS reason, reason_class, count(*) AS rejects,
               COALESCE(sum(candidate_cached_tokens), 0)::BIGINT AS lost_candidate_tokens
        FROM w GROUP BY ALL ORDER BY window_start_s, reason
    """
    p = [*window_params, *_CLASS_PARAMS, *params, float(window_s)]
    return con.execute(sql, p).df()


def miss_breakdown_by_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                             end_s: float | None = None, window_s: float = 3600,
                             run_ids: Sequence[str] | None = None,
                             scopes: Sequence[str] | None = None,
                             namespaces: Sequence[str] | None = None,
                             origin_s: float = 0.0, rollup: bool | None = None,
                             decided_production: bool = False) -> pd.DataFrame:
    """Version-mismatch misses beside ordinary misses, per window (``rollup`` as in
    :func:`hit_rate_by_scope_window`).

    Returns:
        Columns ``window_start_s, window_end_s``, ``ordinary_miss_requests`` (decision ``miss``:
        no candidate), ``ordinary_miss_tokens`` (Σ prompt − cached over requests that were not
        rejected and reported cached tokens), ``version_mismatch_requests`` and
        ``version_mismatch_tokens`` (rejects of class version: count and Σ candidate tokens),
        ``other_reject_requests`` and ``other_reject_tokens`` (cross_scope, generation,
        collision), ``accepts``. Oldest first.
    """
    if not window_s or window_s <= 0:
        raise InvalidArgument(f"window_s must be positive, got {window_s}")
    facts = _facts(con, rollup=rollup, start_s=start_s, end_s=end_s, window_s=window_s,
                   origin_s=origin_s, run_ids=run_ids, scopes=scopes, namespaces=namespaces,
                   decided_production=decided_production)
    if facts is not None:
        fsql, fparams = facts
        window_start, window_params = window_start_sql("bucket_start_s", window_s=window_s,
                                                       origin_s=origin_s)
        n = "CAST(COALESCE(sum(requests) FILTER (WHERE {}), 0) AS BIGINT)"
        t = "COALESCE(sum({}) FILTER (WHERE {}), 0)::BIGINT"
        sql = f"""
            WITH w AS (SELECT {window_start} AS window_start_s, *,
                              {scope_sql.CLASS_SQL} AS reason_class FROM {fsql}
                       WHERE refused IS NULL)
            SELECT window_start_s, window_start_s + ? AS window_end_s,
                   {n.format("decision = 'miss'")} AS ordinary_miss_requests,
                   {t.format("miss_tokens", "decision IS DISTINCT FROM 'reject'")}
                       AS ordinary_miss_tokens,
                   {n.format("reason_class = 'version'")} AS version_mismatch_requests,
                   {t.format("candidate_cached_tokens", "reason_class = 'version'")}
                       AS version_mismatch_tokens,
                   {n.format("decision = 'reject' AND reason_class <> 'version'")}
                       AS other_reject_requests,
                   {t.format("candidate_cached_tokens",
                             "decision = 'reject' AND reason_class <> 'version'")}
                       AS other_reject_tokens,
                   {n.format("decision = 'accept'")} AS accepts
            FROM w GROUP BY ALL ORDER BY window_start_s
        """
        return con.execute(sql, [*window_params, *fparams, float(window_s)]).df()
    where, params = _filters(start_s=start_s, end_s=end_s, run_ids=run_ids, scopes=scopes,
                             namespaces=namespaces, decided_production=decided_production)
    window_start, window_params = window_start_sql("ts_unix_s", window_s=window_s,
                                                   origin_s=origin_s)
    sql = f"""
        WITH w AS (SELECT {window_start} AS window_start_s, *,
                          {_CLASS} AS reason_class
                   FROM ({_base(con, start_s, end_s, where, **_side(run_ids, decided_production))})
                   WHERE refused IS NULL)
        SELECT window_start_s, window_start_s + ? AS window_end_s,
               count(*) FILTER (WHERE decision = 'miss') AS ordinary_miss_requests,
               COALESCE(sum(prompt_tokens - cached_tokens) FILTER (
                   WHERE decision IS DISTINCT FROM 'reject' AND cached_tokens IS NOT NULL),
                   0)::BIGINT AS ordinary_miss_tokens,
               count(*) FILTER (WHERE reason_class = 'version') AS version_mismatch_requests,
               COALESCE(sum(candidate_cached_tokens) FILTER (WHERE reason_class = 'version'),
                        0)::BIGINT AS version_mismatch_tokens,
               count(*) FILTER (WHERE decision = 'reject' AND reason_class <> 'version')
                   AS other_reject_requests,
               COALESCE(sum(candidate_cached_tokens) FILTER (
                   WHERE decision = 'reject' AND reason_class <> 'version'), 0)::BIGINT
                   AS other_reject_tokens,
               count(*) FILTER (WHERE decision = 'accept') AS accepts
        FROM w GROUP BY ALL ORDER BY window_start_s
    """
    p = [*window_params, *_CLASS_PARAMS, *params, float(window_s)]
    return con.execute(sql, p).df()


def refused_by_reason(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                      end_s: float | None = None, run_ids: Sequence[str] | None = None,
                      models: Sequence[str] | None = None,
                      instances: Sequence[str] | None = None,
                      rollup: bool | None = None) -> pd.DataFrame:
    """Requests that never got an answer from the engine (a decision with an ``error`` and no
    usage row: the gateway refused them, 400/404/413, or the upstream failed), by error code:
    the "Refused / errors" the pages show apart from hit rates and miss counts (``rollup`` as
    in :func:`hit_rate_by_scope_window`).

    Returns:
        Columns ``error`` (``prefixscope.core.decision_log.ERROR_CODES``), ``requests``; most
        first, then by code. No row when there are none.
    """
    dims = dict(run_ids=run_ids, models=models, instances=instances)
    facts = _facts(con, rollup=rollup, start_s=start_s, end_s=end_s, **dims)
    if facts is not None:
        fsql, params = facts
        rows = f"SELECT refused, requests AS n FROM {fsql}"
    else:
        where, params = _filters(start_s=start_s, end_s=end_s, **dims)
        rows = f"SELECT refused, 1 AS n FROM ({_base(con, start_s, end_s, where, run_ids=run_ids)})"
    return con.execute(f"""
        SELECT refused AS error, CAST(sum(n) AS BIGINT) AS requests FROM ({rows})
        WHERE refused IS NOT NULL GROUP BY 1 ORDER BY 2 DESC, 1""", params).df()


class Unserved(NamedTuple):
    """:func:`unserved_accepts`: accepts the engine could not serve, by why (requests, tokens)."""

    requests: int  # shadow mode: accepts forwarded with a per-request salt
    tokens: int  # their accepted_cached_tokens (= candidate tokens)
    bypass_requests: int = 0  # /admin/bypass on (decision field ``bypass``, migration 81)
    bypass_tokens: int = 0  # their candidate_cached_tokens (accepted_cached_tokens is 0)


def unserved_accepts(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                     end_s: float | None = None, run_ids: Sequence[str] | None = None,
                     models: Sequence[str] | None = None,
                     instances: Sequence[str] | None = None) -> Unserved:
    """Accept decisions whose request was forwarded with a salt unique to the request
    (``salt_applied`` false), so the engine could not serve the candidate and its
    ``cached_tokens`` for the request are not the candidate's: the gateway's ``shadow`` mode
    (docs/gateway.md "Rollout and rollback"), or its cache bypass (``/admin/bypass``, the
    decision's ``bypass`` true; its ``accepted_cached_tokens`` are 0). The pages count them
    among the accepts (a decision) and say how many were not served, and why.

    Returns:
        :class:`Unserved` ``(requests, tokens, bypass_requests, bypass_tokens)`` in
        ``[start_s, end_s)`` (Unix s; None: unbounded) for the filters: the shadow-mode
        accepts with their ``accepted_cached_tokens``, the bypassed ones with their
        ``candidate_cached_tokens``; all 0 when there are none. Reads ``gateway_decisions``
        and its archived days (:func:`archive.relation`).
    """
    where, params = _filters(start_s=start_s, end_s=end_s, run_ids=run_ids, models=models,
                             instances=instances)
    rel = archive.relation(con, "gateway_decisions", start_s, end_s)
    row = con.execute(
        "SELECT count(*) FILTER (WHERE bypass IS NOT TRUE), "
        "coalesce(sum(accepted_cached_tokens) FILTER (WHERE bypass IS NOT TRUE), 0), "
        "count(*) FILTER (WHERE bypass), "
        "coalesce(sum(candidate_cached_tokens) FILTER (WHERE bypass), 0) "
        f"FROM {rel} WHERE decision = 'accept' AND salt_applied IS NOT TRUE AND {where}",
        params).fetchone()
    return Unserved(*(int(v) for v in row))


def top_rejected_namespaces(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                            end_s: float | None = None, run_ids: Sequence[str] | None = None,
                            limit: int = 10, rollup: bool | None = None,
                            decided_production: bool = False) -> pd.DataFrame:
    """Namespaces with the most rejected candidates (``rollup`` as in
    :func:`hit_rate_by_scope_window`).

    Returns:
        Columns ``namespace_digest, scope, requests, rejects, reject_fraction`` (rejects /
        decided requests), ``top_reason`` (most frequent first mismatch of the rejects; of two
        as frequent, the first in alphabetical order), ``lost_candidate_tokens``. Most rejects
        first (then by namespace digest and scope), at most ``limit`` rows.
    """
    facts = _facts(con, rollup=rollup, start_s=start_s, end_s=end_s, run_ids=run_ids,
                   decided_production=decided_production)
    if facts is not None:
        fsql, params = facts
        groups = f"""SELECT namespace_digest, scope, decision, first_mismatch,
                            sum(requests) AS n, sum(candidate_cached_tokens) AS c
                     FROM {fsql} WHERE namespace_digest IS NOT NULL AND refused IS NULL
                     GROUP BY ALL"""
    else:
        where, params = _filters(start_s=start_s, end_s=end_s, run_ids=run_ids,
                                 decided_production=decided_production)
        groups = f"""SELECT namespace_digest, scope, decision, first_mismatch, count(*) AS n,
                            sum(candidate_cached_tokens) AS c
                     FROM ({_base(con, start_s, end_s, where, **_side(run_ids, decided_production))})
                     WHERE namespace_digest IS NOT NULL AND refused IS NULL GROUP BY ALL"""
    rej = "decision = 'reject'"
    sql = f"""
        WITH g AS ({groups})
        SELECT namespace_digest, scope, CAST(sum(n) AS BIGINT) AS requests,
               CAST(COALESCE(sum(n) FILTER (WHERE {rej}), 0) AS BIGINT) AS rejects,
               CAST(sum(n) FILTER (WHERE {rej}) AS DOUBLE)
                   / NULLIF(sum(n) FILTER (WHERE decision IS NOT NULL), 0) AS reject_fraction,
               first(first_mismatch ORDER BY n DESC, first_mismatch)
                   FILTER (WHERE {rej} AND first_mismatch IS NOT NULL) AS top_reason,
               COALESCE(sum(c) FILTER (WHERE {rej}), 0)::BIGINT AS lost_candidate_tokens
        FROM g
        GROUP BY namespace_digest, scope
        HAVING sum(n) FILTER (WHERE {rej}) > 0
        ORDER BY rejects DESC, namespace_digest, scope LIMIT ?
    """
    return con.execute(sql, [*params, int(limit)]).df()


def _differs(cols: Sequence[str]) -> str:
    return " OR ".join(f"(candidate_{c} IS NOT NULL AND {c} IS NOT NULL AND candidate_{c} <> {c})"
                       for c in cols)


def _invariant_predicates() -> dict[str, tuple[str, list[Any]]]:
    used_after_reject = "decision = 'reject' AND COALESCE(cached_tokens, 0) > 0"
    return {
        "cross_scope_acceptance": (
            f"(decision = 'accept' AND ({_differs(['scope', 'namespace_digest'])})) OR "
            f"({used_after_reject} AND list_contains(?, first_mismatch))",
            [CROSS_SCOPE_REASONS]),
        "wrong_version_acceptance": (
            f"(decision = 'accept' AND ({_differs(_VERSION_COLUMNS)})) OR "
            f"({used_after_reject} AND list_contains(?, first_mismatch))",
            [VERSION_REASONS + COLLISION_REASONS]),
        "old_generation_use": (
            f"(decision = 'accept' AND ({_differs(['authorization_epoch', 'cache_epoch'])})) OR "
            f"({used_after_reject} AND list_contains(?, first_mismatch))",
            [GENERATION_REASONS]),
    }


def invariant_counts(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                     end_s: float | None = None,
                     run_ids: Sequence[str] | None = None,
                     rollup: bool | None = None,
                     decided_production: bool = False) -> dict[str, int]:
    """The three numbers that must be 0, plus context (``rollup`` and ``decided_production``
    as in :func:`hit_rate_by_scope_window`: the Invariants page reads the production gateway
    run as Scopes and Rejections do; the counts are the same, a violation always has a
    decision, but the rows read are that run's).

    Returns:
        ``{"cross_scope_acceptance", "wrong_version_acceptance", "old_generation_use"}``
        (requests violating each invariant, see the module docstring; refused requests
        included: a wrong acceptance counts whether or not the engine answered),
        ``"decided_requests"`` (requests with a decision, refused ones included),
        ``"answered_requests"`` (of them those the engine answered: the ``requests`` of
        :func:`hit_rate_by_scope_totals`), ``"refused_requests"`` (decisions with an error and
        no usage row, :func:`refused_by_reason`) and ``"unverifiable_accepts"`` (accepts
        logged without a candidate identity).
    """
    names = [*INVARIANTS, "decided_requests", "answered_requests", "refused_requests",
             "unverifiable_accepts"]
    dims = dict(run_ids=run_ids, decided_production=decided_production)
    facts = _facts(con, rollup=rollup, start_s=start_s, end_s=end_s, **dims)
    if facts is not None:
        fsql, fparams = facts
        row = con.execute(f"""
            SELECT {', '.join(f'sum({n})' for n in INVARIANTS)},
                   sum(requests) FILTER (WHERE decision IS NOT NULL),
                   sum(requests) FILTER (WHERE decision IS NOT NULL AND refused IS NULL),
                   sum(requests) FILTER (WHERE refused IS NOT NULL), sum(unverifiable_accepts)
            FROM {fsql}""", fparams).fetchone()
        return {n: int(v or 0) for n, v in zip(names, row)}
    where, params = _filters(start_s=start_s, end_s=end_s, **dims)
    preds = _invariant_predicates()
    sel = []
    p: list[Any] = []
    for name in INVARIANTS:
        pred, pp = preds[name]
        sel.append(f"count(*) FILTER (WHERE {pred}) AS {name}")
        p.extend(pp)
    sql = f"""
        SELECT {', '.join(sel)},
               count(*) FILTER (WHERE has_decision) AS decided_requests,
               count(*) FILTER (WHERE has_decision AND refused IS NULL) AS answered_requests,
               count(*) FILTER (WHERE refused IS NOT NULL) AS refused_requests,
               count(*) FILTER (WHERE decision = 'accept' AND candidate_scope IS NULL
                                AND candidate_namespace_digest IS NULL) AS unverifiable_accepts
        FROM ({_base_decided(con, start_s, end_s, where, **_side(**dims))})
    """
    row = con.execute(sql, [*p, *params]).fetchone()
    return {n: int(v or 0) for n, v in zip(names, row)}


def invariant_violations(con: duckdb.DuckDBPyConnection, *, invariant: str,
                         start_s: float | None = None, end_s: float | None = None,
                         run_ids: Sequence[str] | None = None, limit: int = 1000,
                         rollup: bool | None = None,
                         decided_production: bool = False) -> pd.DataFrame:
    """The requests behind one invariant count (drill-down), newest first. Reads the decisions
    with their usage rows (a violation always has a decision); when the rollup is current
    (``rollup`` as in :func:`hit_rate_by_scope_window`) and counts no violation in the range,
    no row is read at all. ``decided_production`` as in :func:`invariant_counts`.

    Returns:
        Columns ``run_id, request_id, ts_unix_s, scope, namespace_digest, decision,
        first_mismatch, reasons, candidate_request_id, candidate_scope,
        candidate_namespace_digest, candidate_cached_tokens, accepted_cached_tokens,
        prompt_tokens, cached_tokens``.

    Raises:
        InvalidArgument: unknown invariant name.
    """
    preds = _invariant_predicates()
    if invariant not in preds:
        raise InvalidArgument(f"unknown invariant {invariant!r}: choose from {list(INVARIANTS)}")
    pred, pp = preds[invariant]
    dims = dict(run_ids=run_ids, decided_production=decided_production)
    where, params = _filters(start_s=start_s, end_s=end_s, **dims)
    facts = _facts(con, rollup=rollup, start_s=start_s, end_s=end_s, **dims)
    cols = """run_id, request_id, ts_unix_s, scope, namespace_digest, decision, first_mismatch,
              reasons, candidate_request_id, candidate_scope, candidate_namespace_digest,
              candidate_cached_tokens, accepted_cached_tokens, prompt_tokens, cached_tokens"""
    if facts is not None:
        fsql, fparams = facts
        con.execute(f"CREATE OR REPLACE TEMP TABLE _ps_violating AS SELECT DISTINCT "
                    f"bucket_start_s AS b FROM {fsql} WHERE {invariant} > 0", fparams).fetchall()
        try:
            if not con.execute("SELECT count(*) FROM _ps_violating").fetchall()[0][0]:
                return con.execute(f"SELECT {cols} FROM ({_NO_ROWS})").df()  # no row to read
            # only the 5-minute buckets with a violation: their usage rows with a decision,
            # and their decisions without a timed usage row
            in_v = f"{scope_sql.BUCKET_SQL} IN (SELECT b FROM _ps_violating)"
            dec, req = _sources(con, start_s, end_s, **_side(**dims))
            rows = " UNION ALL ".join((
                scope_sql.ROWS_SQL.format(
                    source=f"{dec} d JOIN (SELECT * FROM {req} WHERE {in_v}) r "
                           f"ON {scope_sql.ON_KEY}"),
                scope_sql.ROWS_SQL.format(
                    source=f"(SELECT * FROM {dec} WHERE {in_v}) d LEFT JOIN "
                           f"{req} r ON {scope_sql.ON_KEY} WHERE r.ts_unix_s IS NULL")))
            return con.execute(f"""
                SELECT {cols} FROM ({rows}) j
                WHERE ts_unix_s IS NOT NULL AND {where} AND ({pred})
                ORDER BY ts_unix_s DESC, request_id LIMIT ?
            """, [*params, *pp, int(limit)]).df()
        finally:
            con.execute("DROP TABLE IF EXISTS _ps_violating").fetchall()
    sql = f"""
        SELECT {cols}
        FROM ({_base_decided(con, start_s, end_s, where, **_side(**dims))}) WHERE {pred}
        ORDER BY ts_unix_s DESC, request_id LIMIT ?
    """
    return con.execute(sql, [*params, *pp, int(limit)]).df()


def decision_rows(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                  end_s: float | None = None, run_ids: Sequence[str] | None = None,
                  decisions: Sequence[str] | None = None, reason: str | None = None,
                  namespaces: Sequence[str] | None = None, limit: int = 1000) -> pd.DataFrame:
    """Decisions joined to usage, one row per request, newest first (for tables and CSV).

    Returns:
        Columns ``run_id, request_id, ts_unix_s, scope, namespace_digest, decision,
        first_mismatch, reasons, candidate_cached_tokens, accepted_cached_tokens, prompt_tokens,
        cached_tokens, candidate_request_id``.
    """
    where, params = _filters(start_s=start_s, end_s=end_s, run_ids=run_ids,
                             namespaces=namespaces)
    extra = ""
    p: list[Any] = []
    if decisions is not None:
        extra += " AND list_contains(?, decision)"
        p.append(list(decisions))
    if reason is not None:
        extra += " AND list_contains(string_split(reasons, ','), ?)"
        p.append(reason)
    sql = f"""
        SELECT run_id, request_id, ts_unix_s, scope, namespace_digest, decision, first_mismatch,
               reasons, candidate_cached_tokens, accepted_cached_tokens, prompt_tokens,
               cached_tokens, candidate_request_id
        FROM ({_base_decided(con, start_s, end_s, where, run_ids=run_ids)})
        WHERE has_decision{extra}
        ORDER BY ts_unix_s DESC, request_id LIMIT ?
    """
    return con.execute(sql, [*params, *p, int(limit)]).df()


def gateway_events(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                   end_s: float | None = None,
                   run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Version events (upgrades, revocations, epoch bumps, restarts), oldest first.

    Returns:
        Columns ``run_id, ts_unix_s, event, namespace_digest, new_value``.
    """
    where, params = _filters(start_s=start_s, end_s=end_s, run_ids=run_ids)
    sql = f"""SELECT run_id, ts_unix_s, event, namespace_digest, new_value FROM gateway_events
              WHERE {where} ORDER BY ts_unix_s, event"""
    return con.execute(sql, params).df()


def scope_filter_values(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Values for the dashboard's filters: ``run_ids``, ``scopes``, ``namespaces`` (sorted) and
    ``min_ts_unix_s``/``max_ts_unix_s`` over decisions (None when there are none). Archived
    decisions (production run) count for ``run_ids`` and the span (from the oldest archived
    day's start); ``scopes`` and ``namespaces`` come from the retained decisions."""
    row = con.execute("""
        SELECT list(DISTINCT run_id ORDER BY run_id), list(DISTINCT scope ORDER BY scope),
               list(DISTINCT namespace_digest ORDER BY namespace_digest),
               min(ts_unix_s), max(ts_unix_s)
        FROM gateway_decisions""").fetchone()
    oldest = archive.with_archived_start(con, "gateway_decisions", row[3])
    newest = row[4]
    if newest is None and oldest is not None:  # every decision archived
        newest = con.execute("SELECT max(epoch(day::TIMESTAMP)) + 86400 FROM archive_parts "
                             "WHERE tbl = 'gateway_decisions'").fetchone()[0]
    run_ids = list(row[0] or [])
    if oldest is not None and "" not in run_ids and archive.archived_rows(con, "gateway_decisions"):
        run_ids.insert(0, "")  # production decisions, all archived
    return {"run_ids": run_ids, "scopes": list(row[1] or []),
            "namespaces": list(row[2] or []), "min_ts_unix_s": oldest, "max_ts_unix_s": newest}


def record_replay_run(con: duckdb.DuckDBPyConnection, *, run_id: str, label: str,
                      params: Mapping[str, Any]) -> None:
    """Register a gateway replay in ``runs`` (kind ``replay-sim``; kept when it exists)."""
    from prefixscope.store.queries.replay import insert_run

    insert_run(con, run_id=run_id, kind="replay-sim", label=label, created_unix_s=time.time(),
               params=params)
