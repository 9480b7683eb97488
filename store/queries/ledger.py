"""Queries on the miss ledger of replay runs (table ``ledger_totals``; migration 31).

Rows are token counts per (run, router, model, instance, trace day, scope) by ledger class
(docs/metrics.md "Miss ledger"; docs/schema.md ``ledger_totals``), never prompt text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pandas as pd

#: Ledger classes in the ledger's test order (``replay.ledger.CLASSES``), and their columns.
CLASSES = ("hit", "granularity", "routing", "capacity", "isolation", "prompt_change", "cold")
CLASS_COLUMNS = tuple(f"{c}_tokens" for c in CLASSES)
#: The loss classes (every class but ``hit``).
LOSS_CLASSES = CLASSES[1:]
KEY_COLUMNS = ("run_id", "router", "model", "instance", "day", "scope")
LEDGER_COLUMNS = ("run_id", "router", "policy_rank", "instances", "model", "instance", "day",
                  "scope", "requests", "prompt_tokens", *CLASS_COLUMNS, "capacity_belady_tokens",
                  "created_unix_s", "source_id")
#: What a page or query may group the totals by.
GROUP_COLUMNS = ("router", "model", "instance", "day", "scope")


def insert_ledger_rows(con: duckdb.DuckDBPyConnection, rows: Sequence[Mapping[str, Any]]) -> int:
    """Insert ledger rows (keys :data:`LEDGER_COLUMNS`); a row whose key (:data:`KEY_COLUMNS`)
    is stored already is skipped (safe to run twice). Runs inside the caller's transaction.
    Returns rows added."""
    if not rows:
        return 0
    before = _count(con)
    cols = ", ".join(LEDGER_COLUMNS)
    con.executemany(f"INSERT INTO ledger_totals ({cols}) VALUES "
                    f"({', '.join('?' * len(LEDGER_COLUMNS))}) ON CONFLICT DO NOTHING",
                    [[r.get(c) for c in LEDGER_COLUMNS] for r in rows])
    return _count(con) - before


def _count(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT count(*) FROM ledger_totals").fetchone()
    assert row is not None
    return int(row[0])


def _where(run_ids: Sequence[str] | None, models: Sequence[str] | None,
           instances: Sequence[str] | None, alias: str = "") -> tuple[str, list[Any]]:
    conds: list[str] = []
    params: list[Any] = []
    for col, vals in (("run_id", run_ids), ("model", models), ("instance", instances)):
        if vals:
            conds.append(f"{alias}{col} IN ({', '.join('?' * len(vals))})")
            params.extend(vals)
    return ("WHERE " + " AND ".join(conds)) if conds else "", params


def ledger_runs(con: duckdb.DuckDBPyConnection, *, run_ids: Sequence[str] | None = None,
                models: Sequence[str] | None = None, limit: int = 200) -> pd.DataFrame:
    """Runs with a stored ledger, newest first: ``run_id, label, kind, created_unix_s,
    routers`` (policies in rank order, comma-separated), ``instances`` (the largest fleet),
    ``models`` (number of models), ``prompt_tokens`` (of the rank-0 policy)."""
    where, params = _where(run_ids, models, None)
    return con.execute(
        f"""
        WITH l AS (SELECT * FROM ledger_totals {where}),
        pol AS (SELECT run_id, string_agg(router, ',' ORDER BY policy_rank) AS routers
                FROM (SELECT DISTINCT run_id, policy_rank, router FROM l) GROUP BY run_id),
        agg AS (SELECT run_id, max(created_unix_s) AS created_unix_s,
                       max(instances) AS instances, count(DISTINCT model) AS models,
                       sum(prompt_tokens) FILTER (WHERE policy_rank = 0)::BIGINT AS prompt_tokens
                FROM l GROUP BY run_id)
        SELECT agg.run_id, r.label, r.kind, agg.created_unix_s, pol.routers, agg.instances,
               agg.models, agg.prompt_tokens
        FROM agg JOIN pol USING (run_id) LEFT JOIN runs r USING (run_id)
        ORDER BY agg.created_unix_s DESC, agg.run_id LIMIT {int(limit)}
        """, params).df()


def ledger_totals(con: duckdb.DuckDBPyConnection, *, run_ids: Sequence[str] | None = None,
                  models: Sequence[str] | None = None, instances: Sequence[str] | None = None,
                  days: Sequence[int] | None = None,
                  by: Sequence[str] = ("router",)) -> pd.DataFrame:
    """Ledger totals summed over the rows that match, grouped by ``by`` (names of
    :data:`GROUP_COLUMNS`; ``router`` groups also carry ``policy_rank``), ordered by rank then
    the groups: columns ``by``, ``policy_rank`` (with ``router``), ``requests``,
    ``prompt_tokens``, :data:`CLASS_COLUMNS`, ``capacity_belady_tokens`` (tokens).

    Raises:
        ValueError: a name in ``by`` is not a groupable column.
    """
    bad = [b for b in by if b not in GROUP_COLUMNS]
    if bad:
        raise ValueError(f"cannot group the ledger by {bad}: choose from {list(GROUP_COLUMNS)}")
    where, params = _where(run_ids, models, instances)
    if days:
        where += (" AND " if where else "WHERE ") + f"day IN ({', '.join('?' * len(days))})"
        params.extend(int(d) for d in days)
    keys = list(by) + (["policy_rank"] if "router" in by else [])
    sel = ", ".join(keys)
    sums = ", ".join(f"sum({c})::BIGINT AS {c}" for c in ("requests", "prompt_tokens",
                                                          *CLASS_COLUMNS,
                                                          "capacity_belady_tokens"))
    order = ", ".join((["policy_rank"] if "router" in by else []) + list(by)) or "1"
    group = f"GROUP BY {sel}" if keys else ""
    return con.execute(f"SELECT {sel + ', ' if sel else ''}{sums} FROM ledger_totals {where} "
                       f"{group} ORDER BY {order}", params).df()


def ledger_days(con: duckdb.DuckDBPyConnection, *, run_ids: Sequence[str] | None = None
                ) -> list[int]:
    """Trace days (``floor(arrival_s / 86400)``) with ledger rows, ascending."""
    where, params = _where(run_ids, None, None)
    return [int(r[0]) for r in con.execute(
        f"SELECT DISTINCT day FROM ledger_totals {where} ORDER BY day", params).fetchall()]


def largest_loss_by_model(con: duckdb.DuckDBPyConnection,
                          models: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """model -> the largest loss class of its newest stored ledger (the newest run with ledger
    rows of the model; of that run, the rank-0 policy: the one as deployed): ``{"class"`` (a
    name of :data:`LOSS_CLASSES`), ``"tokens"``, ``"missed_tokens"``, ``"share_of_missed"`` (a
    fraction), ``"run_id"``, ``"router"}``. Models whose ledger missed nothing are absent."""
    where, params = "", []
    if models is not None:
        if not models:
            return {}
        where = f"AND model IN ({', '.join('?' * len(models))})"
        params = list(models)
    sums = ", ".join(f"sum({c})::BIGINT AS {c}" for c in ("prompt_tokens", *CLASS_COLUMNS))
    rows = con.execute(
        f"""
        WITH newest AS (
            SELECT model, arg_max(run_id, created_unix_s) AS run_id
            FROM ledger_totals WHERE model <> '' {where} GROUP BY model)
        SELECT model, run_id, any_value(router) AS router, {sums}
        FROM ledger_totals JOIN newest USING (model, run_id)
        WHERE policy_rank = 0
        GROUP BY model, run_id ORDER BY model
        """, params).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for model, run_id, router, prompt, hit, *losses in rows:
        by = dict(zip(LOSS_CLASSES, losses))
        missed = int(prompt) - int(hit)
        if missed <= 0:
            continue
        cls = max(LOSS_CLASSES, key=lambda c: by[c])  # ties: the earlier class in test order
        out[model] = {"class": cls, "tokens": int(by[cls]), "missed_tokens": missed,
                      "share_of_missed": by[cls] / missed, "run_id": run_id, "router": router}
    return out
