"""Prices and cost savings of prefix caching (tables ``prices`` and ``requests``).

Formulas (``docs/metrics.md`` "Cost and savings", ``usage-shapes.md`` section 6), with
inclusive input I, cache reads R, cache writes W of which W1h with a 1 h TTL, output O, and
prices per million tokens p_in, p_read, p_write, p_write_1h, p_out:

- cost_without_cache = (I p_in + O p_out) / 1e6
- saved = (R (p_in - p_read) - (W - W1h) (p_write - p_in) - W1h (p_write_1h - p_in)) / 1e6
  (can be negative: writes never read back cost a premium)
- cost_with_cache = cost_without_cache - saved
  = ((I - R - W) p_in + R p_read + (W - W1h) p_write + W1h p_write_1h + O p_out) / 1e6
- saved_fraction = saved / cost_without_cache

A NULL ``cached_tokens`` / ``cache_write_tokens`` counts as 0 here (no saving is claimed for a
request that did not report one). Arithmetic is exact decimal in DuckDB; results are returned
as floats in the entry's currency. A model without a price gets NULL costs and a ``note``,
never 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pandas as pd

from prefixscope.core.errors import InvalidArgument
from prefixscope.store.sqlhelpers import window_start_sql
from prefixscope.store.queries.requests import (  # noqa: F401  (re-exported: the report is about both)
    ReportLine,
    _where,
    report,
    report_lines,
)

NO_PRICE_NOTE = "no price: add this model to the price table (prefixscope ingest prices)"


def replace_prices(con: duckdb.DuckDBPyConnection, rows: Sequence, *, price_file: str | None,
                   loaded_unix_s: float) -> int:
    """Replace the whole ``prices`` table with ``rows`` in one transaction.

    Args:
        rows: ``prefixscope.ingest.prices.PriceRow`` objects (per-million-token decimal prices).

    Returns:
        Rows written.
    """
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM prices")
        if rows:
            con.executemany(
                "INSERT INTO prices (model, priced_as, currency, input_per_mtok, "
                "cached_input_per_mtok, cache_write_per_mtok, cache_write_1h_per_mtok, "
                "output_per_mtok, shadow, price_source, price_file, loaded_unix_s) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [[r.model, r.priced_as, r.currency, r.input_per_mtok, r.cached_input_per_mtok,
                  r.cache_write_per_mtok, r.cache_write_1h_per_mtok, r.output_per_mtok,
                  r.shadow, r.price_source, price_file, loaded_unix_s] for r in rows])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return len(rows)


def price_table(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The loaded prices.

    Returns:
        Columns ``model, priced_as, currency, input_per_mtok, cached_input_per_mtok,
        cache_write_per_mtok, cache_write_1h_per_mtok, output_per_mtok`` (per million tokens),
        ``shadow, price_source, price_file, loaded_unix_s``; by model.
    """
    return con.execute(
        "SELECT model, priced_as, currency, input_per_mtok, cached_input_per_mtok, "
        "cache_write_per_mtok, cache_write_1h_per_mtok, output_per_mtok, shadow, price_source, "
        "price_file, loaded_unix_s FROM prices ORDER BY model").df()


_SUMS = """
    count(*) AS requests,
    count(cached_tokens) AS reported_requests,
    CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
    CAST(sum(coalesce(cached_tokens, 0)) AS BIGINT) AS cached_tokens,
    CAST(sum(coalesce(cache_write_tokens, 0)) AS BIGINT) AS cache_write_tokens,
    CAST(sum(coalesce(cache_write_1h_tokens, 0)) AS BIGINT) AS cache_write_1h_tokens,
    CAST(sum(coalesce(completion_tokens, 0)) AS BIGINT) AS completion_tokens
"""

# Exact decimal arithmetic; money in currency units (prices are per 1e6 tokens).
_COSTS = """
    CAST((a.prompt_tokens * p.input_per_mtok + a.completion_tokens * p.output_per_mtok)
         / 1000000.0 AS DOUBLE) AS cost_without_cache,
    CAST(((a.prompt_tokens * p.input_per_mtok + a.completion_tokens * p.output_per_mtok)
          - (a.cached_tokens * (p.input_per_mtok - p.cached_input_per_mtok)
             - (a.cache_write_tokens - a.cache_write_1h_tokens)
               * (p.cache_write_per_mtok - p.input_per_mtok)
             - a.cache_write_1h_tokens * (p.cache_write_1h_per_mtok - p.input_per_mtok)))
         / 1000000.0 AS DOUBLE) AS cost_with_cache,
    CAST((a.cached_tokens * (p.input_per_mtok - p.cached_input_per_mtok)
          - (a.cache_write_tokens - a.cache_write_1h_tokens)
            * (p.cache_write_per_mtok - p.input_per_mtok)
          - a.cache_write_1h_tokens * (p.cache_write_1h_per_mtok - p.input_per_mtok))
         / 1000000.0 AS DOUBLE) AS saved
"""


