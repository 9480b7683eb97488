"""SQL of the scope/decision figures, shared by the schema (migration 75) and the queries.

One row per request of ``gateway_decisions`` FULL OUTER JOIN ``requests`` on ``(run_id,
request_id)`` (:data:`JOINED_SQL`; definitions in ``store/queries/scopes.py`` and
``docs/scopes.md#formulas``), and :data:`ROLLUP_SELECT_SQL`, which aggregates such rows per
5 minutes of their time (``COALESCE(requests.ts_unix_s, gateway_decisions.ts_unix_s)``) and
per ``run_id, model, scope, namespace_digest, decision, first_mismatch``: the rows of
``scope_rollup_5m``. Not by instance: with it the rollup of a month of a 10-instance deployment
had ~3 times as many rows; a query filtered or grouped by instance reads the join. Every figure of the Scopes, Rejections and Invariants pages is a sum of
those measures, so a query over the rollup and a query over the join give the same numbers.

The lists of reasons are spliced as SQL literals (constants of
:mod:`prefixscope.core.identity`, plain identifiers), so that the migration, which has no bound
parameters, can use the same text.
"""

from __future__ import annotations

import re

from prefixscope.core.identity import GENERATION_FIELDS, SCOPE_FIELDS, VERSION_FIELDS

CROSS_SCOPE_REASONS = [*SCOPE_FIELDS, "salt"]
VERSION_REASONS = [*VERSION_FIELDS]
GENERATION_REASONS = [*GENERATION_FIELDS]
COLLISION_REASONS = ["content_digest"]
#: Short digest columns compared for wrong-version acceptance (expected vs candidate_*).
VERSION_COLUMNS = ("content_digest", "model_digest", "tokenizer_digest", "runtime_digest",
                   "adapter_digest", "prompt_bundle_digest", "toolset_digest", "policy_revision")
INVARIANTS = ("cross_scope_acceptance", "wrong_version_acceptance", "old_generation_use")

_WORD = re.compile(r"[a-z_]+")


def sql_list(values) -> str:
    """A SQL list literal of plain lower-case identifiers (our own constants only)."""
    vals = list(values)
    assert all(_WORD.fullmatch(v) for v in vals), vals
    return "[" + ", ".join(f"'{v}'" for v in vals) + "]::VARCHAR[]"


#: ``refused``: the decision's ``error`` (``prefixscope.core.decision_log.ERROR_CODES``) when
#: the request has no usage row: it never got an answer from the engine (the gateway answered
#: 400/404/413 itself, or the upstream failed, ``gateway/app.py``). Such rows are left out of
#: the hit rates and the request, accept, reject and miss counts and counted apart as
#: "Refused / errors" (``docs/metrics.md#refused-requests``). NULL otherwise.
#: The join's rows from ``{source}`` (a FROM clause with aliases ``d`` = gateway_decisions and
#: ``r`` = requests, possibly narrowed and with its own WHERE).
ROWS_SQL = """
    SELECT COALESCE(d.run_id, r.run_id) AS run_id,
           COALESCE(d.request_id, r.request_id) AS request_id,
           COALESCE(r.ts_unix_s, d.ts_unix_s) AS ts_unix_s,
           COALESCE(d.model, r.model) AS model,
           COALESCE(d.instance, r.instance) AS instance,
           COALESCE(d.scope, r.scope, 'UNSCOPED') AS scope,
           COALESCE(d.namespace_digest, r.tenant_digest) AS namespace_digest,
           d.decision, d.first_mismatch, d.reasons,
           CASE WHEN d.error IS NOT NULL AND r.request_id IS NULL THEN d.error END AS refused,
           d.candidate_cached_tokens, d.accepted_cached_tokens, d.candidate_request_id,
           r.prompt_tokens, r.cached_tokens,
           d.request_id IS NOT NULL AS has_decision, r.request_id IS NOT NULL AS has_usage,
           d.* EXCLUDE (run_id, request_id, ts_unix_s, model, instance, scope, namespace_digest,
                        decision, first_mismatch, reasons, candidate_cached_tokens,
                        accepted_cached_tokens, candidate_request_id, source_id, line)
    FROM {source}
"""
ON_KEY = "d.run_id = r.run_id AND d.request_id = r.request_id"
#: Every row of the join: each request of either table once.
JOINED_SQL = ROWS_SQL.format(source=f"gateway_decisions d FULL OUTER JOIN requests r ON {ON_KEY}")


def _differs(cols) -> str:
    return " OR ".join(f"(candidate_{c} IS NOT NULL AND {c} IS NOT NULL AND candidate_{c} <> {c})"
                       for c in cols)


