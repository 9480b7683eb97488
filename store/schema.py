"""Versioned DuckDB schema: every table, view and migration of prefixscope, in one module.

A migration is ``(number, name, statements)``. :func:`prefixscope.store.db.migrate` applies, in number order,
every migration whose number is not yet recorded in ``schema_migrations``; a database that
records a number this code does not know raises :class:`~prefixscope.core.errors.SchemaMismatch`.
Numbers are never reused and applied migrations are never edited: add a new one.

Reserved numbers, one owner each, so that parallel work never collides:
1 core tables, 2 metrics and KV events, 3 requests and prices, 4 replay runs,
5 scopes and decisions, 6 alerts, 7 live replay, 8 run ids on metric samples,
9 requests digest key, 10-19 counts you can trust (issue 11: metric_samples keyed by run),
20-29 hostile input (issue 12; none used yet), 30-39 diagnose (issue 13: 30 diagnoses and
breakers; issue 26: 31 miss ledger totals),
40-49 first contact (issue 14: alert_sends.claimed_by),
60-69 ecosystem ingest (OTLP, LiteLLM, Langfuse, genai-prices, residency),
70-79 production scale (issue 17: 70 stored counter increases, 71-72 rollups, 73 retention and
archive, 75 scope rollup, 76 series heads with model and engine, 77 latency histogram rollup,
78 latency rollup by cached-share band, 79 requests without the primary-key index). Columns documented in
``docs/schema.md``.

Conventions: times are ``*_unix_s`` DOUBLE (UTC seconds); token counts BIGINT; NULL means
"not reported", never 0; hit rates are fractions.
"""

from __future__ import annotations

from typing import NamedTuple

from prefixscope.store import scope_sql


class Migration(NamedTuple):
    """One schema step: a number (unique, never reused), a name and its DDL statements."""

    number: int
    name: str
    statements: tuple[str, ...]


_CORE = (
    """
    CREATE TABLE IF NOT EXISTS ingest_sources (
        source_id          VARCHAR PRIMARY KEY,  -- stable id: kind + resolved location
        kind               VARCHAR NOT NULL,     -- metrics-file, metrics-url, requests, prometheus, ...
        location           VARCHAR NOT NULL,     -- file path or URL (never credentials)
        checkpoint_offset  BIGINT,               -- bytes of a file already read (for tailing)
        checkpoint_line    BIGINT,               -- lines of a file already read
        fingerprint        VARCHAR,              -- sha256 of the first 4 KiB: detects a replaced file
        rows_added         BIGINT NOT NULL DEFAULT 0,
        first_ingest_unix_s DOUBLE,
        last_ingest_unix_s  DOUBLE,
        note               VARCHAR               -- e.g. 'legacy metric names (vllm:gpu_prefix_cache_*)'
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS ingest_runs (
        ingest_run_id     VARCHAR PRIMARY KEY,
        source_id         VARCHAR NOT NULL,
        kind              VARCHAR NOT NULL,
        started_unix_s    DOUBLE NOT NULL,
        finished_unix_s   DOUBLE,
        rows_read         BIGINT NOT NULL DEFAULT 0,
        rows_added        BIGINT NOT NULL DEFAULT 0,
        rows_duplicate    BIGINT NOT NULL DEFAULT 0,
        rows_quarantined  BIGINT NOT NULL DEFAULT 0,
        status            VARCHAR NOT NULL,      -- ok, partial, failed
        message           VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS quarantine (
        source_id      VARCHAR NOT NULL,
        location       VARCHAR NOT NULL,          -- file path or URL
        line           BIGINT NOT NULL,           -- 1-based; 0 when the source has no lines
        field          VARCHAR,                   -- JSON path or metric/label name at fault
        reason         VARCHAR NOT NULL,          -- never holds prompt text or tenant ids
        ingest_run_id  VARCHAR,
        at_unix_s      DOUBLE NOT NULL,
        PRIMARY KEY (source_id, line)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS metric_samples (
        metric          VARCHAR NOT NULL,  -- canonical sample name, e.g. vllm:prefix_cache_hits_total
        labels          VARCHAR NOT NULL,  -- JSON object of all labels but instance/job, keys sorted
        instance        VARCHAR NOT NULL,  -- scrape target (host:port) or the name given to a file
        model           VARCHAR,           -- label model_name
        engine          VARCHAR,           -- label engine (data-parallel rank)
        ts_unix_s       DOUBLE NOT NULL,   -- scrape time, or counter start for a created-zero
        value           DOUBLE NOT NULL,
        raw_metric      VARCHAR NOT NULL,  -- name as exposed (differs from metric for legacy names)
        legacy          BOOLEAN NOT NULL DEFAULT FALSE,
        created_zero    BOOLEAN NOT NULL DEFAULT FALSE, -- a 0 placed at the counter's _created time
        source_id       VARCHAR NOT NULL,
        PRIMARY KEY (metric, labels, instance, ts_unix_s)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS requests (
        run_id              VARCHAR NOT NULL DEFAULT '',  -- '' for production traffic
        request_id          VARCHAR NOT NULL,  -- provider id (chatcmpl-...), else source:line
        source_id           VARCHAR NOT NULL,
        line                BIGINT,
        ts_unix_s           DOUBLE,            -- request time (response 'created' or log time)
        ts_estimated        BOOLEAN NOT NULL DEFAULT FALSE,
        model               VARCHAR,
        instance            VARCHAR,
        endpoint            VARCHAR,           -- completions, chat, messages, responses, ...
        usage_shape         VARCHAR,           -- openai, vllm-messages, anthropic, bedrock, gemini, ...
        prompt_tokens       BIGINT,            -- inclusive of cached and cache-write tokens
        cached_tokens       BIGINT,            -- NULL = not reported; 0 = reported, no hit
        cache_write_tokens  BIGINT,            -- NULL = not reported
        completion_tokens   BIGINT,
        ttft_ms             DOUBLE,
        latency_ms          DOUBLE,
        scope               VARCHAR,           -- PUBLIC, TENANT, PRINCIPAL, or NULL
        tenant_digest       VARCHAR,           -- short HMAC digest of the namespace, never a raw id
        flags               VARCHAR,           -- comma list, e.g. 'exclusive-input-suspected'
        PRIMARY KEY (run_id, request_id)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS runs (
        run_id          VARCHAR PRIMARY KEY,
        kind            VARCHAR NOT NULL,     -- production, replay-sim, replay-live
        label           VARCHAR,
        created_unix_s  DOUBLE,
        params_json     VARCHAR,              -- the replay parameters, JSON
        source_id       VARCHAR
    )
    """,
)


