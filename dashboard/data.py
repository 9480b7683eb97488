"""The dashboard's data layer: cached wrappers around ``prefixscope.store.queries``.

Every function here opens ONE read-only connection with :func:`prefixscope.store.db.reader` for its call,
runs one named query function and closes it (see the locking protocol in ``store/db.py``):
a connection is never cached or held, so an ingester in another process can take the write lock
between two calls. Results are cached with ``st.cache_data``, keyed also by the TTL period
of the call: a result is reused until the clock reaches the next multiple of
:data:`CACHE_TTL_S` (``[dashboard] cache_ttl_s`` of the settings, default 15 s), so new data
appears at most that long after an ingest commits. The TTL and the clock are module
attributes read at every call (:func:`ttl_period`), so tests move the clock instead of
sleeping. Pages never call ``store`` themselves and never write SQL.

Lock conflicts are retried inside :func:`prefixscope.store.db.reader` for :data:`LOCK_TIMEOUT_S`; after that
:class:`~prefixscope.core.errors.StoreLocked` propagates (a failed call is not cached) and
:func:`guard` turns it into a "database busy, retrying" notice and a rerun.

Arguments are hashable (tuples, not lists) because they key the cache. ``db`` is the database
path (part of the key: two databases never share results).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

import pandas as pd
import streamlit as st

from prefixscope.core.config import DEFAULT_DB_PATH, load_settings
from prefixscope.core.errors import ConfigError, PrefixscopeError, SchemaMismatch, SourceUnavailable, StoreLocked
from prefixscope.core.report import DEFAULT_THRESHOLD, threshold_for
from prefixscope.store import db as store_db

LOCK_TIMEOUT_S = 5.0
"""Seconds a dashboard read keeps retrying a lock before the page shows "database busy"."""
BUSY_RETRIES = 10
"""Automatic reruns after a "database busy" notice before the page asks for a manual reload."""
BUSY_RETRY_DELAY_S = 1.0


def _settings_ttl() -> float:
    try:
        return float(load_settings().dashboard.cache_ttl_s)
    except ConfigError:
        return 15.0


def _settings_live() -> bool:
    try:
        return bool(load_settings().dashboard.live)
    except ConfigError:
        return True


CACHE_TTL_S: float = _settings_ttl()
"""Seconds a query result is reused at most (``[dashboard] cache_ttl_s``, read at import; a
module attribute read at every call, so it can be set)."""

LIVE_DEFAULT: bool = _settings_live()
"""Whether the sidebar's **Live** toggle starts on (``[dashboard] live``, read at import)."""

clock = time.time
"""The clock of the cache periods (seconds); replaced by tests to expire results at once."""


def ttl_period() -> int:
    """The cache period of now: ``floor(clock() / CACHE_TTL_S)``; results cached in an earlier
    period are not reused."""
    return int(clock() // max(float(CACHE_TTL_S), 1e-3))


def alert_threshold(model: str | None = None) -> float:
    """The OK/ALERT boundary of ``model`` as a fraction
    (:func:`prefixscope.core.report.threshold_for`: ``[alerts] per_model_threshold[model]``, else
    ``[alerts] hit_rate_threshold``). A broken config file (or a threshold outside [0, 1]) falls
    back to :data:`prefixscope.core.report.DEFAULT_THRESHOLD`: a page still draws."""
    try:
        return threshold_for(load_settings().alerts, model)
    except ConfigError:
        return DEFAULT_THRESHOLD


def store_version(db: str) -> tuple:
    """What changes when a writer commits to the store at ``db``: ``(size, mtime_ns)`` of the
    database file and of its ``.wal`` (DuckDB appends a commit to the WAL and a checkpoint
    rewrites the file), None for a file that is not there. Two ``stat`` calls, no connection;
    a reader never changes it. The Live ticker re-runs the page when it moves."""
    out = []
    for path in (db, db + ".wal"):
        try:
            st_ = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st_.st_size, st_.st_mtime_ns))
    return tuple(out)


