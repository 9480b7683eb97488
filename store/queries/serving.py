"""Serving panels beside the hit rate: gauges, counter rates, TTFT quantiles (aggregates only).

What a vLLM Grafana board shows next to the prefix cache, per window (``docs/metrics.md#serving``):

1. **Gauges** (``vllm:kv_cache_usage_perc`` fraction 0..1, ``vllm:num_requests_running``,
   ``vllm:num_requests_waiting``): mean and max of the samples in each window, per group.
2. **Counter increase per window** (``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``):
   ``prefixscope.store.queries.metrics.counter_increase_by_window`` (the store's increase rule).
3. **TTFT from vLLM's histogram** (``vllm:time_to_first_token_seconds``): bucket increases per
   window summed over series by ``le`` (the stored per-sample increases,
   ``counter_increase_by_window`` grouped by ``le``), then Prometheus' ``histogram_quantile``
   (linear interpolation inside the bucket; the ``+Inf`` bucket reports the highest finite
   bound).
4. **TTFT from the usage log** (``requests.ttft_ms``): ``quantile_cont`` per window, split into
   bands of the cached share ``cached_tokens / prompt_tokens`` (:data:`TTFT_BANDS`: cold
   < 10%, partial, warm >= 80%); requests without ``ttft_ms`` or ``cached_tokens`` are left
   out.

Every function returns one row per window and group, never a sample or a request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd

from prefixscope.core.errors import InvalidArgument
from prefixscope.core.formatting import fmt_share_band
from prefixscope.store.queries import archive
from prefixscope.store.queries.metrics import _by_columns, _filters, counter_increase_by_window
from prefixscope.store.sqlhelpers import window_start_sql

GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
TTFT_FAMILY = "vllm:time_to_first_token_seconds"


def _window(window_s: float) -> None:
    if not window_s or window_s <= 0:
        raise InvalidArgument(f"window_s must be > 0, got {window_s!r}")


def gauge_by_window(con: duckdb.DuckDBPyConnection, *, metric: str, start_s: float | None,
                    end_s: float | None, window_s: float, by: Sequence[str] = ("instance",),
                    models: Sequence[str] | None = None, instances: Sequence[str] | None = None,
                    run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean and max of a gauge per window (rule 1).

    Returns:
        Columns ``window_start_s``, ``window_end_s`` (Unix s), the ``by`` columns,
        ``mean_value``, ``max_value`` (the gauge's unit), ``samples``; oldest first.

    Raises:
        InvalidArgument: unknown gauge, grouping column or a window <= 0.
    """
    if metric not in GAUGES:
        raise InvalidArgument(f"not a serving gauge: {metric!r} (one of {', '.join(GAUGES)})")
    _window(window_s)
    cols = _by_columns(by)
    where, params = _filters(models=models, instances=instances, end_s=end_s, run_ids=run_ids)
    if start_s is not None:
        where += " AND ts_unix_s >= ?"
        params.append(float(start_s))
    ws, wp = window_start_sql("ts_unix_s", window_s=window_s)
    group = "".join(f", {c}" for c in cols)
    return con.execute(f"""
        WITH per_sample AS (
            SELECT {ws} AS window_start_s{group}, ts_unix_s, sum(value) AS value
            FROM {archive.relation(con, "metric_samples", start_s, end_s)}
            WHERE metric = ? AND NOT created_zero{where}
            GROUP BY ALL
        )
        SELECT window_start_s, window_start_s + ? AS window_end_s{group},
               avg(value) AS mean_value, max(value) AS max_value, count(*) AS samples
        FROM per_sample GROUP BY ALL ORDER BY window_start_s{group}
    """, [*wp, metric, *params, float(window_s)]).df()


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """Prometheus' ``histogram_quantile`` over ``(upper bound, cumulative count)`` pairs sorted
    by bound (``+Inf`` last): linear interpolation inside the bucket holding rank ``q x total``;
    the first bucket interpolates from 0; a rank in ``+Inf`` returns the highest finite bound.
    None without observations."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def ttft_histogram_by_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None,
                             end_s: float | None, window_s: float,
                             by: Sequence[str] = ("model",),
                             quantiles: Sequence[float] = (0.5, 0.9),
                             models: Sequence[str] | None = None,
                             instances: Sequence[str] | None = None,
                             run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """TTFT quantiles per window from vLLM's histogram (rule 3).

    Returns:
        Columns ``window_start_s``, ``window_end_s``, the ``by`` columns, ``requests`` (the
        ``_count`` increase), and ``p50_s``, ``p90_s``... (seconds) for ``quantiles``; oldest
        first. Windows without observations are absent.
    """
    _window(window_s)
    cols = _by_columns(by)
    inc = counter_increase_by_window(
        con, metric=TTFT_FAMILY + "_bucket", start_s=start_s, end_s=end_s, window_s=window_s,
        by=(*cols, "le"), models=models, instances=instances, run_ids=run_ids)
    inc = inc.astype(object).where(inc.notna(), None)  # a missing model stays None (a key)
    rows = inc[["window_start_s", *cols, "le", "increase"]].itertuples(index=False, name=None)
    out: dict[tuple, list[tuple[float, float]]] = {}
    for row in rows:
        key = tuple(row[:1 + len(cols)])
        le = row[1 + len(cols)]
        bound = math.inf if le in ("+Inf", "inf", "Inf") else float(le)
        out.setdefault(key, []).append((bound, float(row[2 + len(cols)])))
    records: list[dict[str, Any]] = []
    for key, buckets in out.items():
        buckets.sort()
        total = buckets[-1][1]
        if total <= 0:
            continue
        rec: dict[str, Any] = {"window_start_s": key[0], "window_end_s": key[0] + window_s}
        rec.update(dict(zip(cols, key[1:])))
        rec["requests"] = total
        for q in quantiles:
            rec[f"p{round(q * 100):d}_s"] = histogram_quantile(buckets, q)
        records.append(rec)
    columns = ["window_start_s", "window_end_s", *cols, "requests",
               *[f"p{round(q * 100):d}_s" for q in quantiles]]
    return pd.DataFrame.from_records(records, columns=columns)


#: The bands of the usage-log TTFT panel (rule 4): ``(band, lowest cached share)`` in order,
#: a request's cached share being ``cached_tokens / prompt_tokens``. A request belongs to the
#: last band whose lowest share it reaches: *cold* below 10% (nothing, or only the first
#: block or two: a prefix broken near the top still caches the blocks before the break, so
#: "cached_tokens = 0" is nearly empty on real traffic), *partial* 10% to below 80%, *warm* 80%
#: and above (a chat turn whose whole history hit: only the new turn is computed; vLLM caches
#: whole blocks and never the prompt's last token, docs/vllm-prefix-cache.md).
TTFT_BANDS: tuple[tuple[str, float], ...] = (("cold", 0.0), ("partial", 0.10), ("warm", 0.80))


def ttft_band_sql(cached: str = "cached_tokens", prompt: str = "prompt_tokens") -> str:
    """The SQL ``CASE`` giving a request's :data:`TTFT_BANDS` name from its cached and prompt
    token columns (``prompt > 0``; compared as ``cached >= share * prompt``, no division)."""
    cases = " ".join(f"WHEN {cached} >= {share!r} * {prompt} THEN '{name}'"
                     for name, share in reversed(TTFT_BANDS[1:]))
    return f"CASE {cases} ELSE '{TTFT_BANDS[0][0]}' END"


@dataclass(frozen=True, slots=True)
class TtftBand:
    """One band of :data:`TTFT_BANDS` as data, for a page to format (``ttft_band("warm")``):

    - ``name``: ``cold``, ``partial`` or ``warm``;
    - ``low``: the lowest cached share in the band (a fraction, inclusive), None for the first
      band (from nothing cached);
    - ``high``: the share the band stays below (a fraction, exclusive), None for the last band;
    - ``unit``: what the share is of, ``"cached"``: cached_tokens / prompt_tokens of a request.
    """

    name: str
    low: float | None
    high: float | None
    unit: str = "cached"


def ttft_bands() -> tuple[TtftBand, ...]:
    """Every band of :data:`TTFT_BANDS` as :class:`TtftBand`, in that order (cold first)."""
    out = []
    for k, (name, share) in enumerate(TTFT_BANDS):
        out.append(TtftBand(name=name, low=None if k == 0 else float(share),
                            high=float(TTFT_BANDS[k + 1][1]) if k + 1 < len(TTFT_BANDS) else None))
    return tuple(out)


def ttft_band(band: str) -> TtftBand:
    """The parts of one band (:class:`TtftBand`): ``ttft_band("partial")`` is ``TtftBand("partial",
    0.1, 0.8, "cached")``.

    Raises:
        InvalidArgument: ``band`` is not in :data:`TTFT_BANDS`.
    """
    for b in ttft_bands():
        if b.name == band:
            return b
    names = ", ".join(n for n, _ in TTFT_BANDS)
    raise InvalidArgument(f"not a TTFT band: {band!r} (one of {names})")


def ttft_band_label(band: str) -> str:
    """The legend text of a band with its rule, formatted from :func:`ttft_band` by
    :func:`prefixscope.core.formatting.fmt_share_band`: ``'cold (< 10% cached)'``,
    ``'partial (10–80% cached)'``, ``'warm (≥ 80% cached)'``.

    Raises:
        InvalidArgument: ``band`` is not in :data:`TTFT_BANDS`.
    """
    b = ttft_band(band)
    return f"{b.name} ({fmt_share_band(b.low, b.high, b.unit)})"


def ttft_by_band_window(con: duckdb.DuckDBPyConnection, *, start_s: float | None,
                        end_s: float | None, window_s: float,
                        by: Sequence[str] = ("model",),
                        models: Sequence[str] | None = None,
                        instances: Sequence[str] | None = None,
                        run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """TTFT p50 and p90 per window and group from the usage log, per cached-share band (rule
    4): ``quantile_cont(ttft_ms)`` in DuckDB over the window's requests of each band of
    :data:`TTFT_BANDS` (``cached_tokens / prompt_tokens``: cold < 10%, partial, warm >= 80%).
    Grouped by model by default: one model's warm requests are not averaged with another's.

    A band by share, not ``cached_tokens = 0``: a request whose prefix broke after the first
    block still caches that block, so "miss = 0 cached tokens" is nearly empty on real traffic.
    Requests without ``ttft_ms`` or ``cached_tokens``, or with no prompt tokens, are left out.

    Returns:
        Columns ``window_start_s``, ``window_end_s`` (Unix s), the ``by`` columns, ``band``
        (``cold`` / ``partial`` / ``warm``), ``requests``, ``p50_ms``, ``p90_ms``
        (milliseconds); oldest window first, then by group, bands in :data:`TTFT_BANDS` order.
        A band without requests in a window has no row.

    Raises:
        InvalidArgument: ``window_s`` <= 0, or a ``by`` column that is not a grouping column.
    """
    _window(window_s)
    cols = _by_columns(by)
    group = "".join(f", {c}" for c in cols)
    clauses = ["ttft_ms IS NOT NULL", "cached_tokens IS NOT NULL", "prompt_tokens > 0",
               "ts_unix_s IS NOT NULL"]
    params: list[Any] = []
    for col, values in (("model", models), ("instance", instances), ("run_id", run_ids)):
        if values is not None:
            clauses.append(f"list_contains(?::VARCHAR[], {col})")
            params.append(list(values))
    if start_s is not None:
        clauses.append("ts_unix_s >= ?")
        params.append(float(start_s))
    if end_s is not None:
        clauses.append("ts_unix_s < ?")
        params.append(float(end_s))
    ws, wp = window_start_sql("ts_unix_s", window_s=window_s)
    order = "CASE band " + " ".join(f"WHEN '{n}' THEN {k}" for k, (n, _) in
                                    enumerate(TTFT_BANDS)) + " END"
    return con.execute(f"""
        WITH win AS (
            SELECT {ws} AS window_start_s{group}, ttft_ms, {ttft_band_sql()} AS band
            FROM {archive.relation(con, 'requests', start_s, end_s)}
            WHERE {' AND '.join(clauses)}
        )
        SELECT window_start_s, window_start_s + ? AS window_end_s{group}, band,
               count(*) AS requests,
               quantile_cont(ttft_ms, 0.5) AS p50_ms, quantile_cont(ttft_ms, 0.9) AS p90_ms
        FROM win GROUP BY window_start_s{group}, band
        ORDER BY window_start_s{group}, {order}
    """, [*wp, *params, float(window_s)]).df()