def savings_by_model(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                     end_s: float | None = None, models: Sequence[str] | None = None,
                     instances: Sequence[str] | None = None,
                     run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Cost with and without prefix caching, per model (formulas in the module docstring).

    Returns:
        Columns ``model, currency, shadow`` (bool; NULL without a price), ``price_source``
        (label to show with the money), ``requests, reported_requests, prompt_tokens,
        cached_tokens, cache_write_tokens, cache_write_1h_tokens, completion_tokens`` (tokens),
        ``cost_without_cache, cost_with_cache, saved`` (currency units, NULL without a price),
        ``saved_fraction`` (saved / cost_without_cache), ``note`` (:data:`NO_PRICE_NOTE` when
        the model has no price, else NULL). Ordered by model (NULL model last).
    """
    where, params = _where(start_s, end_s, models, instances, run_ids)
    return con.execute(f"""
        WITH a AS (SELECT model, {_SUMS} FROM requests WHERE {where} GROUP BY model),
        c AS (
            SELECT a.*, p.currency, p.shadow, p.price_source, p.model IS NOT NULL AS priced,
                   {_COSTS}
            FROM a LEFT JOIN prices p ON p.model = a.model
        )
        SELECT model, currency, shadow, price_source, requests, reported_requests,
               prompt_tokens, cached_tokens, cache_write_tokens, cache_write_1h_tokens,
               completion_tokens, cost_without_cache, cost_with_cache, saved,
               saved / NULLIF(cost_without_cache, 0) AS saved_fraction,
               CASE WHEN priced THEN NULL ELSE ? END AS note
        FROM c ORDER BY model NULLS LAST
    """, [*params, NO_PRICE_NOTE]).df()


def savings_totals(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                   end_s: float | None = None, models: Sequence[str] | None = None,
                   instances: Sequence[str] | None = None,
                   run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Savings summed over priced models, per currency and shadow/list (never mixing them).

    Returns:
        Columns ``currency, shadow, models, cost_without_cache, cost_with_cache, saved,
        saved_fraction, price_sources`` (the distinct labels joined by ``; ``), and
        ``unpriced_models`` (count of models without a price, same on every row); ordered by
        currency, shadow. One row with NULL currency when nothing is priced.
    """
    df = savings_by_model(con, start_s=start_s, end_s=end_s, models=models,
                          instances=instances, run_ids=run_ids)
    unpriced = int(df["note"].notna().sum()) if len(df) else 0
    priced = df[df["note"].isna()]
    if priced.empty:
        return pd.DataFrame([{"currency": None, "shadow": None, "models": 0,
                              "cost_without_cache": None, "cost_with_cache": None,
                              "saved": None, "saved_fraction": None, "price_sources": None,
                              "unpriced_models": unpriced}])
    rows = []
    for (currency, shadow), g in priced.groupby(["currency", "shadow"], sort=True):
        without = float(g["cost_without_cache"].sum())
        saved = float(g["saved"].sum())
        rows.append({"currency": currency, "shadow": bool(shadow), "models": len(g),
                     "cost_without_cache": without,
                     "cost_with_cache": float(g["cost_with_cache"].sum()), "saved": saved,
                     "saved_fraction": saved / without if without else None,
                     "price_sources": "; ".join(sorted(set(g["price_source"]))),
                     "unpriced_models": unpriced})
    return pd.DataFrame(rows)


def savings_by_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                      end_s: float | None = None, window_s: float = 86400,
                      models: Sequence[str] | None = None,
                      instances: Sequence[str] | None = None,
                      run_ids: Sequence[str] | None = None,
                      origin_s: float = 0.0) -> pd.DataFrame:
    """Savings per time window and model (requests with a time only).

    Returns:
        Columns ``window_start_s, window_end_s, model, currency, shadow, price_source, saved,
        cost_without_cache, cost_with_cache`` (currency units; NULL without a price), ``note``;
        oldest window first, then model.

    Raises:
        InvalidArgument: ``window_s`` not positive.
    """
    if not window_s or window_s <= 0:
        raise InvalidArgument(f"window_s must be positive, got {window_s}")
    where, params = _where(start_s, end_s, models, instances, run_ids)
    window_start, window_params = window_start_sql("ts_unix_s", window_s=window_s,
                                                   origin_s=origin_s)
    return con.execute(f"""
        WITH w AS (
            SELECT {window_start} AS window_start_s, *
            FROM requests WHERE ts_unix_s IS NOT NULL AND {where}
        ), a AS (SELECT window_start_s, model, {_SUMS} FROM w GROUP BY window_start_s, model),
        c AS (
            SELECT a.*, p.currency, p.shadow, p.price_source, p.model IS NOT NULL AS priced,
                   {_COSTS}
            FROM a LEFT JOIN prices p ON p.model = a.model
        )
        SELECT window_start_s, window_start_s + ? AS window_end_s, model, currency, shadow,
               price_source, saved, cost_without_cache, cost_with_cache,
               CASE WHEN priced THEN NULL ELSE ? END AS note
        FROM c ORDER BY window_start_s, model NULLS LAST
    """, [*window_params, *params, float(window_s), NO_PRICE_NOTE]).df()