def min_query_tokens() -> int:
    """``[alerts] min_query_tokens`` (prompt tokens): under it a window of the Overview's hit-rate
    chart is low volume (``figures.hit_rate_over_time``); a broken config file gives the
    default (``AlertsConfig``'s 1,000)."""
    from prefixscope.core.config import AlertsConfig

    try:
        return int(load_settings().alerts.min_query_tokens)
    except ConfigError:
        return int(AlertsConfig.model_fields["min_query_tokens"].default)


def db_path(argv: list[str] | None = None) -> str:
    """The database the dashboard reads.

    Order: ``--db PATH`` after ``--`` on the ``streamlit run dashboard/app.py -- --db PATH``
    command line, then ``$PREFIXSCOPE_DB``, then ``[store] db`` of the settings file
    (``$PREFIXSCOPE_CONFIG`` or ``./prefixscope.toml``), then ``data/prefixscope.duckdb``. Command-line
    arguments are only read when the running script is the dashboard's ``app.py`` (under a test
    runner ``sys.argv`` belongs to the runner).
    """
    args = sys.argv if argv is None else argv
    if args and os.path.basename(args[0]) == "app.py":
        for i, a in enumerate(args[1:], start=1):
            if a == "--db" and i + 1 < len(args):
                return args[i + 1]
            if a.startswith("--db="):
                return a.split("=", 1)[1]
    if os.environ.get("PREFIXSCOPE_DB"):
        return os.environ["PREFIXSCOPE_DB"]
    try:
        return load_settings().store.db
    except ConfigError:
        return DEFAULT_DB_PATH


@contextlib.contextmanager
def _reader(db: str) -> Iterator:
    with store_db.reader(db, lock_timeout_s=LOCK_TIMEOUT_S) as con:
        yield con


def _t(values: tuple[str, ...] | None) -> list[str] | None:
    return list(values) if values is not None else None


MAX_ENTRIES = 64
"""Cached results kept per query function. Sized for memory (issue 17): a result is at most
windows x series rows (the largest, 5 min windows of a month for 10 instances, is ~86,000 rows,
~7 MB), never per-request rows, so 64 entries of each function stay well under the 1 GB budget
of the dashboard process; 64 covers every filter and window choice of a few users in a TTL."""


def _cached(fn):
    """``fn`` cached per arguments and TTL period (:func:`ttl_period`)."""
    import functools

    def in_period(period: int, *args, **kwargs):  # ``period`` is hashed: part of the key
        return fn(*args, **kwargs)

    in_period.__qualname__ = in_period.__name__ = f"{fn.__name__}_in_period"  # one cache each
    cached = st.cache_data(show_spinner=False, max_entries=MAX_ENTRIES)(in_period)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return cached(ttl_period(), *args, **kwargs)

    call.clear = cached.clear
    return call


@_cached
def query(db: str, module: str, name: str, **kwargs):
    """One cached call of ``prefixscope.store.queries.<module>.<name>(con, **kwargs)`` on a read-only
    connection opened for the call (tuples in ``kwargs`` become lists). For pages whose queries
    have no wrapper of their own (Replay, Scopes, Rejections, Invariants)."""
    import importlib

    q = importlib.import_module(f"prefixscope.store.queries.{module}")
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
    with _reader(db) as con:
        return getattr(q, name)(con, **args)


# --- filters -------------------------------------------------------------------------------


def latency_quantile_error() -> float:
    """The relative error bound of the latency quantiles the Requests page shows (a fraction:
    ``prefixscope.store.queries.requests.LATENCY_QUANTILE_ERROR``, sqrt(1.02) - 1)."""
    from prefixscope.store.queries.requests import LATENCY_QUANTILE_ERROR

    return float(LATENCY_QUANTILE_ERROR)