_REQUESTS_AND_PRICES = (
    # Price table, loaded from a TOML file by `prefixscope ingest prices` (ingest/prices.py),
    # replaced whole in one transaction. One row per model name or alias; prices in `currency`
    # per million tokens, exact decimals. Formulas: docs/metrics.md "Cost and savings".
    """
    CREATE TABLE IF NOT EXISTS prices (
        model                    VARCHAR PRIMARY KEY,  -- as it appears in requests.model
        priced_as                VARCHAR NOT NULL,     -- the price-table entry (differs for an alias)
        currency                 VARCHAR NOT NULL,     -- ISO 4217 code, e.g. USD, INR
        input_per_mtok           DECIMAL(18, 6) NOT NULL,  -- uncached input
        cached_input_per_mtok    DECIMAL(18, 6) NOT NULL,  -- cache read
        cache_write_per_mtok     DECIMAL(18, 6) NOT NULL,  -- cache write (5 min TTL); = input: no premium
        cache_write_1h_per_mtok  DECIMAL(18, 6) NOT NULL,  -- cache write, 1 h TTL (Anthropic)
        output_per_mtok          DECIMAL(18, 6) NOT NULL,
        shadow                   BOOLEAN NOT NULL,     -- a shadow price for a self-hosted model
        price_source             VARCHAR NOT NULL,     -- label shown wherever the number appears
        price_file               VARCHAR,              -- file it was loaded from
        loaded_unix_s            DOUBLE NOT NULL
    )
    """,
    # The part of cache_write_tokens written with a 1 h TTL (Anthropic cache_creation
    # .ephemeral_1h_input_tokens); NULL when the source does not split writes by TTL.
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS cache_write_1h_tokens BIGINT",
)

#: The ``requests`` key: MD5 (128 bits, DuckDB ``md5_number``, stored as a UUID so that every
#: client reads it; pandas has no 128-bit integer) of an unambiguous encoding of
#: ``(run_id, request_id)``: the length of ``run_id`` in characters, ``:``, ``run_id``,
#: ``request_id``. One fixed-width ART key instead of two VARCHARs: on random provider ids
#: (``chatcmpl-8e0e3b17bd6accf5``) the insert costs 0.4-1.4 us per row less
#: (docs/benchmarks.md "Usage-log ingest"). Two different pairs share a key with probability
#: about n^2 / 2^129 for n stored rows (1e-20 at n = 1e9); when they would, the second is
#: skipped as a duplicate: a pair is never stored twice.
REQUEST_KEY_SQL = ("CAST(md5_number(CAST(length(run_id) AS VARCHAR) || ':' || run_id || request_id)"
                   " AS UUID)")

_REQUESTS_COLUMNS = (
    "run_id, request_id, source_id, line, ts_unix_s, ts_estimated, model, instance, endpoint, "
    "usage_shape, prompt_tokens, cached_tokens, cache_write_tokens, completion_tokens, ttft_ms, "
    "latency_ms, scope, tenant_digest, flags, cache_write_1h_tokens")

_REQUESTS_KEY = (
    # DuckDB cannot drop a primary key: the table is rebuilt with the same columns, in the same
    # order, plus request_key (primary key; the CHECK makes every writer compute it the same
    # way, so the key stands for the pair). The rows are copied with their keys, in one
    # transaction with the rest of the migration.
    f"""
    CREATE TABLE requests_m9 (
        run_id              VARCHAR NOT NULL DEFAULT '',
        request_id          VARCHAR NOT NULL,
        source_id           VARCHAR NOT NULL,
        line                BIGINT,
        ts_unix_s           DOUBLE,
        ts_estimated        BOOLEAN NOT NULL DEFAULT FALSE,
        model               VARCHAR,
        instance            VARCHAR,
        endpoint            VARCHAR,
        usage_shape         VARCHAR,
        prompt_tokens       BIGINT,
        cached_tokens       BIGINT,
        cache_write_tokens  BIGINT,
        completion_tokens   BIGINT,
        ttft_ms             DOUBLE,
        latency_ms          DOUBLE,
        scope               VARCHAR,
        tenant_digest       VARCHAR,
        flags               VARCHAR,
        cache_write_1h_tokens BIGINT,
        request_key         UUID NOT NULL PRIMARY KEY CHECK (request_key = {REQUEST_KEY_SQL})
    )
    """,
    f"INSERT INTO requests_m9 ({_REQUESTS_COLUMNS}, request_key) "
    f"SELECT {_REQUESTS_COLUMNS}, {REQUEST_KEY_SQL} FROM requests",
    "DROP TABLE requests",
    "ALTER TABLE requests_m9 RENAME TO requests",
)

