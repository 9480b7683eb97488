"""The miss ledger of a replay run as a file (``ledger.json``) that ``prefixscope.ingest.ledger``
reads into DuckDB (table ``ledger_totals``): replay writes files, ingest stores them.

Written by ``diagnose --ingest`` (one policy, ``single``: the trace on one instance of the cache)
and ``replay fleet --ingest`` (one policy per router, in the order asked: rank 0 is the first).
Counts only: per (model, instance, trace day, scope) the ledger classes' tokens
(:data:`prefixscope.replay.ledger.CLASSES`), never prompt text, a salt or a tenant id. A scope
outside :data:`SAFE_SCOPES` (a trace's own ``scope`` attribute may name anything) is written as
``other``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefixscope.replay.ledger import CLASSES, GROUP_BY, LedgerRecord, LedgerTotals, group_totals

#: ``ledger.json`` format version.
FORMAT_VERSION = 1
#: The file's ``kind``.
KIND = "miss-ledger"
#: The ``router`` of a one-instance ledger (``diagnose``).
SINGLE = "single"
#: Scope labels stored as they are (``replay.ledger.scope_of`` and the gateway's scopes); any
#: other becomes ``other``.
SAFE_SCOPES = ("none", "salted", "PUBLIC", "TENANT", "PRINCIPAL", "other")
#: Token fields of a row, in :data:`CLASSES` order (the file's and the table's names).
TOKEN_FIELDS = tuple(f"{c}_tokens" for c in CLASSES)


@dataclass(frozen=True, slots=True)
class PolicyLedger:
    """One routing policy's ledger totals of a run.

    Attributes:
        router: the policy (``replay.routers.ROUTERS``) or :data:`SINGLE`.
        instances: the fleet size (>= 1).
        groups: ``{(model, instance, day, scope): LedgerTotals}`` (:func:`group_totals` by
            :data:`GROUP_BY`).
    """

    router: str
    instances: int
    groups: Mapping[tuple[Any, ...], LedgerTotals]


def policy_ledger(router: str, instances: int,
                  records: Iterable[LedgerRecord]) -> PolicyLedger:
    """Group ``records`` (one policy's, any order) into a :class:`PolicyLedger`."""
    return PolicyLedger(router, instances, group_totals(records, GROUP_BY))


def _scope(s: Any) -> str:
    return s if s in SAFE_SCOPES else "other"


def ledger_rows(p: PolicyLedger, *, model: str | None = None,
                default_model: str | None = None) -> list[dict[str, Any]]:
    """The rows of one policy: ``model, instance, day, scope, requests, prompt_tokens`` and
    :data:`TOKEN_FIELDS` plus ``capacity_belady_tokens`` (tokens; groups in first-seen order).
    ``model`` replaces every row's model (``--model`` of the run); else a record without one
    takes ``default_model`` or ``''``. Rows that collapse onto one key (two scopes read
    ``other``) are summed."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for (m, inst, day, scope), t in p.groups.items():
        key = (model if model is not None else (m or default_model or ""), str(inst), int(day), _scope(scope))
        row = out.get(key)
        if row is None:
            row = out[key] = {"model": key[0], "instance": key[1], "day": key[2],
                              "scope": key[3], "requests": 0, "prompt_tokens": 0,
                              **dict.fromkeys(TOKEN_FIELDS, 0), "capacity_belady_tokens": 0}
        row["requests"] += t.requests
        row["prompt_tokens"] += t.prompt_tokens
        for c, f in zip(CLASSES, TOKEN_FIELDS):
            row[f] += getattr(t, c)
        row["capacity_belady_tokens"] += t.capacity_belady
    return list(out.values())


def ledger_file_doc(policies: Sequence[PolicyLedger], *, run_id: str, run_kind: str,
                    label: str | None, block_size: int, capacity_blocks: int | None,
                    model: str | None = None, default_model: str | None = None,
                    trace: str | None = None,
                    created_unix_s: float | None = None) -> dict[str, Any]:
    """The ``ledger.json`` document (docs/schema.md ``ledger_totals``): the run (id, kind,
    label, cache) and, per policy in rank order, its rows (:func:`ledger_rows`). ``trace`` is
    stored as its file name only."""
    return {
        "format_version": FORMAT_VERSION, "kind": KIND, "run_id": run_id,
        "run_kind": run_kind, "label": label,
        "created_unix_s": time.time() if created_unix_s is None else created_unix_s,
        "block_size": block_size, "capacity_blocks": capacity_blocks,
        "trace": None if trace is None else Path(trace).name,
        "policies": [{"router": p.router, "rank": k, "instances": p.instances,
                      "rows": ledger_rows(p, model=model, default_model=default_model)} for k, p in enumerate(policies)],
    }


def write_ledger_file(path: str | os.PathLike[str], policies: Sequence[PolicyLedger], *,
                      run_id: str, run_kind: str, label: str | None, block_size: int,
                      capacity_blocks: int | None, model: str | None = None,
                      default_model: str | None = None, trace: str | None = None) -> Path:
    """Write ``ledger.json`` (:func:`ledger_file_doc`); returns its path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = ledger_file_doc(policies, run_id=run_id, run_kind=run_kind, label=label,
                          block_size=block_size, capacity_blocks=capacity_blocks, model=model,
                          default_model=default_model, trace=trace)
    p.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return p


__all__ = ["FORMAT_VERSION", "KIND", "PolicyLedger", "SAFE_SCOPES", "SINGLE", "TOKEN_FIELDS",
           "ledger_file_doc", "ledger_rows", "policy_ledger", "write_ledger_file"]
