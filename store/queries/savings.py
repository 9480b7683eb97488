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
from prefixscope.store.queries import archive
from prefixscope.store.sqlhelpers import window_start_sql
from prefixscope.store.queries.requests import (  # noqa: F401  (re-exported: the report is about both)
    ReportLine,
    _where,
    report,
    report_lines,
)

NO_PRICE_NOTE = ("no price: add this model to the price table (prefixscope ingest prices), or "
                 "price hosted models with prefixscope ingest prices --genai-prices")


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


def replace_price_tiers(con: duckdb.DuckDBPyConnection, rows: Sequence, *,
                        source_version: str, loaded_unix_s: float) -> int:
    """Replace the whole ``price_tiers`` table with ``rows`` in one transaction.

    Args:
        rows: ``prefixscope.ingest.genai_prices.TierRow`` objects (USD per million tokens).
        source_version: e.g. ``genai-prices 0.2.3``.

    Returns:
        Rows written.
    """
    cols = ("model, provider_key, valid_from_unix_s, valid_to_unix_s, day_from_s, day_to_s, "
            "min_prompt_tokens, max_prompt_tokens, currency, input_per_mtok, "
            "cached_input_per_mtok, cache_write_per_mtok, cache_write_1h_per_mtok, "
            "output_per_mtok, price_source, source_version, genai_provider_id, genai_model_id, "
            "loaded_unix_s")
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM price_tiers")
        if rows:
            con.executemany(
                f"INSERT INTO price_tiers ({cols}) VALUES "
                f"({', '.join('?' * len(cols.split(',')))})",
                [[r.model, r.provider_key, r.valid_from_unix_s, r.valid_to_unix_s, r.day_from_s,
                  r.day_to_s, r.min_prompt_tokens, r.max_prompt_tokens, "USD", r.input_per_mtok,
                  r.cached_input_per_mtok, r.cache_write_per_mtok, r.cache_write_1h_per_mtok,
                  r.output_per_mtok, r.price_source, source_version, r.genai_provider_id,
                  r.genai_model_id, loaded_unix_s] for r in rows])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return len(rows)


def measured_prefill_tokens_per_s(con: duckdb.DuckDBPyConnection, model: str | None = None
                                  ) -> float | None:
    """Prefill throughput measured by vLLM, tokens per second: the increase of
    ``vllm:request_prefill_kv_computed_tokens_sum`` over that of
    ``vllm:request_prefill_time_seconds_sum`` (vLLM 0.32 ``vllm/v1/metrics/loggers.py``), summed
    over every stored series (of ``model``'s ``model_name`` when given, falling back to all
    models), production samples only. A series' increase is last minus first value (its last
    value when it went down: a restart). None without both histograms.
    """
    def increase(metric: str, m: str | None) -> float | None:
        row = con.execute(
            """
            WITH s AS (
                SELECT labels, instance, arg_min(value, ts_unix_s) AS first_v,
                       arg_max(value, ts_unix_s) AS last_v, count(*) AS n
                FROM metric_samples
                WHERE metric = ? AND run_id = '' AND (? IS NULL OR model = ?)
                GROUP BY labels, instance)
            SELECT sum(CASE WHEN last_v >= first_v THEN last_v - first_v ELSE last_v END),
                   sum(n) FROM s
            """, [metric, m, m]).fetchone()
        return float(row[0]) if row and row[1] and row[0] is not None else None

    for m in ([model, None] if model else [None]):
        tokens = increase("vllm:request_prefill_kv_computed_tokens_sum", m)
        seconds = increase("vllm:request_prefill_time_seconds_sum", m)
        if tokens and seconds:
            return tokens / seconds
    return None


def unpriced_model_refs(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str | None]]:
    """Distinct ``(model, provider)`` of ``requests`` whose model the TOML ``prices`` table
    does not list (one aggregate over the table), ordered."""
    return [(m, p) for m, p in con.execute(
        "SELECT DISTINCT model, provider FROM requests WHERE model IS NOT NULL AND model NOT IN "
        "(SELECT model FROM prices) ORDER BY model, provider NULLS FIRST").fetchall()]