_REQUESTS_UNINDEXED = (
    # Migration 79: request_key loses its PRIMARY KEY (DuckDB's ART index), keeps NOT NULL and
    # the CHECK. The index cost 3.5 us per inserted row on a fresh table and 7 us at 10 M
    # stored rows (insert plus COMMIT); the writers in store/queries/requests.py now skip a
    # stored or repeated key themselves: an anti-join of each batch's keys against the stored
    # ones (0.1 us per stored row and transaction), in the batch's write transaction
    # (docs/benchmarks.md "Usage-log ingest without the index"). DuckDB cannot drop a primary
    # key: the table is rebuilt with the same columns in the same order, rows copied.
    f"""
    CREATE TABLE requests_m79 (
        run_id              VARCHAR NOT NULL DEFAULT '',
        request_id          VARCHAR NOT NULL,
        source_id           VARCHAR NOT NULL,
        line                BIGINT,
        ts_unix_s           DOUBLE,
        ts_estimated        BOOLEAN NOT NULL DEFAULT FALSE,
        model               VARCHAR,
        instance            VARCHAR,
        endpoint            VARCHAR,
        usage_shape         VARCHAR,
        prompt_tokens       BIGINT,
        cached_tokens       BIGINT,
        cache_write_tokens  BIGINT,
        completion_tokens   BIGINT,
        ttft_ms             DOUBLE,
        latency_ms          DOUBLE,
        scope               VARCHAR,
        tenant_digest       VARCHAR,
        flags               VARCHAR,
        cache_write_1h_tokens BIGINT,
        request_key         UUID NOT NULL CHECK (request_key = {REQUEST_KEY_SQL}),
        provider            VARCHAR
    )
    """,
    f"INSERT INTO requests_m79 ({_REQUESTS_COLUMNS}, request_key, provider) "
    f"SELECT {_REQUESTS_COLUMNS}, request_key, provider FROM requests",
    "DROP TABLE requests",
    "ALTER TABLE requests_m79 RENAME TO requests",
    # One row that every transaction inserting into requests updates first: a second
    # connection's insert transaction open at the same time fails on it (DuckDB's write-write
    # conflict) instead of both passing the key check before either commits.
    "CREATE TABLE requests_writer (id INTEGER PRIMARY KEY, transactions BIGINT NOT NULL)",
    "INSERT INTO requests_writer VALUES (1, 0)",
)

_METRIC_SAMPLES_COLUMNS = (
    "metric, labels, instance, model, engine, ts_unix_s, value, raw_metric, legacy, "
    "created_zero, source_id, run_id")

_METRIC_SAMPLES_BY_RUN = (
    # The key gains run_id: two replay runs against the same instance name (two `replay
    # gateway` runs, or a live run and production scrapes of one server) keep their own
    # samples instead of the second being skipped as a duplicate. DuckDB cannot alter a
    # primary key: the table is rebuilt with the same columns in the same order, rows copied.
    """
    CREATE TABLE metric_samples_m10 (
        metric          VARCHAR NOT NULL,
        labels          VARCHAR NOT NULL,
        instance        VARCHAR NOT NULL,
        model           VARCHAR,
        engine          VARCHAR,
        ts_unix_s       DOUBLE NOT NULL,
        value           DOUBLE NOT NULL,
        raw_metric      VARCHAR NOT NULL,
        legacy          BOOLEAN NOT NULL DEFAULT FALSE,
        created_zero    BOOLEAN NOT NULL DEFAULT FALSE,
        source_id       VARCHAR NOT NULL,
        run_id          VARCHAR NOT NULL DEFAULT '',  -- '' production; else runs.run_id
        PRIMARY KEY (run_id, metric, labels, instance, ts_unix_s)
    )
    """,
    f"INSERT INTO metric_samples_m10 ({_METRIC_SAMPLES_COLUMNS}) "
    f"SELECT {_METRIC_SAMPLES_COLUMNS.removesuffix('run_id')}coalesce(run_id, '') "
    "FROM metric_samples",
    "DROP TABLE metric_samples",
    "ALTER TABLE metric_samples_m10 RENAME TO metric_samples",
)

_SERIES_KEY = ("m.run_id = s.run_id AND m.metric = s.metric AND m.labels = s.labels "
               "AND m.instance = s.instance AND m.ts_unix_s = s.ts_unix_s")

_COUNTER_INCREASES = (
    # Each sample's increase over its predecessor in its series (run_id, metric, labels,
    # instance), stored when it is written (store/queries/metrics.py insert_metric_samples):
    # has_prev NULL = not computed (a row written by other means: the queries then compute
    # every increase from the values), FALSE = first sample of its series, TRUE = increase,
    # is_reset and prev_ts_unix_s hold (rules in docs/metrics.md "Counter increases").
    "ALTER TABLE metric_samples ADD COLUMN has_prev BOOLEAN",
    "ALTER TABLE metric_samples ADD COLUMN increase DOUBLE",
    "ALTER TABLE metric_samples ADD COLUMN is_reset BOOLEAN",
    "ALTER TABLE metric_samples ADD COLUMN prev_ts_unix_s DOUBLE",
    f"""
    UPDATE metric_samples AS m
    SET has_prev = s.prev_value IS NOT NULL,
        increase = CASE WHEN s.value < s.prev_value THEN s.value ELSE s.value - s.prev_value END,
        is_reset = coalesce(s.value < s.prev_value, FALSE),
        prev_ts_unix_s = s.prev_ts_unix_s
    FROM (
        SELECT run_id, metric, labels, instance, ts_unix_s, value,
               lag(value) OVER w AS prev_value, lag(ts_unix_s) OVER w AS prev_ts_unix_s
        FROM metric_samples
        WINDOW w AS (PARTITION BY run_id, metric, labels, instance ORDER BY ts_unix_s)
    ) AS s
    WHERE {_SERIES_KEY}
    """,
    # The newest sample of every series: an in-order scrape computes its increases from it
    # without reading metric_samples.
    """
    CREATE TABLE metric_series_head (
        run_id     VARCHAR NOT NULL,
        metric     VARCHAR NOT NULL,
        labels     VARCHAR NOT NULL,
        instance   VARCHAR NOT NULL,
        ts_unix_s  DOUBLE NOT NULL,   -- newest sample of the series
        value      DOUBLE NOT NULL,   -- its value
        PRIMARY KEY (run_id, metric, labels, instance)
    )
    """,
    "INSERT INTO metric_series_head SELECT run_id, metric, labels, instance, max(ts_unix_s), "
    "arg_max(value, ts_unix_s) FROM metric_samples GROUP BY run_id, metric, labels, instance",
)

