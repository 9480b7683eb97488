"""Ingest a live replay run directory (written by ``prefixscope.replay.live_run.run_live``).

Everything goes through the ordinary ingest paths, so a live run looks exactly like production
traffic of its server, tagged with its run id:

1. ``requests.jsonl`` through :func:`prefixscope.ingest.usage.ingest_usage_file` (``run_id`` on every row);
2. ``metrics_before.prom`` and ``metrics_after.prom`` through
   :func:`prefixscope.ingest.exposition.ingest_exposition`, stamped with their scrape times and the server's
   instance (host:port), so the hit-rate queries see the run's window like any two scrapes; the
   before scrape is a baseline (no created-zero sample before it is stored), so the run's
   counters are its own before/after delta whatever the server served earlier;
3. the ``runs`` row (kind ``replay-live``, parameters as JSON) and the run-scoped counter deltas
   (``live_run_counters``) through :func:`prefixscope.store.queries.replay_live.save_live_run`.

Safe to run twice (every step is idempotent).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from prefixscope.ingest.bookkeeping import IngestSummary
from prefixscope.core.documents import load_json_file
from prefixscope.core.errors import ParseError


@dataclass(frozen=True, slots=True)
class LiveRunIngest:
    """What :func:`ingest_live_run` stored: the run id and one summary per file."""

    run_id: str
    requests: IngestSummary
    metrics: tuple[IngestSummary, ...]
    counter_rows: int


def _check_manifest(where: str, doc: Any) -> None:
    """The shape of a live run's ``run.json`` before any of it is used (a hand-edited one was
    an ``AttributeError``/``ValueError`` traceback). Raises :class:`ParseError` naming the
    first field of the wrong shape (never its value)."""
    import math

    def bad(fld: str, reason: str) -> ParseError:
        return ParseError(where, None, reason, field=fld)

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(doc, dict):
        raise bad("$", "not a JSON object (a live replay run manifest)")
    for key in ("run_id", "instance"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise bad(f"$.{key}", "missing or empty")
    if doc.get("model") is not None and not isinstance(doc["model"], str):
        raise bad("$.model", "not text")
    for key in ("before_ts_unix_s", "after_ts_unix_s", "started_unix_s"):
        if doc.get(key) is not None and not number(doc[key]):
            raise bad(f"$.{key}", "not a finite number")
    params = doc.get("params")
    if params is not None and not isinstance(params, dict):
        raise bad("$.params", "not an object")
    if isinstance(params, dict) and params.get("label") is not None \
            and not isinstance(params["label"], str):
        raise bad("$.params.label", "not text")
    for key in ("before_totals", "after_totals", "deltas"):
        value = doc.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise bad(f"$.{key}", "not an object")
        for i, v in enumerate(value.values()):
            if not number(v) and not (v is None and key != "deltas"):
                raise bad(f"$.{key}", f"entry {i + 1} is not a finite number")


def ingest_live_run(con: duckdb.DuckDBPyConnection, run_dir: str | os.PathLike[str]
                    ) -> LiveRunIngest:
    """Ingest one live replay run directory on an open read-write connection.

    Raises:
        SourceUnavailable: the directory has no ``run.json``.
        ParseError: ``run.json`` is not valid JSON or lacks ``run_id``/``instance``.
    """
    from prefixscope.ingest.exposition import configured_label_key, ingest_exposition
    from prefixscope.ingest.runs import check_run_dir
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store.queries.replay_live import save_live_run

    d = Path(run_dir)
    manifest = d / "run.json"
    check_run_dir(d, "run.json", "a live replay run directory")
    doc = load_json_file(manifest, what="manifest")
    _check_manifest(str(manifest), doc)
    run_id, instance = doc["run_id"], doc["instance"]
    req_summary = ingest_usage_file(con, d / "requests.jsonl", run_id=run_id, instance=instance,
                                    default_model=doc.get("model") or None)
    metric_summaries = []
    label_key = configured_label_key()  # once for both scrapes
    for name, ts_key in (("metrics_before.prom", "before_ts_unix_s"),
                         ("metrics_after.prom", "after_ts_unix_s")):
        if (d / name).is_file() and doc.get(ts_key) is not None:
            metric_summaries.append(ingest_exposition(
                con, str(d / name), instance=instance, at_unix_s=float(doc[ts_key]),
                run_id=run_id, label_key=label_key,
                since_unix_s=float(doc["before_ts_unix_s"])
                if doc.get("before_ts_unix_s") is not None else None))
    n = 0
    if doc.get("before_ts_unix_s") is not None and doc.get("after_ts_unix_s") is not None:
        n = save_live_run(
            con, run_id=run_id, label=(doc.get("params") or {}).get("label"),
            created_unix_s=float(doc.get("started_unix_s") or doc["before_ts_unix_s"]),
            params=doc.get("params") or {}, instance=instance,
            before=doc.get("before_totals") or {}, after=doc.get("after_totals") or {},
            deltas=doc.get("deltas") or {}, before_ts_unix_s=float(doc["before_ts_unix_s"]),
            after_ts_unix_s=float(doc["after_ts_unix_s"]), settled=bool(doc.get("settled")),
        )
    else:
        save_live_run(con, run_id=run_id, label=(doc.get("params") or {}).get("label"),
                      created_unix_s=float(doc.get("started_unix_s") or 0.0),
                      params=doc.get("params") or {}, instance=instance, before={}, after={},
                      deltas={}, before_ts_unix_s=0.0, after_ts_unix_s=0.0, settled=False)
    return LiveRunIngest(run_id, req_summary, tuple(metric_summaries), n)
