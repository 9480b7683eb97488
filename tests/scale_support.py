"""A generated deployment written with DuckDB SQL straight into the real schema (issue 17).

:func:`build_deployment` migrates a fresh database file with :func:`prefixscope.store.db.writer`
and fills ``requests`` and ``metric_samples`` with ``INSERT ... SELECT`` over ``range()``: 10 M
requests take a minute or two instead of hours through the JSON ingester. The shape:

- ``days`` days ending at :data:`END_S` (2026-11-01 00:00 UTC, older than 24 h, so the
  dashboard's default range is "all"), ``instances`` vLLM instances, ``models`` models
  (instance ``i`` serves model ``i % models``);
- requests spread evenly over the range, ids ``chatcmpl-<16 hex>``; prompt 200-8,200 tokens,
  80% of them with a cache hit (a multiple of 16 below the prompt), 5% without
  ``cached_tokens`` reported; TTFT and latency in milliseconds (hits faster);
- per instance and scrape: ``vllm:prefix_cache_queries_total``, ``..._hits_total``,
  ``vllm:external_prefix_cache_hits_total`` (counters that restart, i.e. drop to a small value,
  every ``restart_every`` scrapes, at a different phase per instance),
  ``vllm:num_preemptions_total`` and the gauge ``vllm:kv_cache_usage_perc``: five series per
  instance, so 15 s scrapes over 30 days on 10 instances are 8.64 M samples;
- a gateway decision for every 5th request (``gateway_decisions``, production run), so the
  Scopes, Rejections and Invariants pages have a month of decisions to show.

Deterministic: every value is a hash of the row number.
"""

from __future__ import annotations

import os
from pathlib import Path

END_S = 1_793_491_200.0  # 2026-11-01T00:00:00Z
MODEL_NAMES = ("llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct",
               "gemma-2-9b-it")