def price_tier_table(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The genai-prices rows (``price_tiers``), by model, provider, period, tier: columns of
    migration 61 (``docs/schema.md#price_tiers``)."""
    return con.execute(
        "SELECT * FROM price_tiers ORDER BY model, provider_key, valid_from_unix_s, "
        "day_from_s, min_prompt_tokens").df()


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


# Every price row a request can take: the TOML table (one row per model, any provider, any
# time, any prompt size) and, for models it does not list, the genai-prices tiers and periods
# (migration 61, ingest/genai_prices.py). The TOML row wins: it holds overrides and shadow prices.
_PRICE_ROWS = """
    pr0 AS (
        SELECT model, CAST(NULL AS VARCHAR) AS provider_key, -1e300 AS valid_from_unix_s,
               1e300 AS valid_to_unix_s, 0.0 AS day_from_s, 86400.0 AS day_to_s,
               CAST(-1 AS BIGINT) AS min_prompt_tokens,
               CAST(9000000000000000000 AS BIGINT) AS max_prompt_tokens, currency, shadow,
               price_source, CAST(input_per_mtok AS DECIMAL(18, 9)) AS input_per_mtok,
               CAST(cached_input_per_mtok AS DECIMAL(18, 9)) AS cached_input_per_mtok,
               CAST(cache_write_per_mtok AS DECIMAL(18, 9)) AS cache_write_per_mtok,
               CAST(cache_write_1h_per_mtok AS DECIMAL(18, 9)) AS cache_write_1h_per_mtok,
               CAST(output_per_mtok AS DECIMAL(18, 9)) AS output_per_mtok
        FROM prices
        UNION ALL
        SELECT model, provider_key, valid_from_unix_s, valid_to_unix_s, day_from_s, day_to_s,
               min_prompt_tokens, max_prompt_tokens, currency, FALSE AS shadow, price_source,
               input_per_mtok, cached_input_per_mtok, cache_write_per_mtok,
               cache_write_1h_per_mtok, output_per_mtok
        FROM price_tiers WHERE model NOT IN (SELECT model FROM prices)
    ),
    -- n_rows = 1: the model's only price row (a TOML entry, a flat genai-prices price): every
    -- request of the model takes it, no per-request test
    pr AS (SELECT row_number() OVER () AS pid, count(*) OVER (PARTITION BY model) AS n_rows, *
           FROM pr0)"""

# A request joins the price row of its model (and provider, for genai-prices rows) whose period
# and daily interval hold its time and whose prompt interval holds its inclusive prompt size.
# Requests are summed per (keys, price row id) and the prices joined back after the sums: the
# per-request work is one hash lookup and, for models with tiers or periods, a few compares.
_PRICE_JOIN = """
    LEFT JOIN pr ON pr.model = r.model
        AND (pr.n_rows = 1 OR (
            (pr.provider_key IS NULL OR pr.provider_key = coalesce(r.provider, ''))
            AND coalesce(r.ts_unix_s, 0) >= pr.valid_from_unix_s
            AND coalesce(r.ts_unix_s, 0) < pr.valid_to_unix_s
            AND coalesce(r.ts_unix_s, 0) - 86400 * floor(coalesce(r.ts_unix_s, 0) / 86400)
                >= pr.day_from_s
            AND coalesce(r.ts_unix_s, 0) - 86400 * floor(coalesce(r.ts_unix_s, 0) / 86400)
                < pr.day_to_s
            AND coalesce(r.prompt_tokens, 0) > pr.min_prompt_tokens
            AND coalesce(r.prompt_tokens, 0) <= pr.max_prompt_tokens))"""

_PRICE_COLS = ("p.pid IS NOT NULL AS priced, p.currency, p.shadow, p.price_source, "
               "p.input_per_mtok AS p_in, p.cached_input_per_mtok AS p_read, "
               "p.cache_write_per_mtok AS p_write, p.cache_write_1h_per_mtok AS p_write_1h, "
               "p.output_per_mtok AS p_out")

# Per price group, exact decimals (currency units x 1e6); summed, then divided and cast.
_GROUP_COSTS = """
    prompt_tokens * p_in + completion_tokens * p_out AS c_without,
    cached_tokens * (p_in - p_read)
      - (cache_write_tokens - cache_write_1h_tokens) * (p_write - p_in)
      - cache_write_1h_tokens * (p_write_1h - p_in) AS c_saved,
    greatest(prompt_tokens - cached_tokens - cache_write_tokens, 0) * (p_in - p_read) AS c_miss
"""

_SUM_COLS = ("requests", "reported_requests", "prompt_tokens", "cached_tokens",
             "cache_write_tokens", "cache_write_1h_tokens", "completion_tokens")


def _priced_sql(keys: str, where: str, extra_select: str = "", extra_from: str = "requests"
                ) -> str:
    """SQL of costs per ``keys`` (comma-separated columns of ``r``): requests filtered by
    ``where``, joined to their price rows, summed per (keys, price row), then per keys.

    Columns: keys, ``currency, shadow, price_source`` (distinct labels joined by ``; ``),
    ``priced_requests``, the token sums of :data:`_SUM_COLS`, ``cost_without_cache,
    cost_with_cache, saved, miss_cost`` (DOUBLE currency units; NULL when no request of the
    group was priced).
    """
    sums = ", ".join(f"CAST(sum({c}) AS BIGINT) AS {c}" for c in _SUM_COLS)
    return f"""
        WITH r AS (SELECT *{extra_select} FROM {extra_from} WHERE {where}),
        {_PRICE_ROWS},
        g0 AS (
            SELECT {", ".join("r." + k.strip() + " AS " + k.strip() for k in keys.split(","))},
                   pr.pid, {_SUMS}
            FROM r {_PRICE_JOIN}
            GROUP BY {", ".join("r." + k.strip() for k in keys.split(","))}, pr.pid
        ),
        g AS (SELECT g0.*, {_PRICE_COLS} FROM g0 LEFT JOIN pr p ON p.pid = g0.pid),
        gc AS (SELECT *, {_GROUP_COSTS} FROM g)
        SELECT {keys}, any_value(currency) FILTER (WHERE priced) AS currency,
               bool_or(shadow) FILTER (WHERE priced) AS shadow,
               string_agg(DISTINCT price_source, '; ' ORDER BY price_source)
                   FILTER (WHERE priced) AS price_source,
               CAST(sum(requests) FILTER (WHERE priced) AS BIGINT) AS priced_requests,
               {sums},
               CAST(sum(c_without) FILTER (WHERE priced) / 1000000.0 AS DOUBLE)
                   AS cost_without_cache,
               CAST(sum(c_without - c_saved) FILTER (WHERE priced) / 1000000.0 AS DOUBLE)
                   AS cost_with_cache,
               CAST(sum(c_saved) FILTER (WHERE priced) / 1000000.0 AS DOUBLE) AS saved,
               CAST(sum(c_miss) FILTER (WHERE priced) / 1000000.0 AS DOUBLE) AS miss_cost
        FROM gc GROUP BY {keys}
    """


PARTLY_PRICED_NOTE = ("some requests matched no price period or tier (their cost is left out; "
                      "prefixscope ingest prices --genai-prices)")


def savings_by_model(con: duckdb.DuckDBPyConnection, *, start_s: float | None = None,
                     end_s: float | None = None, models: Sequence[str] | None = None,
                     instances: Sequence[str] | None = None,
                     run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Cost with and without prefix caching, per model (formulas in the module docstring).

    Each request is priced in SQL by the TOML row of its model, else by the genai-prices row of
    its model and provider whose period holds its time and whose tier holds its prompt size
    (``price_tiers``, ``ingest/genai_prices.py``): tokens are summed per (model, price row),
    multiplied there, and the products summed per model. No per-request rows leave the store.

    Returns:
        Columns ``model, currency, shadow`` (bool; NULL without a price), ``price_source``
        (label(s) to show with the money, with the genai-prices version), ``requests,
        reported_requests, prompt_tokens, cached_tokens, cache_write_tokens,
        cache_write_1h_tokens, completion_tokens`` (tokens), ``cost_without_cache,
        cost_with_cache, saved`` (currency units, NULL without a price), ``saved_fraction``
        (saved / cost_without_cache), ``miss_cost`` (what the prompt tokens neither read from
        nor written to the cache cost above the cached-input price, ``(I - R - W) (p_in -
        p_read) / 1e6``: the cost of the misses), ``note`` (:data:`NO_PRICE_NOTE` when no request of the
        model has a price, :data:`PARTLY_PRICED_NOTE` when some have none, else NULL).
        Ordered by model (NULL model last).
    """
    where, params = _where(start_s, end_s, models, instances, run_ids)
    return con.execute(f"""
        WITH m AS ({_priced_sql("model", where, extra_from=archive.relation(
            con, "requests", start_s, end_s))})
        SELECT model, currency, shadow, price_source, requests, reported_requests,
               prompt_tokens, cached_tokens, cache_write_tokens, cache_write_1h_tokens,
               completion_tokens, cost_without_cache, cost_with_cache, saved,
               saved / NULLIF(cost_without_cache, 0) AS saved_fraction, miss_cost,
               CASE WHEN priced_requests IS NULL THEN ?
                    WHEN priced_requests < requests THEN ? END AS note
        FROM m ORDER BY model NULLS LAST
    """, [*params, NO_PRICE_NOTE, PARTLY_PRICED_NOTE]).df()


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
    unpriced = int((df["note"] == NO_PRICE_NOTE).sum()) if len(df) else 0
    priced = df[df["currency"].notna()]
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
        miss_cost`` (what the window's misses cost, as in :func:`savings_by_model`), and``
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
    inner = _priced_sql("window_start_s, model", "ts_unix_s IS NOT NULL AND " + where,
                        extra_select=f", {window_start} AS window_start_s",
                        extra_from=archive.relation(con, "requests", start_s, end_s))
    return con.execute(f"""
        WITH m AS ({inner})
        SELECT window_start_s, window_start_s + ? AS window_end_s, model, currency, shadow,
               price_source, saved, cost_without_cache, cost_with_cache, miss_cost,
               CASE WHEN priced_requests IS NULL THEN ?
                    WHEN priced_requests < requests THEN ? END AS note
        FROM m ORDER BY window_start_s, model NULLS LAST
    """, [*window_params, *params, float(window_s), NO_PRICE_NOTE, PARTLY_PRICED_NOTE]).df()