def ttft_bands_caption() -> str:
    """The text under a ``figures.ttft_by_band`` chart: the band rule, from
    :data:`prefixscope.store.queries.serving.TTFT_BANDS` (docs/metrics.md "Serving")."""
    from prefixscope.store.queries.serving import TTFT_BANDS, ttft_band_label

    bands = ", ".join(ttft_band_label(b) for b, _ in TTFT_BANDS)
    return ("Each request is in a band by its cached share, cached_tokens ÷ prompt_tokens: "
            f"{bands}. A prefix that broke after the first block still caches that block, so "
            "\"0 cached tokens\" alone would be nearly empty. p50 and p90 are exact quantiles "
            "of ttft_ms per window, model and band, computed in DuckDB.")


@_cached
def filter_values(db: str) -> dict:
    """Choices for the sidebar: union of the metric and request stores.

    Returns:
        ``models``, ``instances`` (production instances first), ``run_ids`` (sorted lists) and ``min_ts_unix_s``,
        ``max_ts_unix_s`` (Unix seconds, or None when nothing is stored),
        ``production_max_ts_unix_s`` (the newest production data, ``run_id = ''``; None).
    """
    from prefixscope.store.queries import metrics as qm
    from prefixscope.store.queries import requests as qr

    with _reader(db) as con:
        m = qm.metric_filter_values(con)
        r = qr.request_filter_values(con)
    lows = [v for v in (m.get("min_ts_unix_s"), r.get("min_ts_unix_s")) if v is not None]
    highs = [v for v in (m.get("max_ts_unix_s"), r.get("max_ts_unix_s")) if v is not None]
    prods = [v for v in (m.get("production_max_ts_unix_s"), r.get("production_max_ts_unix_s"))
             if v is not None]
    production = {x for x in [*m.get("production_instances", []),
                              *r.get("production_instances", [])] if x}
    instances = {x for x in [*m.get("instances", []), *r.get("instances", [])] if x}
    return {
        "models": sorted({x for x in [*m.get("models", []), *r.get("models", [])] if x}),
        # production instances first, then the replay runs' and captures' instances
        "instances": sorted(instances, key=lambda x: (x not in production, x)),
        "run_ids": sorted({x for x in [*m.get("run_ids", []), *r.get("run_ids", [])]
                           if x is not None}),
        "min_ts_unix_s": min(lows) if lows else None,
        "max_ts_unix_s": max(highs) if highs else None,
        "production_max_ts_unix_s": max(prods) if prods else None,
        "metric_max_ts_unix_s": m.get("max_ts_unix_s"),
        "request_max_ts_unix_s": r.get("max_ts_unix_s"),
    }


# --- metrics (H1: store/queries/metrics.py) -------------------------------------------------


