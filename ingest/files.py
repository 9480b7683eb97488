"""Several files through one ingester: the one loop behind ``ingest requests``, ``ingest
decisions``, ``ingest kv-events FILE...`` and ``ingest otlp FILE...``.

Rules (docs/ingest.md): every path given is tried; a path that cannot be read (missing, a
folder where files are wanted, a folder without the ``*.jsonl`` it reads, unreadable) or a file whose new
lines were all quarantined is an error message and the other paths are still read; each file
is ingested through one :func:`prefixscope.store.db.batch_writer`: the database file is open
only while a batch (rows, quarantine entries and checkpoint, one transaction) is written and
closed between batches, so other processes read and write in between; an interrupted run
resumes from the last committed checkpoint. Whether *nothing* was read (exit code 4) is the caller's to word.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from prefixscope.core.bounds import NotReadable, source_stat
from prefixscope.core.errors import NothingIngested, ParseError, SourceUnavailable
from prefixscope.ingest.bookkeeping import IngestSummary, Quarantined
from prefixscope.ingest.bookkeeping import SourceOutcome as FileOutcome

#: ``ingest_one(con, path) -> (summary, quarantined lines)`` for one file.
IngestOne = Callable[[duckdb.DuckDBPyConnection, str], tuple[IngestSummary, Sequence[Quarantined]]]


@dataclass
class FilesResult:
    """What :func:`ingest_files` did.

    Attributes:
        outcomes: one per file that gave a summary, in the order read.
        errors: one message per path that could not be read or whose new lines were all
            quarantined (``failed`` counts the latter).
    """

    outcomes: list[FileOutcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: int = 0

    @property
    def problems(self) -> list[Quarantined]:
        """Every quarantined line of every outcome, file order."""
        return [q for o in self.outcomes for q in o.problems]

    @property
    def rows_read(self) -> int:
        return sum(o.summary.rows_read for o in self.outcomes)


def expand_paths(paths: Sequence[str], *, folders: bool, folder_glob: str = "*.jsonl"
                 ) -> tuple[list[str], list[str]]:
    """(files, errors): each path as a file; a folder is its sorted ``folder_glob`` files
    when ``folders``, else an error; a missing path is an error (``<path>: no such file``)."""
    files: list[str] = []
    errors: list[str] = []
    for given in paths:
        try:  # the one lookup of a given path (prefixscope.core.bounds.source_stat)
            st = source_stat(given)
        except NotReadable as exc:
            errors.append(f"{given}: {exc}")
            continue
        if stat.S_ISDIR(st.st_mode):
            p = Path(given)
            if not folders:
                errors.append(f"{given}: is a folder: give its .jsonl files (e.g. {p / '*.jsonl'})")
                continue
            try:
                found = sorted(p.glob(folder_glob))
            except OSError as exc:
                errors.append(f"{given}: {NotReadable(exc.strerror or str(exc))}")
                continue
            if not found:
                errors.append(f"{given}: a folder without {folder_glob} files")
            else:
                files.extend(str(x) for x in found)
        else:
            files.append(str(given))
    return files, errors


def ingest_files(db_path: str, paths: Sequence[str], ingest_one: IngestOne, *,
                 folders: bool = False, folder_glob: str = "*.jsonl") -> FilesResult:
    """Ingest every file of ``paths`` with ``ingest_one``, each through its own batch writer
    (:func:`prefixscope.store.db.batch_writer`: the file is released between batches).

    Args:
        db_path: the DuckDB file (created and migrated when new).
        paths: files, or folders of ``*.jsonl`` when ``folders``.
        ingest_one: the ingester of one file.
        folders: expand folders (else a folder is an error).
        folder_glob: the files of a folder that are read (e.g. ``decisions*.jsonl``).

    Returns:
        :class:`FilesResult`. Raises nothing for a source: ``SourceUnavailable``,
        ``ParseError`` and ``NothingIngested`` of one file become its error message. A store
        error (locked, schema) propagates.
    """
    from prefixscope.store import db as store_db

    files, errors = expand_paths(paths, folders=folders, folder_glob=folder_glob)
    result = FilesResult(errors=errors)
    for f in files:
        with store_db.batch_writer(db_path) as con:
            try:
                summary, problems = ingest_one(con, f)
            except NothingIngested as exc:
                result.errors.append(str(exc))
                result.failed += 1
                continue
            except (SourceUnavailable, ParseError) as exc:
                result.errors.append(str(exc))
                continue
        result.outcomes.append(FileOutcome(summary, tuple(problems)))
    return result


def quarantined_dicts(problems: Sequence[Quarantined]) -> list[dict]:
    """The ``quarantined`` entries of ``--json``: location, line, field, reason."""
    return [{"location": q.location, "line": q.line, "field": q.field, "reason": q.reason}
            for q in problems]