_REQUEST_ROLLUP = (
    # Per-minute aggregates of requests by run, model, instance and scope, maintained by the
    # ingest transaction that writes the requests (store/queries/requests.py
    # insert_request_rows): the Requests page's counts, coverage and per-window hit rates of a
    # month read ~50x fewer rows. Bucket [k * 60, (k + 1) * 60) of ts_unix_s; NULL = requests
    # without a time. Columns as store.queries.requests.ROLLUP_SELECT_SQL computes them.
    """
    CREATE TABLE request_rollup_1m (
        bucket_start_s          DOUBLE,            -- floor(ts_unix_s / 60) * 60
        run_id                  VARCHAR NOT NULL,
        model                   VARCHAR,
        instance                VARCHAR,
        scope                   VARCHAR,
        requests                BIGINT NOT NULL,   -- count(*)
        reported_requests       BIGINT NOT NULL,   -- cached_tokens reported (0 included)
        hit_requests            BIGINT NOT NULL,   -- cached_tokens > 0
        with_ttft               BIGINT NOT NULL,   -- reported and ttft_ms recorded
        with_latency            BIGINT NOT NULL,   -- reported and latency_ms recorded
        prompt_tokens           BIGINT,            -- sum (NULL when none recorded)
        reported_prompt_tokens  BIGINT,            -- sum over the reporting requests
        cached_tokens           BIGINT,            -- sum
        min_ts_unix_s           DOUBLE,
        max_ts_unix_s           DOUBLE
    )
    """,
    """
    INSERT INTO request_rollup_1m
    SELECT floor(ts_unix_s / 60.0) * 60.0, run_id, model, instance, scope, count(*),
           count(cached_tokens), count(*) FILTER (WHERE cached_tokens > 0),
           count(ttft_ms) FILTER (WHERE cached_tokens IS NOT NULL),
           count(latency_ms) FILTER (WHERE cached_tokens IS NOT NULL),
           CAST(sum(prompt_tokens) AS BIGINT),
           CAST(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS BIGINT),
           CAST(sum(cached_tokens) AS BIGINT), min(ts_unix_s), max(ts_unix_s)
    FROM requests GROUP BY ALL
    """,
)

_COUNTER_ROLLUP = (
    # Stored counter increases (migration 70) summed per 5-minute bucket of the later sample's
    # time, by run, metric, model, instance and engine; maintained by insert_metric_samples in
    # the scrape's transaction (store/queries/metrics.py). Overview's windows (5 min, 1 h,
    # 1 day) and totals read it for whole buckets.
    """
    CREATE TABLE counter_rollup_5m (
        bucket_start_s   DOUBLE NOT NULL,   -- floor(ts_unix_s / 300) * 300
        run_id           VARCHAR NOT NULL,
        metric           VARCHAR NOT NULL,
        model            VARCHAR,
        instance         VARCHAR NOT NULL,
        engine           VARCHAR,
        increase         DOUBLE,            -- sum of the samples' increases
        resets           BIGINT NOT NULL,   -- samples that are a drop (restart)
        legacy           BOOLEAN,           -- any sample from a vllm:gpu_prefix_cache_* name
        samples          BIGINT NOT NULL,   -- samples with an increase
        first_ts_unix_s  DOUBLE,            -- earliest previous sample
        last_ts_unix_s   DOUBLE             -- latest sample
    )
    """,
    """
    INSERT INTO counter_rollup_5m
    SELECT floor(ts_unix_s / 300.0) * 300.0, run_id, metric, model, instance, engine,
           sum(increase), count(*) FILTER (WHERE is_reset), bool_or(legacy), count(*),
           min(prev_ts_unix_s), max(ts_unix_s)
    FROM metric_samples WHERE has_prev GROUP BY ALL
    """,
)

_SCOPE_ROLLUP = (
    # 5-minute aggregates of gateway_decisions FULL OUTER JOIN requests (the rows of the
    # Scopes, Rejections and Invariants pages), by run, model, scope, namespace digest,
    # decision and first mismatch; maintained by the ingest transactions that write
    # decisions (store/queries/decisions.py) and requests (store/queries/requests.py), in
    # either order of arrival. SQL and columns: store/scope_sql.py.
    scope_sql.ROLLUP_DDL,
    scope_sql.ROLLUP_FILL_SQL,
)

_SERIES_HEAD_LABELS = (
    # The model_name and engine labels of each series' newest sample, so that cache_config
    # reads the heads instead of every sample (maintained by insert_metric_samples).
    "ALTER TABLE metric_series_head ADD COLUMN model VARCHAR",
    "ALTER TABLE metric_series_head ADD COLUMN engine VARCHAR",
    """
    UPDATE metric_series_head AS h SET model = m.model, engine = m.engine
    FROM metric_samples m
    WHERE m.run_id = h.run_id AND m.metric = h.metric AND m.labels = h.labels
      AND m.instance = h.instance AND m.ts_unix_s = h.ts_unix_s
    """,
)

#: Latency histogram bins: bin k holds values in [LATENCY_BIN_RATIO ** k, LATENCY_BIN_RATIO **
#: (k + 1)) ms (values <= 0 in bin NULL); 1.02 bounds a quantile's relative error by
#: sqrt(1.02) - 1 < 1% (docs/metrics.md "Latency quantiles").
LATENCY_BIN_RATIO = 1.02
LATENCY_BIN_SQL = ("CAST(floor(ln(CASE WHEN {v} > 0 THEN {v} END) / ln(1.02)) AS INTEGER)")
#: Migration 77's rows (frozen: by outcome, ``hit`` = cached_tokens > 0); migration 78
#: replaces the table by :data:`LATENCY_ROLLUP_SELECT_SQL`'s (by cached-share band).
_LATENCY_ROLLUP_77_SELECT_SQL = " UNION ALL ".join(
    f"SELECT floor(ts_unix_s / 86400.0) * 86400.0 AS bucket_start_s, run_id, model, instance, "
    f"'{col}' AS measure, cached_tokens > 0 AS hit, "
    f"{LATENCY_BIN_SQL.format(v=col)} AS bin, count(*) AS requests, sum({col}) AS sum_ms, "
    f"min({col}) AS min_ms, max({col}) AS max_ms "
    f"FROM requests WHERE cached_tokens IS NOT NULL AND {col} IS NOT NULL AND ({{where}}) "
    f"GROUP BY ALL" for col in ("ttft_ms", "latency_ms"))
_LATENCY_ROLLUP_77_COLUMNS = ("bucket_start_s, run_id, model, instance, measure, hit, bin, "
                              "requests, sum_ms, min_ms, max_ms")