@_cached
def hit_rate_by_window(db: str, *, start_s: float | None, end_s: float | None, window_s: float,
                       by: tuple[str, ...] = ("model", "instance"),
                       models: tuple[str, ...] | None = None,
                       instances: tuple[str, ...] | None = None,
                       run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.metrics.hit_rate_by_window`` (counter increases per window; columns
    ``window_start_s, window_end_s, <by>, hit_tokens, query_tokens, hit_rate, restarts, legacy,
    external_hit_tokens``)."""
    from prefixscope.store.queries import metrics as q

    with _reader(db) as con:
        return q.hit_rate_by_window(con, start_s=start_s, end_s=end_s, window_s=window_s,
                                    by=by, models=_t(models), instances=_t(instances),
                                    run_ids=_t(run_ids))


@_cached
def hit_rate_totals(db: str, *, start_s: float | None, end_s: float | None,
                    by: tuple[str, ...] = ("model",), models: tuple[str, ...] | None = None,
                    instances: tuple[str, ...] | None = None,
                    run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.metrics.hit_rate_totals`` (``<by>, hit_tokens, query_tokens, hit_rate,
    legacy, first_ts_unix_s, last_ts_unix_s``)."""
    from prefixscope.store.queries import metrics as q

    with _reader(db) as con:
        return q.hit_rate_totals(con, start_s=start_s, end_s=end_s, by=by, models=_t(models),
                                 instances=_t(instances), run_ids=_t(run_ids))


@_cached
def cache_config(db: str, *, instances: tuple[str, ...] | None = None,
                 run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.metrics.cache_config`` (latest ``cache_config_info`` per instance/engine)."""
    from prefixscope.store.queries import metrics as q

    with _reader(db) as con:
        return q.cache_config(con, instances=_t(instances), run_ids=_t(run_ids))


@_cached
def last_sample_ts(db: str, *, instances: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.metrics.last_sample_ts`` (``instance, model, last_ts_unix_s``)."""
    from prefixscope.store.queries import metrics as q

    with _reader(db) as con:
        return q.last_sample_ts(con, instances=_t(instances))


# --- requests and savings (H2: store/queries/requests.py, savings.py) -----------------------


@_cached
def request_hit_rate_by_window(db: str, *, start_s: float | None, end_s: float | None,
                               window_s: float, by: tuple[str, ...] = ("model",),
                               models: tuple[str, ...] | None = None,
                               instances: tuple[str, ...] | None = None,
                               run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.requests.request_hit_rate_by_window`` (Σ cached / Σ reported prompt
    tokens per window, with coverage)."""
    from prefixscope.store.queries import requests as q

    with _reader(db) as con:
        return q.request_hit_rate_by_window(con, start_s=start_s, end_s=end_s, window_s=window_s,
                                            by=by, models=_t(models), instances=_t(instances),
                                            run_ids=_t(run_ids))


@_cached
def request_hit_rate_totals(db: str, *, start_s: float | None, end_s: float | None,
                            by: tuple[str, ...] = ("model",),
                            models: tuple[str, ...] | None = None,
                            instances: tuple[str, ...] | None = None,
                            run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.requests.request_hit_rate_totals`` (Σ cached / Σ reported
    prompt tokens over the range per group, ``first_ts_unix_s``, ``last_ts_unix_s``)."""
    return _request_query("request_hit_rate_totals", db, models, instances, run_ids,
                          start_s=start_s, end_s=end_s, by=by)


@_cached
def uncounted_note(db: str, *, start_s: float | None, end_s: float | None,
                   models: tuple[str, ...] | None = None,
                   instances: tuple[str, ...] | None = None,
                   run_ids: tuple[str, ...] | None = None) -> str | None:
    """Both figures (counters, per request) of the selection and why they differ, when
    gateway-rejected requests make them differ (``prefixscope.core.report.uncounted_note_of``
    over ``prefixscope.store.queries.requests.counters_and_requests``); None otherwise."""
    from prefixscope.core.report import uncounted_note_of

    return uncounted_note_of(_request_query("counters_and_requests", db, models, instances,
                                            run_ids, start_s=start_s, end_s=end_s))


@_cached
def usage_totals_and_note(db: str, *, start_s: float | None, end_s: float | None,
                          models: tuple[str, ...] | None = None,
                          instances: tuple[str, ...] | None = None,
                          run_ids: tuple[str, ...] | None = None
                          ) -> tuple[pd.DataFrame, str | None]:
    """Overview's usage-log figures in one call and one read of the usage log: the
    ``request_hit_rate_totals`` rows by model (the cards of models without counters, or of
    every model without counters) and the :func:`uncounted_note` of the same selection, summed
    from those rows (``counters_and_requests(request_totals=...)``), on one connection."""
    from prefixscope.core.report import uncounted_note_of
    from prefixscope.store.queries import requests as q

    sel = dict(start_s=start_s, end_s=end_s, models=_t(models), instances=_t(instances),
               run_ids=_t(run_ids))
    with _reader(db) as con:
        totals = q.request_hit_rate_totals(con, by=("model",), **sel)
        note = uncounted_note_of(q.counters_and_requests(con, request_totals=totals, **sel))
    return totals, note


def _request_query(name: str, db: str, models, instances, run_ids, **kwargs):
    from prefixscope.store.queries import requests as q

    with _reader(db) as con:
        return getattr(q, name)(con, models=_t(models), instances=_t(instances),
                                run_ids=_t(run_ids), **kwargs)


@_cached
def request_counts(db: str, *, start_s: float | None, end_s: float | None,
                   models: tuple[str, ...] | None = None,
                   instances: tuple[str, ...] | None = None,
                   run_ids: tuple[str, ...] | None = None) -> dict[str, int]:
    """``prefixscope.store.queries.requests.request_counts`` (``requests, reported_requests,
    hit_requests, with_ttft, with_latency``)."""
    return _request_query("request_counts", db, models, instances, run_ids, start_s=start_s,
                          end_s=end_s)


@_cached
def request_hit_rate_bands(db: str, *, start_s: float | None, end_s: float | None,
                           window_s: float, models: tuple[str, ...] | None = None,
                           instances: tuple[str, ...] | None = None,
                           run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.requests.request_hit_rate_bands`` by model (quantiles of
    per-request hit rate per window)."""
    return _request_query("request_hit_rate_bands", db, models, instances, run_ids,
                          start_s=start_s, end_s=end_s, window_s=window_s, by=("model",))


@_cached
def request_latency_quantiles(db: str, *, column: str, start_s: float | None,
                              end_s: float | None, models: tuple[str, ...] | None = None,
                              instances: tuple[str, ...] | None = None,
                              run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.requests.request_latency_quantiles`` (quantiles per
    cached-share band: cold, partial, warm)."""
    return _request_query("request_latency_quantiles", db, models, instances, run_ids,
                          column=column, start_s=start_s, end_s=end_s)


@_cached
def newest_requests(db: str, *, start_s: float | None, end_s: float | None, limit: int = 500,
                    offset: int = 0, models: tuple[str, ...] | None = None,
                    instances: tuple[str, ...] | None = None,
                    run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.requests.newest_requests`` (one page, newest first)."""
    return _request_query("newest_requests", db, models, instances, run_ids, start_s=start_s,
                          end_s=end_s, limit=limit, offset=offset)


@_cached
def request_hit_rate_histogram(db: str, *, start_s: float | None, end_s: float | None,
                               bins: int = 20, models: tuple[str, ...] | None = None,
                               instances: tuple[str, ...] | None = None,
                               run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.requests.request_hit_rate_histogram`` (``bin_start, bin_end,
    requests``: per-request hit rates counted in ``bins`` equal bins over [0, 1])."""
    from prefixscope.store.queries import requests as q

    with _reader(db) as con:
        return q.request_hit_rate_histogram(con, bins=bins, start_s=start_s, end_s=end_s,
                                            models=_t(models), instances=_t(instances),
                                            run_ids=_t(run_ids))


@_cached
def cached_tokens_coverage(db: str, *, start_s: float | None, end_s: float | None,
                           models: tuple[str, ...] | None = None,
                           instances: tuple[str, ...] | None = None,
                           run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.requests.cached_tokens_coverage`` (``model, instance, requests,
    reported_requests, coverage``)."""
    from prefixscope.store.queries import requests as q

    with _reader(db) as con:
        return q.cached_tokens_coverage(con, start_s=start_s, end_s=end_s, models=_t(models),
                                        instances=_t(instances), run_ids=_t(run_ids))


@_cached
def savings_by_model(db: str, *, start_s: float | None, end_s: float | None,
                     models: tuple[str, ...] | None = None,
                     instances: tuple[str, ...] | None = None,
                     run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.savings.savings_by_model`` (cost without/with cache per model)."""
    from prefixscope.store.queries import savings as q

    with _reader(db) as con:
        return q.savings_by_model(con, start_s=start_s, end_s=end_s, models=_t(models),
                                  instances=_t(instances), run_ids=_t(run_ids))


@_cached
def savings_totals(db: str, *, start_s: float | None, end_s: float | None,
                   models: tuple[str, ...] | None = None,
                   instances: tuple[str, ...] | None = None,
                   run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.savings.savings_totals`` (sums over priced models per currency and
    shadow/list, never mixing them)."""
    from prefixscope.store.queries import savings as q

    with _reader(db) as con:
        return q.savings_totals(con, start_s=start_s, end_s=end_s, models=_t(models),
                                instances=_t(instances), run_ids=_t(run_ids))


@_cached
def savings_by_window(db: str, *, start_s: float | None, end_s: float | None, window_s: float,
                      models: tuple[str, ...] | None = None,
                      instances: tuple[str, ...] | None = None,
                      run_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``prefixscope.store.queries.savings.savings_by_window`` (saved per window and model)."""
    from prefixscope.store.queries import savings as q

    with _reader(db) as con:
        return q.savings_by_window(con, start_s=start_s, end_s=end_s, window_s=window_s,
                                   models=_t(models), instances=_t(instances),
                                   run_ids=_t(run_ids))


# --- ingest bookkeeping (store/queries/ingest.py) ------------------------------------------


@_cached
def ingest_sources(db: str) -> pd.DataFrame:
    """``prefixscope.store.queries.ingest.ingest_sources`` (every source ingested, newest first)."""
    from prefixscope.store.queries import ingest as q

    with _reader(db) as con:
        return q.ingest_sources(con)


@_cached
def quarantined_lines(db: str, *, limit: int = 1000) -> pd.DataFrame:
    """``prefixscope.store.queries.ingest.quarantined_lines`` (newest first)."""
    from prefixscope.store.queries import ingest as q

    with _reader(db) as con:
        return q.quarantined_lines(con, limit=limit)


@_cached
def table_row_counts(db: str) -> dict[str, int]:
    """``prefixscope.store.queries.ingest.table_row_counts`` (rows per table)."""
    from prefixscope.store.queries import ingest as q

    with _reader(db) as con:
        return q.table_row_counts(con)


# --- error handling for pages ---------------------------------------------------------------

_BUSY_KEY = "prefixscope.busy_retries"

NO_DATABASE_HINT = (
    "Create it with `make demo`, or ingest something: "
    "`prefixscope ingest metrics http://localhost:8000/metrics --db {db}` or "
    "`prefixscope ingest requests usage.jsonl --db {db}`."
)


def clear_cache() -> None:
    """Forget every cached result (the sidebar's "Refresh now")."""
    st.cache_data.clear()


@contextlib.contextmanager
def guard(db: str) -> Iterator[None]:
    """Run a page body, turning the store's expected errors into messages instead of tracebacks.

    - :class:`StoreLocked` (a writer held the lock past :data:`LOCK_TIMEOUT_S`): a "database
      busy, retrying" notice, then an automatic rerun after :data:`BUSY_RETRY_DELAY_S`, up to
      :data:`BUSY_RETRIES` times in a row.
    - :class:`SourceUnavailable` (no database file): how to create one.
    - :class:`SchemaMismatch` and any other :class:`PrefixscopeError`: the message, as an error.
    """
    try:
        yield
    except StoreLocked:
        n = int(st.session_state.get(_BUSY_KEY, 0))
        if n < BUSY_RETRIES:
            st.session_state[_BUSY_KEY] = n + 1
            st.warning("Database busy: an ingest is writing to it. Retrying…",
                       icon=":material/hourglass_top:")
            time.sleep(BUSY_RETRY_DELAY_S)
            st.rerun()
        st.session_state[_BUSY_KEY] = 0
        st.warning("Database still busy after several retries: reload the page in a moment.",
                   icon=":material/hourglass_top:")
        return
    except SourceUnavailable as exc:
        if os.path.exists(db):  # there but unreadable: creating it is not the advice
            st.error(str(exc), icon=":material/error:")
        else:
            st.info(f"{exc}\n\n" + NO_DATABASE_HINT.format(db=db), icon=":material/database:")
        return
    except SchemaMismatch as exc:
        st.error(str(exc), icon=":material/error:")
        return
    except PrefixscopeError as exc:
        st.error(str(exc), icon=":material/error:")
        return
    st.session_state[_BUSY_KEY] = 0
