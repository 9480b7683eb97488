"""Ingest a replay run's miss ledger, ``ledger.json`` (written by
``prefixscope.replay.ledger_store``), into the ``ledger_totals`` table, and register its run.

The file holds counts only (tokens per ledger class per model, instance, trace day and scope).
A field of the wrong type or a row whose classes do not sum to its prompt tokens is refused
with ``file: field: reason`` (never its value). Safe to run twice: the ``runs`` row keeps the
first one, ledger rows already stored under the same key are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb

from prefixscope.core.documents import load_summary_file
from prefixscope.core.errors import ConfigError, problem_text

_CLASS_FIELDS = ("hit_tokens", "granularity_tokens", "routing_tokens", "capacity_tokens",
                 "isolation_tokens", "prompt_change_tokens", "cold_tokens")
_INT = ("day", "requests", "prompt_tokens", *_CLASS_FIELDS, "capacity_belady_tokens")
_TEXT = ("model", "instance", "scope")
#: The scopes a row may carry (``replay.ledger_store.SAFE_SCOPES``): never a tenant's name.
_SCOPES = ("none", "salted", "PUBLIC", "TENANT", "PRINCIPAL", "other")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(p: Path, doc: Any) -> list[dict[str, Any]]:
    """The table rows of a parsed ``ledger.json``, or ConfigError for its first bad field."""

    def bad(field: str, reason: str) -> ConfigError:
        return ConfigError(problem_text(str(p), 1, reason, field))

    if not isinstance(doc, dict) or doc.get("kind") != "miss-ledger":
        raise bad("$.kind", "not a miss ledger file")
    if not isinstance(doc.get("run_id"), str) or not doc["run_id"]:
        raise bad("$.run_id", "missing or not a string")
    created = doc.get("created_unix_s")
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        raise bad("$.created_unix_s", "missing or not a number")
    pols = doc.get("policies")
    if not isinstance(pols, list) or not pols:
        raise bad("$.policies", "missing, empty or not a list")
    rows: list[dict[str, Any]] = []
    for k, pol in enumerate(pols):
        at = f"$.policies[{k}]"
        if not isinstance(pol, dict):
            raise bad(at, "not an object")
        if not isinstance(pol.get("router"), str) or not pol["router"]:
            raise bad(f"{at}.router", "missing or not a string")
        for key in ("rank", "instances"):
            if not _is_int(pol.get(key)) or pol[key] < 0:
                raise bad(f"{at}.{key}", "missing or not a non-negative integer")
        if not isinstance(pol.get("rows"), list):
            raise bad(f"{at}.rows", "missing or not a list")
        for i, r in enumerate(pol["rows"]):
            rat = f"{at}.rows[{i}]"
            if not isinstance(r, dict):
                raise bad(rat, "not an object")
            for key in _INT:
                if not _is_int(r.get(key)) or (key != "day" and r[key] < 0):
                    raise bad(f"{rat}.{key}", "missing or not a non-negative integer")
            for key in _TEXT:
                if not isinstance(r.get(key), str):
                    raise bad(f"{rat}.{key}", "missing or not a string")
            if r["scope"] not in _SCOPES:
                raise bad(f"{rat}.scope", f"not one of {', '.join(_SCOPES)}")
            if sum(r[c] for c in _CLASS_FIELDS) != r["prompt_tokens"]:
                raise bad(f"{rat}", "the classes do not sum to prompt_tokens")
            rows.append({**{c: r[c] for c in (*_INT, *_TEXT)}, "run_id": doc["run_id"],
                         "router": pol["router"], "policy_rank": pol["rank"],
                         "instances": pol["instances"], "created_unix_s": float(created),
                         "source_id": f"ledger:{p.resolve()}"})
    return rows


def ingest_ledger_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str]) -> int:
    """Store one ``ledger.json`` and register its run (``runs``: kind ``run_kind``, label,
    cache parameters; an existing run is kept as it is); returns ledger rows added (0 when
    stored before).

    Raises:
        SourceUnavailable: no such file. ConfigError: not valid JSON, or a bad field.
    """
    from prefixscope.ingest.runs import save_run
    from prefixscope.store.queries.ledger import insert_ledger_rows

    p = Path(path)
    doc = load_summary_file(p)
    rows = _check(p, doc)
    label = doc.get("label") if isinstance(doc.get("label"), str) else None
    kind = doc.get("run_kind") if isinstance(doc.get("run_kind"), str) else "replay-fleet"
    params = {k: doc.get(k) for k in ("block_size", "capacity_blocks", "trace")}
    params["routers"] = [pol["router"] for pol in doc["policies"]]
    con.execute("BEGIN")
    try:
        save_run(con, run_id=doc["run_id"], kind=kind, label=label,
                 created_unix_s=float(doc["created_unix_s"]), params=params,
                 source_id=f"ledger:{p.resolve()}")
        added = insert_ledger_rows(con, rows)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return added