#: The cached-share band of a request (``cached_tokens / prompt_tokens``, compared without a
#: division): ``cold`` < 10%, ``partial``, ``warm`` >= 80%; NULL without prompt tokens. The
#: same rule as ``prefixscope.store.queries.serving.TTFT_BANDS`` / ``ttft_band_sql`` (the
#: TTFT-by-band panels; tests/test_latency_bands.py checks they agree). Changing it needs a
#: migration that rebuilds ``latency_rollup_1d``.
LATENCY_BAND_SQL = ("CASE WHEN prompt_tokens > 0 THEN (CASE WHEN cached_tokens >= 0.8 * "
                    "prompt_tokens THEN 'warm' WHEN cached_tokens >= 0.1 * prompt_tokens THEN "
                    "'partial' ELSE 'cold' END) END")
#: The band names of :data:`LATENCY_BAND_SQL`, in display order.
LATENCY_BANDS = ("cold", "partial", "warm")
#: ``latency_rollup_1d`` rows of the requests matched by ``{where}`` (on ``requests``).
LATENCY_ROLLUP_SELECT_SQL = " UNION ALL ".join(
    f"SELECT floor(ts_unix_s / 86400.0) * 86400.0 AS bucket_start_s, run_id, model, instance, "
    f"'{col}' AS measure, {LATENCY_BAND_SQL} AS band, "
    f"{LATENCY_BIN_SQL.format(v=col)} AS bin, count(*) AS requests, sum({col}) AS sum_ms, "
    f"min({col}) AS min_ms, max({col}) AS max_ms "
    f"FROM requests WHERE cached_tokens IS NOT NULL AND {col} IS NOT NULL AND ({{where}}) "
    f"GROUP BY ALL" for col in ("ttft_ms", "latency_ms"))
LATENCY_ROLLUP_COLUMNS = ("bucket_start_s, run_id, model, instance, measure, band, bin, "
                          "requests, sum_ms, min_ms, max_ms")

_LATENCY_ROLLUP = (
    # Per UTC day, run, model, instance, measure (ttft_ms or latency_ms), outcome (hit =
    # cached_tokens > 0) and log-spaced bin: the count, sum, min and max of the reporting
    # requests' values. The Requests page's latency quantiles of a month read it instead of
    # every request (store/queries/requests.py request_latency_quantiles); maintained by
    # insert_request_rows. Bucket NULL = requests without a time.
    """
    CREATE TABLE latency_rollup_1d (
        bucket_start_s  DOUBLE,            -- floor(ts_unix_s / 86400) * 86400 (UTC day)
        run_id          VARCHAR NOT NULL,
        model           VARCHAR,
        instance        VARCHAR,
        measure         VARCHAR NOT NULL,  -- ttft_ms or latency_ms
        hit             BOOLEAN NOT NULL,  -- cached_tokens > 0 (else cached_tokens = 0)
        bin             INTEGER,           -- floor(ln(ms) / ln(1.02)); NULL for ms <= 0
        requests        BIGINT NOT NULL,
        sum_ms          DOUBLE NOT NULL,
        min_ms          DOUBLE NOT NULL,
        max_ms          DOUBLE NOT NULL
    )
    """,
    f"INSERT INTO latency_rollup_1d ({_LATENCY_ROLLUP_77_COLUMNS}) "
    + _LATENCY_ROLLUP_77_SELECT_SQL.format(where="TRUE"),
)

_LATENCY_ROLLUP_BANDS = (
    # Migration 77's table rebuilt with the cached-share band (LATENCY_BAND_SQL: cold /
    # partial / warm, NULL without prompt tokens) in place of hit: the Requests page's latency
    # panel uses the bands of the TTFT panels. A hit row cannot be split into bands, so the
    # table is refilled from the stored requests; days already archived (docs/retention.md)
    # are then read raw (latency_rollup_current is False) until rebuild_latency_rollup.
    "DROP TABLE latency_rollup_1d",
    """
    CREATE TABLE latency_rollup_1d (
        bucket_start_s  DOUBLE,            -- floor(ts_unix_s / 86400) * 86400 (UTC day)
        run_id          VARCHAR NOT NULL,
        model           VARCHAR,
        instance        VARCHAR,
        measure         VARCHAR NOT NULL,  -- ttft_ms or latency_ms
        band            VARCHAR,           -- cold, partial, warm by cached share; NULL: no prompt tokens
        bin             INTEGER,           -- floor(ln(ms) / ln(1.02)); NULL for ms <= 0
        requests        BIGINT NOT NULL,
        sum_ms          DOUBLE NOT NULL,
        min_ms          DOUBLE NOT NULL,
        max_ms          DOUBLE NOT NULL
    )
    """,
    f"INSERT INTO latency_rollup_1d ({LATENCY_ROLLUP_COLUMNS}) "
    + LATENCY_ROLLUP_SELECT_SQL.format(where="TRUE"),
)