_USED_AFTER_REJECT = "decision = 'reject' AND COALESCE(cached_tokens, 0) > 0"
#: Per invariant, the predicate on a joined row that counts it (see store/queries/scopes.py).
INVARIANT_PREDICATES: dict[str, str] = {
    "cross_scope_acceptance":
        f"(decision = 'accept' AND ({_differs(['scope', 'namespace_digest'])})) OR "
        f"({_USED_AFTER_REJECT} AND list_contains({sql_list(CROSS_SCOPE_REASONS)}, first_mismatch))",
    "wrong_version_acceptance":
        f"(decision = 'accept' AND ({_differs(VERSION_COLUMNS)})) OR "
        f"({_USED_AFTER_REJECT} AND list_contains("
        f"{sql_list(VERSION_REASONS + COLLISION_REASONS)}, first_mismatch))",
    "old_generation_use":
        f"(decision = 'accept' AND ({_differs(['authorization_epoch', 'cache_epoch'])})) OR "
        f"({_USED_AFTER_REJECT} AND list_contains({sql_list(GENERATION_REASONS)}, first_mismatch))",
}
UNVERIFIABLE_SQL = ("decision = 'accept' AND candidate_scope IS NULL "
                    "AND candidate_namespace_digest IS NULL")
#: A reject's class from its first mismatching field (NULL for accept/miss/no decision).
CLASS_SQL = f"""CASE
    WHEN decision <> 'reject' THEN NULL
    WHEN list_contains({sql_list(CROSS_SCOPE_REASONS)}, first_mismatch) THEN 'cross_scope'
    WHEN list_contains({sql_list(VERSION_REASONS)}, first_mismatch) THEN 'version'
    WHEN list_contains({sql_list(GENERATION_REASONS)}, first_mismatch) THEN 'generation'
    ELSE 'collision' END"""

#: Length of a ``scope_rollup_5m`` bucket, seconds (``[k * 300, (k + 1) * 300)`` of Unix
#: time): the pages' smallest window.
ROLLUP_S = 300.0
BUCKET_SQL = "floor(ts_unix_s / 300.0) * 300.0"
#: Grouping columns of a rollup row besides its bucket.
ROLLUP_DIMS = ("run_id", "model", "scope", "namespace_digest", "decision", "first_mismatch",
               "refused")
ROLLUP_COLUMNS = (
    "bucket_start_s", *ROLLUP_DIMS, "requests", "usage_rows", "reported_requests",
    "prompt_tokens", "reported_prompt_tokens", "cached_tokens", "accepted_cached_tokens",
    "candidate_cached_tokens", "miss_tokens", *INVARIANTS, "unverifiable_accepts")

#: Rollup rows of the joined rows ``{rows}`` (a SELECT of :data:`ROWS_SQL` shape) that match
#: ``{where}``; bucket NULL for rows without a time (usage rows without a time or decision).
ROLLUP_SELECT_SQL = (
    f"SELECT {BUCKET_SQL} AS bucket_start_s, {', '.join(ROLLUP_DIMS)}, "
    "count(*) AS requests, "
    "count(*) FILTER (WHERE has_usage) AS usage_rows, "
    "count(*) FILTER (WHERE cached_tokens IS NOT NULL) AS reported_requests, "
    "CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens, "
    "CAST(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS BIGINT) "
    "AS reported_prompt_tokens, "
    "CAST(sum(cached_tokens) AS BIGINT) AS cached_tokens, "
    "CAST(sum(accepted_cached_tokens) AS BIGINT) AS accepted_cached_tokens, "
    "CAST(sum(candidate_cached_tokens) AS BIGINT) AS candidate_cached_tokens, "
    "CAST(sum(prompt_tokens - cached_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS BIGINT)"
    " AS miss_tokens, "
    + ", ".join(f"count(*) FILTER (WHERE {INVARIANT_PREDICATES[n]}) AS {n}" for n in INVARIANTS)
    + f", count(*) FILTER (WHERE {UNVERIFIABLE_SQL}) AS unverifiable_accepts "
    "FROM ({rows}) j WHERE {where} GROUP BY ALL")

ROLLUP_DDL = """
    CREATE TABLE scope_rollup_5m (
        bucket_start_s           DOUBLE,           -- floor(ts / 300) * 300; NULL = no time
        run_id                   VARCHAR NOT NULL,
        model                    VARCHAR,
        scope                    VARCHAR NOT NULL, -- PUBLIC, TENANT, PRINCIPAL, UNSCOPED
        namespace_digest         VARCHAR,
        decision                 VARCHAR,          -- accept, reject, miss; NULL = no decision
        first_mismatch           VARCHAR,
        refused                  VARCHAR,          -- error code of a decision without usage
        requests                 BIGINT NOT NULL,  -- rows of the join
        usage_rows               BIGINT NOT NULL,  -- of them with a requests row
        reported_requests        BIGINT NOT NULL,  -- cached_tokens reported (0 included)
        prompt_tokens            BIGINT,           -- sums (NULL when none recorded)
        reported_prompt_tokens   BIGINT,
        cached_tokens            BIGINT,
        accepted_cached_tokens   BIGINT,
        candidate_cached_tokens  BIGINT,
        miss_tokens              BIGINT,           -- sum(prompt - cached), reporting requests
        cross_scope_acceptance   BIGINT NOT NULL,  -- rows violating each invariant
        wrong_version_acceptance BIGINT NOT NULL,
        old_generation_use       BIGINT NOT NULL,
        unverifiable_accepts     BIGINT NOT NULL
    )
"""
ROLLUP_FILL_SQL = (f"INSERT INTO scope_rollup_5m ({', '.join(ROLLUP_COLUMNS)}) "
                   + ROLLUP_SELECT_SQL.format(rows=JOINED_SQL, where="TRUE"))