def build_deployment(path: str | os.PathLike[str], *, requests: int, scrape_s: float,
                     days: float = 30.0, instances: int = 10, models: int = 4,
                     restart_every: int = 40_000, decisions: bool = True,
                     decision_every: int = 5) -> dict[str, int]:
    """Create ``path`` (must not exist) with the generated deployment.

    Args:
        requests: rows of ``requests``.
        scrape_s: seconds between counter scrapes (15 s, or 3600 for hourly samples).
        restart_every: scrapes between two restarts of an instance's counters.
        decisions: also write ``gateway_decisions`` for every ``decision_every``-th request
            (a gateway in front of production: 3 scopes, 6 namespaces, 70% accept, 10%
            reject when the request had no cache hit, the rest no candidate).

    Returns:
        ``{"requests": n, "metric_samples": n, "gateway_decisions": n}`` rows written.
    """
    from prefixscope.store import db as store_db
    from prefixscope.store.schema import REQUEST_KEY_SQL

    path = Path(path)
    if path.exists():
        raise FileExistsError(path)
    span = days * 86400.0
    start = END_S - span
    names = list(MODEL_NAMES[:models])
    with store_db.writer(path) as con:
        con.execute("SET preserve_insertion_order = false")
        con.execute("SET enable_progress_bar = false")
        con.execute(f"""
            INSERT INTO requests (run_id, request_id, source_id, line, ts_unix_s, model, instance,
                endpoint, usage_shape, prompt_tokens, cached_tokens, completion_tokens, ttft_ms,
                latency_ms, request_key)
            WITH g AS (
                SELECT range AS i, hash(range) AS h, hash(range + 1000000007) AS h2
                FROM range(?)
            ), r AS (
                SELECT i, h, h2, CAST(i % ? AS INTEGER) AS inst,
                       200 + CAST(h % 8000 AS BIGINT) AS prompt
                FROM g
            ), s AS (
                SELECT '' AS run_id, 'chatcmpl-' || lower(lpad(to_hex(h2), 16, '0')) AS request_id,
                       'generated' AS source_id, i AS line,
                       ? + (i + 0.5) * ? AS ts_unix_s,
                       (?::VARCHAR[])[1 + inst % ?] AS model,
                       'vllm-' || lpad(CAST(inst AS VARCHAR), 2, '0') || ':8000' AS instance,
                       'chat' AS endpoint, 'openai' AS usage_shape, prompt AS prompt_tokens,
                       CASE WHEN h2 % 20 = 0 THEN NULL
                            WHEN h2 % 5 = 0 THEN 0
                            ELSE CAST(((h >> 20) % prompt) / 16 AS BIGINT) * 16 END
                           AS cached_tokens,
                       5 + CAST((h >> 40) % 300 AS BIGINT) AS completion_tokens,
                       CASE WHEN h2 % 5 = 0 THEN 150.0 ELSE 40.0 END
                           + CAST((h >> 8) % 1000 AS DOUBLE) / 10.0 AS ttft_ms
                FROM r
            )
            SELECT run_id, request_id, source_id, line, ts_unix_s, model, instance, endpoint,
                   usage_shape, prompt_tokens, cached_tokens, completion_tokens, ttft_ms,
                   ttft_ms + completion_tokens * 12.0 AS latency_ms, {REQUEST_KEY_SQL}
            FROM s
        """, [int(requests), int(instances), start, span / max(int(requests), 1), names,
              len(names)])
        scrapes = int(span // scrape_s)
        con.execute("""
            CREATE TEMP TABLE _scrapes AS
            SELECT CAST(k AS BIGINT) AS k, CAST(inst AS INTEGER) AS inst
            FROM range(?) t(k), range(?) u(inst)
        """, [scrapes, int(instances)])
        counters = [("vllm:prefix_cache_queries_total", 0), ("vllm:prefix_cache_hits_total", 1),
                    ("vllm:external_prefix_cache_hits_total", 2),
                    ("vllm:num_preemptions_total", 3)]
        for metric, salt in counters:
            con.execute("""
                INSERT INTO metric_samples (metric, labels, instance, model, engine, ts_unix_s,
                    value, raw_metric, legacy, created_zero, source_id, run_id)
                WITH s AS (
                    SELECT k, inst, (k + inst * 7919) // ? AS epoch,
                           hash(k * 64 + inst * 8 + ?) AS h
                    FROM _scrapes
                ), inc AS (
                    SELECT k, inst, epoch,
                           CASE ? WHEN 0 THEN 2000 + h % 4000
                                  WHEN 1 THEN (2000 + h % 4000) * (50 + (h >> 32) % 45) // 100
                                  WHEN 2 THEN h % 50
                                  ELSE CAST(h % 97 = 0 AS INTEGER) END AS d
                    FROM s
                )
                SELECT ?, '{"engine":"0","model_name":"' || (?::VARCHAR[])[1 + inst % ?] || '"}',
                       'vllm-' || lpad(CAST(inst AS VARCHAR), 2, '0') || ':8000',
                       (?::VARCHAR[])[1 + inst % ?], '0', ? + k * ?,
                       CAST(sum(d) OVER (PARTITION BY inst, epoch ORDER BY k) AS DOUBLE),
                       ?, false, false, 'generated', ''
                FROM inc
            """, [int(restart_every), salt, salt, metric, names, len(names), names, len(names),
                  start + scrape_s, float(scrape_s), metric])
        con.execute("""
            INSERT INTO metric_samples (metric, labels, instance, model, engine, ts_unix_s,
                value, raw_metric, legacy, created_zero, source_id, run_id)
            SELECT 'vllm:kv_cache_usage_perc',
                   '{"engine":"0","model_name":"' || (?::VARCHAR[])[1 + inst % ?] || '"}',
                   'vllm-' || lpad(CAST(inst AS VARCHAR), 2, '0') || ':8000',
                   (?::VARCHAR[])[1 + inst % ?], '0', ? + k * ?,
                   CAST(hash(k * 64 + inst) % 1000 AS DOUBLE) / 1000.0,
                   'vllm:kv_cache_usage_perc', false, false, 'generated', ''
            FROM _scrapes
        """, [names, len(names), names, len(names), start + scrape_s, float(scrape_s)])
        con.execute("DROP TABLE _scrapes")
        if decisions:
            # a cache gateway in front of the production traffic: a decision for every
            # ``decision_every``-th request, at its time, in 3 scopes and 6 namespaces;
            # candidates carry the request's identity and a rejected request shows no cached
            # tokens (no invariant is violated)
            con.execute("""
                INSERT INTO gateway_decisions (run_id, request_id, source_id, line, ts_unix_s,
                    instance, model, scope, namespace_digest, decision, first_mismatch, reasons,
                    candidate_cached_tokens, accepted_cached_tokens, salt_applied, model_digest,
                    candidate_request_id, candidate_scope, candidate_namespace_digest,
                    candidate_model_digest)
                WITH d AS (
                    SELECT *, hash(line + 77) AS h,
                           (['PUBLIC', 'TENANT', 'PRINCIPAL'])[1 + CAST(line % 3 AS BIGINT)] AS sc,
                           lpad(to_hex(hash(line % 6)), 16, '0') AS ns
                    FROM requests WHERE line % ? = 0
                ), e AS (
                    SELECT *, CASE WHEN h % 10 < 7 THEN 'accept'
                                   WHEN h % 10 < 8 AND coalesce(cached_tokens, 0) = 0
                                       THEN 'reject'
                                   ELSE 'miss' END AS dec FROM d
                )
                SELECT run_id, request_id, 'generated-gateway', line, ts_unix_s, instance, model,
                       sc, ns, dec,
                       CASE WHEN dec = 'reject' THEN (['tokenizer_digest', 'cache_epoch',
                            'namespace'])[1 + CAST((h >> 8) % 3 AS BIGINT)] END,
                       CASE WHEN dec = 'reject' THEN (['tokenizer_digest', 'cache_epoch',
                            'namespace'])[1 + CAST((h >> 8) % 3 AS BIGINT)] ELSE '' END,
                       CASE WHEN dec = 'miss' THEN 0 ELSE coalesce(cached_tokens, 0) END,
                       CASE WHEN dec = 'accept' THEN coalesce(cached_tokens, 0) ELSE 0 END,
                       TRUE, 'md-' || model,
                       CASE WHEN dec <> 'miss' THEN 'prev-' || request_id END,
                       CASE WHEN dec <> 'miss' THEN sc END, CASE WHEN dec <> 'miss' THEN ns END,
                       CASE WHEN dec <> 'miss' THEN 'md-' || model END
                FROM e
            """, [int(decision_every)])
        from prefixscope.store.queries.metrics import recompute_increases

        recompute_increases(con)  # rows written with SQL: their increases, as ingest stores them
        from prefixscope.store.queries.requests import rebuild_request_rollup

        rebuild_request_rollup(con)  # and the rollups the ingest transactions maintain
        from prefixscope.store.queries import scope_rollup
        from prefixscope.store.queries.requests import rebuild_latency_rollup

        rebuild_latency_rollup(con)
        scope_rollup.rebuild(con)
        n_req = con.execute("SELECT count(*) FROM requests").fetchone()[0]
        n_ms = con.execute("SELECT count(*) FROM metric_samples").fetchone()[0]
        n_d = con.execute("SELECT count(*) FROM gateway_decisions").fetchone()[0]
        store_db.checkpoint(con)
    return {"requests": int(n_req), "metric_samples": int(n_ms), "gateway_decisions": int(n_d)}