_ARCHIVE = (
    # One row per (table, UTC day, generation) that `prefixscope archive` wrote as Parquet and
    # deleted from the table, in the same transaction as the delete (store/queries/archive.py,
    # docs/retention.md): the queries read exactly these files for the days they cover. A day
    # archived again (rows that arrived late) gets the next generation; a crashed run leaves
    # no row here and its files are rewritten under the same names by the next run.
    """
    CREATE TABLE archive_parts (
        tbl              VARCHAR NOT NULL,   -- requests, metric_samples
        day              DATE NOT NULL,      -- UTC day of ts_unix_s
        gen              INTEGER NOT NULL,   -- 0, then 1, 2, ... for rows archived later
        location         VARCHAR NOT NULL,   -- archive root (folder or s3://...), no credentials
        rows             BIGINT NOT NULL,    -- rows written, verified by reading the files back
        rollup_rows      BIGINT NOT NULL,    -- of which counted by the table's rollup
        files            VARCHAR[] NOT NULL, -- the Parquet files written
        archived_unix_s  DOUBLE NOT NULL,
        rollup_dropped   BOOLEAN NOT NULL DEFAULT FALSE,  -- the day's rollup rows were deleted
        PRIMARY KEY (tbl, day, gen)
    )
    """,
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "core tables", _CORE),
    Migration(6, "alerts: daily report sends", (
        """
        CREATE TABLE IF NOT EXISTS alert_sends (
            send_id          VARCHAR PRIMARY KEY,  -- uuid hex
            day              VARCHAR NOT NULL,     -- report day, YYYY-MM-DD in tz
            tz               VARCHAR NOT NULL,     -- IANA zone of the day boundary
            recipients       VARCHAR NOT NULL,     -- sorted, comma-separated addresses (the idempotency key with day, tz)
            subject          VARCHAR NOT NULL,
            report_status    VARCHAR NOT NULL,     -- worst line status in this email: OK, ALERT, NO DATA, STALE
            status           VARCHAR NOT NULL,     -- sending (claimed), sent, failed
            message_id       VARCHAR,              -- the Message-ID header
            attempts         INTEGER NOT NULL DEFAULT 0,  -- SMTP delivery attempts made
            error            VARCHAR,              -- last SMTP error (never a password)
            resend           BOOLEAN NOT NULL DEFAULT FALSE,  -- sent with --resend
            smtp_host        VARCHAR,              -- host:port used (no credentials)
            lines_json       VARCHAR,              -- the report lines of this email (model, scope, status, figures)
            created_unix_s   DOUBLE NOT NULL,      -- claim time
            finished_unix_s  DOUBLE                -- when sent or given up
        )
        """,
    )),
    Migration(3, "requests and prices", _REQUESTS_AND_PRICES),
    Migration(2, "metrics and KV events", (
        # One row per block hash of a KV cache event (AllBlocksCleared: one row, no hash).
        # Replayed batches repeat (instance, dp_rank, seq, batch_ts_unix_s): the key drops them;
        # the batch time in the key keeps a restarted publisher's seq 0 apart from the old one.
        # Token ids and extra keys (which may hold a cache_salt) are never stored.
        """
        CREATE TABLE IF NOT EXISTS kv_events (
            instance           VARCHAR NOT NULL,  -- publisher name (--instance, endpoint host:port, file stem)
            dp_rank            INTEGER NOT NULL,  -- data-parallel rank of the batch (0 when omitted)
            seq                BIGINT NOT NULL,   -- ZMQ sequence frame (per publisher, from 0)
            batch_ts_unix_s    DOUBLE NOT NULL,   -- EventBatch.ts (engine clock)
            event_index        INTEGER NOT NULL,  -- position of the event in its batch, from 0
            hash_index         INTEGER NOT NULL,  -- position of the hash in block_hashes, from 0
            event_type         VARCHAR NOT NULL,  -- BlockStored, BlockRemoved, AllBlocksCleared
            block_hash         UBIGINT,           -- 64-bit block hash; NULL for AllBlocksCleared
            parent_block_hash  UBIGINT,           -- chain parent (BlockStored); NULL at a chain root
            num_tokens         INTEGER,           -- tokens of this block (BlockStored)
            block_size         INTEGER,           -- BlockStored.block_size
            medium             VARCHAR,           -- GPU, CPU, ... (NULL when not sent)
            lora_name          VARCHAR,           -- adapter name (BlockStored), NULL without LoRA
            group_idx          INTEGER,           -- KV-cache group (NULL when not sent)
            has_extra_keys     BOOLEAN,           -- BlockStored carried a non-null extra key for this block
            topic              VARCHAR,           -- ZMQ topic frame
            received_from      VARCHAR,           -- pub (live), replay, or file
            source_id          VARCHAR NOT NULL,
            PRIMARY KEY (instance, dp_rank, seq, batch_ts_unix_s, event_index, hash_index)
        )
        """,
    )),
    Migration(5, "scopes: gateway decisions and version events", (
        # One row per request decided by a cache gateway (docs/scopes.md#decision-log). Never a
        # raw tenant id or prompt text: namespaces as 16-hex digests, content as a keyed digest.
        """
        CREATE TABLE IF NOT EXISTS gateway_decisions (
            run_id                  VARCHAR NOT NULL DEFAULT '',  -- '' production; replay run id
            request_id              VARCHAR NOT NULL,  -- joins requests.request_id
            source_id               VARCHAR NOT NULL,
            line                    BIGINT,
            ts_unix_s               DOUBLE NOT NULL,   -- decision time
            instance                VARCHAR,
            model                   VARCHAR,
            scope                   VARCHAR NOT NULL,  -- PUBLIC, TENANT, PRINCIPAL
            namespace_digest        VARCHAR NOT NULL,  -- 16 hex chars of the HMAC namespace
            decision                VARCHAR NOT NULL,  -- accept, reject, miss (no candidate)
            first_mismatch          VARCHAR,           -- first mismatching field (reject)
            reasons                 VARCHAR NOT NULL DEFAULT '',  -- comma list of mismatching fields
            candidate_cached_tokens BIGINT NOT NULL,   -- tokens the candidate object could supply
            accepted_cached_tokens  BIGINT NOT NULL,   -- tokens accepted (0 unless accept)
            salt_applied            BOOLEAN,           -- forwarded with the derived cache_salt
            content_digest          VARCHAR,           -- expected identity, short digests
            model_digest            VARCHAR,
            tokenizer_digest        VARCHAR,
            runtime_digest          VARCHAR,
            adapter_digest          VARCHAR,
            prompt_bundle_digest    VARCHAR,
            toolset_digest          VARCHAR,
            policy_revision         BIGINT,
            authorization_epoch     BIGINT,
            cache_epoch             BIGINT,
            candidate_request_id    VARCHAR,           -- request that stored the candidate
            candidate_scope         VARCHAR,           -- candidate identity (NULL for a miss)
            candidate_namespace_digest   VARCHAR,
            candidate_content_digest     VARCHAR,
            candidate_model_digest       VARCHAR,
            candidate_tokenizer_digest   VARCHAR,
            candidate_runtime_digest     VARCHAR,
            candidate_adapter_digest     VARCHAR,
            candidate_prompt_bundle_digest VARCHAR,
            candidate_toolset_digest     VARCHAR,
            candidate_policy_revision    BIGINT,
            candidate_authorization_epoch BIGINT,
            candidate_cache_epoch        BIGINT,
            PRIMARY KEY (run_id, request_id)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS gateway_events (
            event_id          VARCHAR PRIMARY KEY,  -- sha256 of (run_id, ts, event, namespace, value)
            run_id            VARCHAR NOT NULL DEFAULT '',
            source_id         VARCHAR NOT NULL,
            line              BIGINT,
            ts_unix_s         DOUBLE NOT NULL,
            event             VARCHAR NOT NULL,     -- model_upgrade, tokenizer_upgrade, ...
            namespace_digest  VARCHAR,              -- affected namespace (NULL: all)
            new_value         VARCHAR               -- new short digest or epoch/revision number
        )
        """,
    )),
    Migration(7, "live replay: run-scoped counter deltas", (
        # One row per (live replay run, instance, counter): the /metrics counters scraped
        # before and after the run (both expositions are also ingested into metric_samples).
        # Values are summed over every series of the counter (model_name, engine, ...).
        """
        CREATE TABLE IF NOT EXISTS live_run_counters (
            run_id            VARCHAR NOT NULL,  -- runs.run_id (kind replay-live)
            instance          VARCHAR NOT NULL,  -- server host:port (the scrape instance)
            metric            VARCHAR NOT NULL,  -- counter as exposed, e.g. vllm:prefix_cache_hits_total
            before_value      DOUBLE,            -- cumulative since server start, at before_ts
            after_value       DOUBLE,
            delta             DOUBLE NOT NULL,   -- after - before; after alone if the counter dropped (restart)
            before_ts_unix_s  DOUBLE NOT NULL,
            after_ts_unix_s   DOUBLE NOT NULL,
            settled           BOOLEAN NOT NULL,  -- queries delta reached the run's prompt tokens in time
            PRIMARY KEY (run_id, instance, metric)
        )
        """,
    )),
    Migration(8, "metric samples carry their run", (
        # '' = production traffic; a replay run's (sim, live, gateway) expositions are tagged
        # with its runs.run_id at ingest, so production analytics can leave replays out.
        "ALTER TABLE metric_samples ADD COLUMN run_id VARCHAR DEFAULT ''",
        "UPDATE metric_samples SET run_id = '' WHERE run_id IS NULL",
    )),
    Migration(9, "requests keyed by a 128-bit digest of (run_id, request_id)", _REQUESTS_KEY),
    Migration(10, "metric samples keyed by run", _METRIC_SAMPLES_BY_RUN),
    Migration(50, "gateway decisions carry an error code and the client-salt flag", (
        # Why a live gateway request ended without a usable answer (prefixscope.core.
        # decision_log.ERROR_CODES: bad_request, unknown_model, too_large, upstream_timeout,
        # upstream_error, upstream_dropped, client_disconnected, upstream_status); NULL = completed.
        "ALTER TABLE gateway_decisions ADD COLUMN IF NOT EXISTS error VARCHAR",
        # The client sent its own cache_salt and the gateway replaced it (NULL: not a live
        # gateway, or not recorded).
        "ALTER TABLE gateway_decisions ADD COLUMN IF NOT EXISTS client_salt_replaced BOOLEAN",
    )),
    Migration(51, "gateway decisions: how candidate_cached_tokens was counted", (
        # 'exact' (from token ids: the gateway's tokenize = "upstream"), 'upper_bound' (the
        # candidate writer's prompt tokens) or NULL (not a live gateway record, or older).
        "ALTER TABLE gateway_decisions ADD COLUMN IF NOT EXISTS candidate_tokens_basis VARCHAR",
    )),
    Migration(30, "diagnose: breaker summaries of a run", (
        # One row per diagnosis (prefixscope diagnose --ingest) and one per breaker it ranked.
        # Structure, kinds, counts, lost tokens and value digests only: never prompt text
        # (docs/diagnose.md#stored).
        """
        CREATE TABLE IF NOT EXISTS diagnoses (
            diagnosis_id          VARCHAR PRIMARY KEY,  -- the run id it was made with
            run_id                VARCHAR NOT NULL,     -- the as-recorded replay run (runs.run_id)
            model                 VARCHAR,              -- the run's model
            created_unix_s        DOUBLE NOT NULL,
            block_size            INTEGER NOT NULL,
            capacity_blocks       BIGINT,               -- NULL = unbounded
            requests              BIGINT NOT NULL,
            prompt_tokens         BIGINT NOT NULL,
            cached_tokens         BIGINT NOT NULL,
            hit_rate              DOUBLE,
            what_if_hit_rate      DOUBLE,               -- the suggested layout, exact replay
            what_if_cached_tokens BIGINT,
            what_if_cost_delta    DOUBLE,               -- currency units; NULL without a price
            currency              VARCHAR,
            cold_requests         BIGINT,
            levels                INTEGER,
            source_id             VARCHAR
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS breakers (
            diagnosis_id          VARCHAR NOT NULL,
            rank                  INTEGER NOT NULL,     -- 1 = most lost tokens of level 1
            level                 INTEGER NOT NULL,
            kind                  VARCHAR NOT NULL,     -- timestamp, id, tools_reordered, ... (docs/diagnose.md#kinds)
            segment               VARCHAR,              -- message, tools, template, tokens, blocks
            message_index         INTEGER,
            role                  VARCHAR,
            line                  INTEGER,              -- 1-based line inside the message content
            schema_key_digest     VARCHAR,              -- 16-hex digest of the tool schema key (no names)
            requests              BIGINT NOT NULL,
            distinct_values       BIGINT NOT NULL,
            lost_tokens           BIGINT NOT NULL,
            lost_tokens_measured  BOOLEAN NOT NULL,
            share                 DOUBLE,               -- lost / missed tokens of the run
            fixable               BOOLEAN NOT NULL,
            transform_types       VARCHAR,              -- comma-separated layout transform types of the fix
            what_if_hit_rate      DOUBLE,               -- the run with this span matched
            what_if_cached_tokens BIGINT,
            value_digests         VARCHAR[],            -- up to 16 digests of the diverging values
            PRIMARY KEY (diagnosis_id, rank)
        )
        """,
    )),
    Migration(82, "miss ledger totals of a run", (
        # One row per (run, router, model, instance, trace day, scope): the prompt tokens of
        # the run's counted requests by ledger class (replay/ledger.py; docs/metrics.md "Miss
        # ledger"), written by `diagnose --ingest` and `replay fleet --ingest` as ledger.json
        # and stored by ingest/ledger.py. Counts only: no prompt text, no salt, no tenant id.
        """
        CREATE TABLE IF NOT EXISTS ledger_totals (
            run_id                  VARCHAR NOT NULL,  -- runs.run_id
            router                  VARCHAR NOT NULL,  -- routing policy; 'single' = one instance (diagnose)
            policy_rank             INTEGER NOT NULL,  -- 0 = the first policy of the run (as deployed)
            instances               INTEGER NOT NULL,  -- fleet size of the replay
            model                   VARCHAR NOT NULL,  -- '' when the trace names none
            instance                VARCHAR NOT NULL,  -- replica of the fleet (i0, i1, ... or recorded)
            day                     INTEGER NOT NULL,  -- trace day: floor(arrival_s / 86400)
            scope                   VARCHAR NOT NULL,  -- none, salted, PUBLIC, TENANT, PRINCIPAL, other
            requests                BIGINT NOT NULL,   -- counted requests
            prompt_tokens           BIGINT NOT NULL,   -- = the seven classes below summed
            hit_tokens              BIGINT NOT NULL,
            granularity_tokens      BIGINT NOT NULL,
            routing_tokens          BIGINT NOT NULL,
            capacity_tokens         BIGINT NOT NULL,
            isolation_tokens        BIGINT NOT NULL,
            prompt_change_tokens    BIGINT NOT NULL,
            cold_tokens             BIGINT NOT NULL,
            capacity_belady_tokens  BIGINT NOT NULL,   -- of capacity: what Belady's MIN would keep
            created_unix_s          DOUBLE NOT NULL,
            source_id               VARCHAR,           -- the ledger.json it came from
            PRIMARY KEY (run_id, router, model, instance, day, scope)
        )
        """,
    )),
    Migration(40, "alert sends record who claimed them", (
        # host:pid of the run that claimed a 'sending' row: a later run on the same host sees
        # that the process died during SMTP and retries instead of reading it as sent
        "ALTER TABLE alert_sends ADD COLUMN IF NOT EXISTS claimed_by VARCHAR",
    )),
    Migration(60, "requests carry their provider", (
        # gen_ai.provider.name of an OTLP span, LiteLLM custom_llm_provider, ...: NULL when the
        # source names none (usage logs). Used to price a request (genai-prices provider ids).
        "ALTER TABLE requests ADD COLUMN IF NOT EXISTS provider VARCHAR",
    )),
    Migration(61, "hosted-model price tiers and periods (genai-prices)", (
        # Rebuilt whole by `ingest prices --genai-prices` (ingest/genai_prices.py) for the
        # (model, provider) pairs of `requests` the TOML `prices` table does not price. A
        # request takes the row whose period holds its time and whose prompt interval holds its
        # inclusive prompt_tokens: tier rates apply to every token above the tier start.
        """
        CREATE TABLE IF NOT EXISTS price_tiers (
            model                    VARCHAR NOT NULL,  -- as in requests.model
            provider_key             VARCHAR NOT NULL,  -- requests.provider it was matched with ('' = NULL)
            valid_from_unix_s        DOUBLE NOT NULL,   -- price period start (inclusive; -1e300 = always)
            valid_to_unix_s          DOUBLE NOT NULL,   -- price period end (exclusive; 1e300 = open)
            day_from_s               DOUBLE NOT NULL,   -- daily interval, UTC seconds of the day (0)
            day_to_s                 DOUBLE NOT NULL,   -- (86400 = whole day)
            min_prompt_tokens        BIGINT NOT NULL,   -- tier applies above this (exclusive; -1 = base)
            max_prompt_tokens        BIGINT NOT NULL,   -- up to and including this
            currency                 VARCHAR NOT NULL,  -- USD
            input_per_mtok           DECIMAL(18, 9) NOT NULL,
            cached_input_per_mtok    DECIMAL(18, 9) NOT NULL,
            cache_write_per_mtok     DECIMAL(18, 9) NOT NULL,
            cache_write_1h_per_mtok  DECIMAL(18, 9) NOT NULL,
            output_per_mtok          DECIMAL(18, 9) NOT NULL,
            price_source             VARCHAR NOT NULL,  -- label with the package version
            source_version           VARCHAR NOT NULL,  -- e.g. 'genai-prices 0.2.3'
            genai_provider_id        VARCHAR NOT NULL,
            genai_model_id           VARCHAR NOT NULL,
            loaded_unix_s            DOUBLE NOT NULL,
            PRIMARY KEY (model, provider_key, valid_from_unix_s, day_from_s, min_prompt_tokens)
        )
        """,
    )),
    Migration(70, "counter increases stored at ingest", _COUNTER_INCREASES),
    Migration(71, "per-minute request rollup", _REQUEST_ROLLUP),
    Migration(72, "5-minute counter rollup", _COUNTER_ROLLUP),
    Migration(73, "archived days of requests and metric samples", _ARCHIVE),
    Migration(75, "5-minute scope and decision rollup", _SCOPE_ROLLUP),
    Migration(76, "series heads carry model and engine", _SERIES_HEAD_LABELS),
    Migration(77, "daily latency histogram rollup", _LATENCY_ROLLUP),
    Migration(78, "latency histogram rollup by cached-share band", _LATENCY_ROLLUP_BANDS),
    Migration(79, "requests without the primary-key index (the writers skip stored keys)",
              _REQUESTS_UNINDEXED),
    Migration(80, "scope rollup: refused requests apart", (
        # scope_rollup_5m gains the grouping column `refused` (store/scope_sql.py: the error
        # of a decision without a usage row) and is rebuilt, so that the pages leave refused
        # requests out of hit rates and miss counts.
        "ALTER TABLE scope_rollup_5m ADD COLUMN IF NOT EXISTS refused VARCHAR",
        "DELETE FROM scope_rollup_5m",
        scope_sql.ROLLUP_FILL_SQL,
    )),
    Migration(81, "gateway decisions: the cache bypass flag", (
        # TRUE: the live gateway's /admin/bypass was on, the request went with a salt unique to
        # it (accepted_cached_tokens 0); NULL: off, not logged, or older.
        "ALTER TABLE gateway_decisions ADD COLUMN IF NOT EXISTS bypass BOOLEAN",
    )),
)
