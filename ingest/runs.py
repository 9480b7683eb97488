"""Replay runs: ingest a simulated run's directory and register the run in ``runs``.

A run directory (``replay/runner.py``: ``run.json``, ``requests.jsonl``, ``metrics/*.prom``)
goes in through the *normal* ingest functions, exactly as production files would:

1. ``requests.jsonl`` with :func:`prefixscope.ingest.usage.ingest_usage_file` (rows keyed by run id and
   request id; the run's instance and model);
2. every exposition snapshot with :func:`prefixscope.ingest.exposition.ingest_exposition`, stamped with its
   snapshot time from the manifest, instance = the run id;
3. the run itself with :func:`save_run` (one ``runs`` row: kind ``replay-sim``, label,
   created time, parameters and summary as JSON).

Ingesting the same directory twice adds nothing (file checkpoints, primary keys, and
``save_run`` keeps the first row).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from prefixscope.core.paths import RUN_MANIFEST
from prefixscope.ingest.bookkeeping import IngestSummary
from prefixscope.ingest.exposition import configured_label_key, ingest_exposition
from prefixscope.ingest.usage import ingest_usage_file


@dataclass
class RunIngest:
    """What ingesting one run directory did.

    Attributes:
        run_id: the run.
        usage: summary of the usage file ingest.
        metrics: one summary per exposition snapshot.
        run_added: True when the ``runs`` row was new.
    """

    run_id: str
    usage: IngestSummary
    metrics: list[IngestSummary] = field(default_factory=list)
    run_added: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: rows added per kind."""
        return {
            "run_id": self.run_id,
            "requests_added": self.usage.rows_added,
            "requests_quarantined": self.usage.rows_quarantined,
            "metric_snapshots": len(self.metrics),
            "metric_samples_added": sum(m.rows_added for m in self.metrics),
            "run_added": self.run_added,
        }


def save_run(con: duckdb.DuckDBPyConnection, *, run_id: str, kind: str, label: str | None,
             created_unix_s: float | None, params: dict[str, Any] | None,
             source_id: str | None = None) -> bool:
    """Insert one ``runs`` row; an existing ``run_id`` is kept unchanged.

    Args:
        run_id: the run's id (also the ``run_id`` of its ``requests`` rows).
        kind: ``replay-sim``, ``replay-live`` or ``production``.
        label: short human name.
        created_unix_s: when the run was made (Unix seconds).
        params: parameters and summary, stored as JSON text in ``params_json``.
        source_id: the ingest source it came from (the run directory), if any.

    Returns:
        True when the row was added.
    """
    from prefixscope.store.queries.replay import insert_run

    return insert_run(con, run_id=run_id, kind=kind, label=label,
                      created_unix_s=created_unix_s, params=params, source_id=source_id)


def check_run_dir(run_dir: str | os.PathLike[str], manifest: str, kind: str) -> None:
    """Refuse a run directory that is not a folder or has no ``manifest``, through the one path
    lookup (:func:`prefixscope.core.bounds.check_folder` / ``source_stat``): a name too long, a
    folder above it that cannot be searched, a name that is not UTF-8 is a sentence.

    Args:
        kind: what the folder should be, for the messages (``a replay run directory``).

    Raises:
        SourceUnavailable: ``DIR: no such folder``, ``DIR: not a folder (give KIND)``, ``DIR: no
            MANIFEST (not KIND)``, ``DIR: permission denied (...)``... A manifest that exists but
            cannot be read (a FIFO, a dangling link) is left to its reader to name.
    """
    from prefixscope.core.bounds import NOT_A_FOLDER, NotReadable, check_folder, source_stat
    from prefixscope.core.errors import SourceUnavailable

    try:
        check_folder(run_dir)
    except NotReadable as exc:
        why = str(exc) + (f" (give {kind})" if str(exc) == NOT_A_FOLDER else "")
        raise SourceUnavailable(f"{run_dir}: {why}") from None
    try:
        source_stat(Path(run_dir) / manifest)
    except NotReadable as exc:
        if str(exc) == "no such file":
            raise SourceUnavailable(f"{run_dir}: no {manifest} (not {kind})") from None


def read_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``run.json`` of a run directory (written by ``prefixscope.replay.runner``).

    Raises:
        SourceUnavailable: no manifest there. ConfigError: not valid JSON.
    """
    from prefixscope.core.documents import load_summary_file

    path = Path(run_dir) / RUN_MANIFEST
    check_run_dir(run_dir, RUN_MANIFEST, "a replay run directory")
    return load_summary_file(path, unreadable="cannot read: ")


def check_manifest(path: Path, doc: Any) -> None:
    """Check the shape of a run manifest before any of it is used (a hand-edited or foreign
    ``run.json`` was a ``KeyError`` / ``TypeError`` traceback).

    Raises:
        ConfigError: ``run.json: $.field: reason`` for the first field of the wrong shape
            (the reason names the rule, never the value).
    """
    import math

    from prefixscope.core.errors import ConfigError, problem_text

    def bad(fld: str, reason: str) -> ConfigError:
        return ConfigError(problem_text(str(path), None, reason, fld))

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(doc, dict):
        raise bad("$", "not a JSON object (a replay run manifest)")
    rid = doc.get("run_id")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise bad("$.run_id", "missing or empty")
    for key in ("instance", "model", "kind", "label"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise bad(f"$.{key}", "not text")
    for key in ("created_unix_s", "t0_unix_s"):
        if doc.get(key) is not None and not number(doc[key]):
            raise bad(f"$.{key}", "not a finite number")
    if doc.get("params") is not None and not isinstance(doc["params"], dict):
        raise bad("$.params", "not an object")
    files = doc.get("files")
    if files is None:
        return
    if not isinstance(files, dict):
        raise bad("$.files", "not an object")
    if files.get("usage") is not None and not isinstance(files["usage"], str):
        raise bad("$.files.usage", "not text (a file name)")
    metrics = files.get("metrics")
    if metrics is None:
        return
    if not isinstance(metrics, list):
        raise bad("$.files.metrics", "not a list")
    for i, entry in enumerate(metrics):
        if not isinstance(entry, dict):
            raise bad(f"$.files.metrics[{i}]", "not an object")
        if not isinstance(entry.get("path"), str) or not entry["path"]:
            raise bad(f"$.files.metrics[{i}].path", "missing or not text (a file name)")
        if not number(entry.get("at_unix_s")):
            raise bad(f"$.files.metrics[{i}].at_unix_s", "missing or not a finite number")


def ingest_run_dir(con: duckdb.DuckDBPyConnection,
                   run_dir: str | os.PathLike[str]) -> RunIngest:
    """Ingest a replay run directory (see the module docstring) on a read-write connection.

    Raises:
        SourceUnavailable: no ``run.json``, or an output file it lists is missing.
        ConfigError: ``run.json`` is not valid JSON, or of the wrong shape
            (:func:`check_manifest`).
    """
    from prefixscope.core.errors import SourceUnavailable

    d = Path(run_dir)
    doc = read_manifest(d)
    check_manifest(d / RUN_MANIFEST, doc)
    run_id = str(doc["run_id"])
    instance = str(doc.get("instance") or run_id)
    files = doc.get("files") or {}
    usage_path = d / (files.get("usage") or "requests.jsonl")
    if not usage_path.is_file():
        raise SourceUnavailable(f"{usage_path}: listed in {d / 'run.json'} but missing")
    usage = ingest_usage_file(con, str(usage_path), run_id=run_id, instance=instance,
                              default_model=doc.get("model"))
    metrics = []
    label_key = configured_label_key()  # once for every snapshot of the run
    for entry in files.get("metrics") or []:
        path = d / entry["path"]
        if not path.is_file():
            raise SourceUnavailable(f"{path}: listed in {d / 'run.json'} but missing")
        metrics.append(ingest_exposition(con, str(path), instance=instance,
                                         at_unix_s=float(entry["at_unix_s"]), run_id=run_id,
                                         label_key=label_key))
    params = dict(doc.get("params") or {})
    params["summary"] = doc.get("summary")
    params["layout"] = doc.get("layout")
    params["model"] = doc.get("model")
    params["t0_unix_s"] = doc.get("t0_unix_s")
    added = save_run(con, run_id=run_id, kind=str(doc.get("kind", "replay-sim")),
                     label=doc.get("label"), created_unix_s=doc.get("created_unix_s"),
                     params=params, source_id=f"replay-run:{d.resolve()}")
    return RunIngest(run_id=run_id, usage=usage, metrics=metrics, run_added=added)
