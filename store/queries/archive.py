"""Retention and the Parquet archive of old raw rows (``docs/retention.md``).

Two parts:

1. **Reading** (:func:`relation`): the one place that decides whether a query of ``requests``,
   ``metric_samples`` or ``gateway_decisions`` over a time range reads the table alone or the
   table and the archived Parquet files of the days the range reaches (``archive_parts``,
   migration 73). Every range query of ``store/queries/requests.py``, the counter queries of
   ``metrics.py``, ``savings.py``, ``serving.py``, the scope queries of ``scopes.py`` and
   ``scope_rollup.py``'s recompute take their ``FROM`` from it; nothing else names the
   archive.
2. **Archiving** (:func:`plan_days`, :func:`plan_chunks`, :func:`archive_range`,
   :func:`drop_rollups`): production rows (``run_id = ''``) of whole UTC days before a cutoff
   are written as hive-partitioned Parquet,
   ``<root>/<table>/day=YYYY-MM-DD/model=<model>/<table>-g<gen>-<i>.parquet`` (one DuckDB
   ``COPY ... (FORMAT parquet, PARTITION_BY (day, model))`` per table and chunk of days,
   partition columns also kept inside the files), their row counts checked from the files'
   footers, and only then deleted in one transaction with the ``archive_parts`` rows that list
   the files. Crash-safe at any point: before that commit nothing is deleted and nothing lists
   the files (queries never read them), and the next run writes the same file names again
   (``OVERWRITE_OR_IGNORE``); after it the days are done. Replay runs' rows (``run_id <>
   ''``) are never archived. :func:`archive_day` is the older one-day path (COPY, full
   read-back, DELETE), kept as the benchmark's baseline.

Rollups: ``request_rollup_1m`` and ``counter_rollup_5m`` keep counting archived rows until
:func:`drop_rollups` deletes the production buckets before a cutoff (``[retention]
rollup_days``); :func:`rollup_floor` is then the time before which the queries read raw rows
(table and archive) instead of the rollup.
"""

from __future__ import annotations

import calendar
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import duckdb

from prefixscope.core.errors import InvalidArgument, SourceUnavailable

DAY_S = 86400.0
#: Tables that ``prefixscope archive`` moves to Parquet: (time column, columns left out of the
#: files, rollup table, the rows the rollup counts).
#: ``gateway_decisions`` has no rollup of its own: ``scope_rollup_5m`` (of decisions joined to
#: requests) is kept whole and goes on counting archived rows.
ARCHIVED: dict[str, tuple[str, tuple[str, ...], str | None, str]] = {
    "requests": ("ts_unix_s", ("request_key",), "request_rollup_1m", "TRUE"),
    "metric_samples": ("ts_unix_s", (), "counter_rollup_5m", "has_prev"),
    "gateway_decisions": ("ts_unix_s", (), None, "TRUE"),
}
#: Rows of one table archived under one write lock by ``prefixscope archive`` (whole days, at
#: least one): bounds how long a scraper waiting for the lock waits (a chunk took up to ~15 s
#: at 500,000 on the loaded 2-core machine, mostly the DELETE's primary-key index work at
#: commit; ``docs/benchmarks.md``), well inside its 30 s lock timeout.
CHUNK_ROWS = 250_000
#: Further rollups whose production buckets are dropped with a table's main rollup (they are
#: checked against it: ``latency_rollup_1d`` against ``request_rollup_1m``'s with_ttft and
#: with_latency). ``scope_rollup_5m`` is kept whole (it counts archived requests).
DROPPED_WITH: dict[str, tuple[str, ...]] = {"requests": ("latency_rollup_1d",)}
#: URL schemes read and written through DuckDB's httpfs extension.
REMOTE_SCHEMES = ("s3://", "s3a://", "s3n://", "gs://", "gcs://", "r2://", "http://", "https://")


def is_remote(location: str) -> bool:
    """True when ``location`` is object storage or HTTP (needs httpfs), False for a folder."""
    return location.lower().startswith(REMOTE_SCHEMES)


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_table(table: str) -> None:
    if table not in ARCHIVED:
        raise InvalidArgument(f"cannot archive table {table!r}: choose from {sorted(ARCHIVED)}")


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

def archived_files(con: duckdb.DuckDBPyConnection, table: str, start_s: float | None = None,
                   end_s: float | None = None) -> list[str]:
    """The archived Parquet files of ``table`` whose day overlaps ``[start_s, end_s)`` (None =
    unbounded), oldest day first; empty when nothing is archived (or the database predates
    migration 73, or ``con`` is a private table set without ``archive_parts``)."""
    _check_table(table)
    sql = ("SELECT files FROM archive_parts WHERE tbl = ? "
           "AND epoch(day::TIMESTAMP) + 86400 > ? AND epoch(day::TIMESTAMP) < ? ORDER BY day, gen")
    lo = -1e300 if start_s is None else float(start_s)
    hi = 1e300 if end_s is None else float(end_s)
    try:
        rows = con.execute(sql, [table, lo, hi]).fetchall()
    except duckdb.CatalogException:
        return []
    return [f for (files,) in rows for f in files]


def archived_end_s(con: duckdb.DuckDBPyConnection, table: str, start_s: float | None = None,
                   end_s: float | None = None) -> float | None:
    """End of the newest archived UTC day of ``table`` overlapping ``[start_s, end_s)`` (Unix
    s; every archived row of the range is older), None when none overlaps."""
    _check_table(table)
    lo = -1e300 if start_s is None else float(start_s)
    hi = 1e300 if end_s is None else float(end_s)
    try:
        row = con.execute("SELECT max(epoch(day::TIMESTAMP)) + 86400 FROM archive_parts WHERE "
                          "tbl = ? AND epoch(day::TIMESTAMP) + 86400 > ? AND "
                          "epoch(day::TIMESTAMP) < ?", [table, lo, hi]).fetchall()[0]
    except duckdb.CatalogException:
        return None
    return None if row[0] is None else float(row[0])


def check_files(files: Sequence[str]) -> None:
    """Fail with a message naming the file when an archived local file is missing or is not
    Parquet (``PAR1`` at both ends); remote files are checked by DuckDB when read.

    Raises:
        SourceUnavailable: ``archive file <path>: <what is wrong>``.
    """
    for f in files:
        if is_remote(f):
            continue
        try:
            size = os.path.getsize(f)
            with open(f, "rb") as fh:
                head = fh.read(4)
                fh.seek(max(size - 4, 0))
                tail = fh.read(4)
        except FileNotFoundError:
            raise SourceUnavailable(
                f"archive file {f}: missing (listed in archive_parts); restore the archive "
                "folder from its copy") from None
        except OSError as exc:
            raise SourceUnavailable(f"archive file {f}: cannot read: {exc.strerror}") from None
        if size < 12 or head != b"PAR1" or tail != b"PAR1":
            raise SourceUnavailable(
                f"archive file {f}: not a Parquet file ({size} bytes, no PAR1 magic); it was "
                "changed after prefixscope archive wrote it: restore it from a copy")


def relation(con: duckdb.DuckDBPyConnection, table: str, start_s: float | None = None,
             end_s: float | None = None) -> str:
    """The relation a query of ``table`` (a key of :data:`ARCHIVED`) over ``[start_s,
    end_s)`` reads: the table's name when no archived day overlaps the range, else a
    parenthesised ``UNION ALL BY NAME`` of the table and ``read_parquet`` of exactly the
    archived files of those days (the same columns; ``requests.request_key`` is NULL on the
    archived side; a file archived before a migration added a column reads it as NULL, by
    name, e.g. ``gateway_decisions.bypass``, migration 81). The caller still applies its own time filter (DuckDB pushes it into the
    Parquet scan). Remote archives load httpfs first (:func:`ensure_remote`).

    Raises:
        SourceUnavailable: an archived file is missing or not Parquet (named), or httpfs
            cannot be loaded for a remote archive.
    """
    files = archived_files(con, table, start_s, end_s)
    if not files:
        return table
    check_files(files)
    if any(is_remote(f) for f in files):
        ensure_remote(con, next(f for f in files if is_remote(f)))
    _, exclude, _, _ = ARCHIVED[table]
    excl = f" EXCLUDE ({', '.join(exclude)})" if exclude else ""
    listed = ", ".join(_lit(f) for f in files)
    return (f"(SELECT *{excl} FROM {table} UNION ALL BY NAME "
            f"SELECT * EXCLUDE (day, archive_gen) FROM read_parquet([{listed}], "
            f"hive_partitioning = false, union_by_name = true))")


def oldest_archived_s(con: duckdb.DuckDBPyConnection, table: str) -> float | None:
    """Start of the oldest archived UTC day of ``table`` (None: nothing archived): the data
    span of the filters reaches back to it."""
    _check_table(table)
    try:
        row = con.execute("SELECT min(epoch(day::TIMESTAMP)) FROM archive_parts WHERE tbl = ?",
                          [table]).fetchall()[0]
    except duckdb.CatalogException:
        return None
    return None if row is None or row[0] is None else float(row[0])


def with_archived_start(con: duckdb.DuckDBPyConnection, table: str,
                        lo: float | None) -> float | None:
    """``lo`` (the oldest retained time) or the oldest archived day's start, the earlier."""
    a = oldest_archived_s(con, table)
    return a if lo is None else float(lo) if a is None else min(float(lo), a)


def rollup_floor(con: duckdb.DuckDBPyConnection, table: str) -> float | None:
    """Unix time before which the production rollup rows of ``table`` were deleted by
    :func:`drop_rollups` (a UTC day start), or None: queries read raw rows (:func:`relation`)
    before it and the rollup from it on."""
    _check_table(table)
    try:
        row = con.execute("SELECT max(epoch(day::TIMESTAMP)) + 86400 FROM archive_parts "
                          "WHERE tbl = ? AND rollup_dropped", [table]).fetchall()[0]
    except duckdb.CatalogException:
        return None
    return None if row is None or row[0] is None else float(row[0])


def rollup_balance(con: duckdb.DuckDBPyConnection, table: str) -> tuple[int, int]:
    """``(rows the rollup should count, rows it counts)`` for ``table`` (``requests`` or
    ``metric_samples``): retained rows (of the rollup's kind) plus archived rows whose rollup
    is kept, against the rollup's total, both without the production rows before
    :func:`rollup_floor`. Equal = the rollup is current."""
    _check_table(table)
    _, _, rollup, counted = ARCHIVED[table]
    if rollup is None:
        raise InvalidArgument(f"{table} has no rollup of its own")
    measure = "requests" if table == "requests" else "samples"
    floor = rollup_floor(con, table)
    keep_raw = ("TRUE" if floor is None
                else f"NOT coalesce(run_id = '' AND ts_unix_s < {floor!r}, FALSE)")
    keep_roll = ("TRUE" if floor is None
                 else f"NOT coalesce(run_id = '' AND bucket_start_s < {floor!r}, FALSE)")
    try:
        archived = con.execute("SELECT coalesce(sum(rollup_rows), 0) FROM archive_parts "
                               "WHERE tbl = ? AND NOT rollup_dropped", [table]).fetchall()[0][0]
    except duckdb.CatalogException:
        archived = 0
    n, r = con.execute(f"SELECT (SELECT count(*) FROM {table} WHERE {counted} AND {keep_raw}), "
                       f"(SELECT coalesce(sum({measure}), 0) FROM {rollup} WHERE {keep_roll})"
                       ).fetchall()[0]
    return int(n) + int(archived), int(r)


def archived_rows(con: duckdb.DuckDBPyConnection, table: str) -> int:
    """Rows of ``table`` in the archive (every generation), 0 before migration 73."""
    _check_table(table)
    try:
        return int(con.execute("SELECT coalesce(sum(rows), 0) FROM archive_parts WHERE tbl = ?",
                               [table]).fetchall()[0][0])
    except duckdb.CatalogException:
        return 0


def trim_rollup(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """Delete production rollup rows before :func:`rollup_floor` that an ingest recomputed
    (rows arriving late for a day whose rollup was already dropped): the rollup never holds
    buckets before its floor."""
    floor = rollup_floor(con, table)
    if floor is not None:
        for rollup in (ARCHIVED[table][2], *DROPPED_WITH.get(table, ())):
            if rollup is None:
                continue
            con.execute(f"DELETE FROM {rollup} WHERE run_id = '' AND bucket_start_s < ?",
                        [floor]).fetchall()


# ---------------------------------------------------------------------------------------------
# Object storage
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RemoteOptions:
    """DuckDB secret settings for an ``s3://``-style archive (``[retention]`` ``s3_*`` keys;
    key id and secret from ``PREFIXSCOPE_S3_KEY_ID`` / ``PREFIXSCOPE_S3_SECRET``, else
    DuckDB's ``credential_chain`` provider: AWS environment variables, config files, instance
    roles)."""

    region: str | None = None
    endpoint: str | None = None
    url_style: str | None = None
    use_ssl: bool = True
    extension_directory: str | None = None
    extension_repository: str | None = None
    key_id: str | None = None
    secret: str | None = None


def remote_options_from_env(**config: object) -> RemoteOptions:
    """:class:`RemoteOptions` from the ``[retention]`` values given and the environment."""
    return RemoteOptions(
        region=config.get("s3_region") or os.environ.get("PREFIXSCOPE_S3_REGION"),  # type: ignore[arg-type]
        endpoint=config.get("s3_endpoint") or os.environ.get("PREFIXSCOPE_S3_ENDPOINT"),  # type: ignore[arg-type]
        url_style=config.get("s3_url_style") or None,  # type: ignore[arg-type]
        use_ssl=bool(config.get("s3_use_ssl", True)),
        extension_directory=config.get("extension_directory") or None,  # type: ignore[arg-type]
        extension_repository=config.get("extension_repository") or None,  # type: ignore[arg-type]
        key_id=os.environ.get("PREFIXSCOPE_S3_KEY_ID"),
        secret=os.environ.get("PREFIXSCOPE_S3_SECRET"))


def secret_sql(location: str, opts: RemoteOptions) -> str | None:
    """The ``CREATE OR REPLACE TEMPORARY SECRET`` statement for ``location`` (None for
    ``http(s)://``, which needs none). S3-compatible schemes (``s3``, ``r2``, ``gs`` through
    its S3 interoperability API) get ``TYPE s3`` / ``r2`` / ``gcs``; with a key id and secret
    ``PROVIDER config`` (values quoted), without them ``PROVIDER credential_chain``. The
    secret is scoped to the archive's bucket."""
    low = location.lower()
    if low.startswith(("http://", "https://")):
        return None
    kind = "r2" if low.startswith("r2://") else "gcs" if low.startswith(("gs://", "gcs://")) else "s3"
    scheme, _, rest = location.partition("://")
    bucket = rest.split("/", 1)[0]
    parts = [f"TYPE {kind}"]
    if opts.key_id and opts.secret:
        parts += ["PROVIDER config", f"KEY_ID {_lit(opts.key_id)}", f"SECRET {_lit(opts.secret)}"]
    else:
        parts.append("PROVIDER credential_chain")
    if opts.region:
        parts.append(f"REGION {_lit(opts.region)}")
    if opts.endpoint:
        parts.append(f"ENDPOINT {_lit(opts.endpoint)}")
    if opts.url_style:
        parts.append(f"URL_STYLE {_lit(opts.url_style)}")
    if not opts.use_ssl:
        parts.append("USE_SSL false")
    parts.append(f"SCOPE {_lit(f'{scheme}://{bucket}')}")
    return "CREATE OR REPLACE TEMPORARY SECRET prefixscope_archive (" + ", ".join(parts) + ")"


def ensure_remote(con: duckdb.DuckDBPyConnection, location: str,
                  opts: RemoteOptions | None = None) -> None:
    """Load DuckDB's httpfs extension (installing it when missing) and create the archive's
    secret on ``con``, once per connection.

    Raises:
        SourceUnavailable: httpfs is not installed and cannot be downloaded (no network to
            DuckDB's extension repository: the message says how to install it by hand), or
            the secret is refused.
    """
    try:
        if con.execute("SELECT getvariable('prefixscope_remote_ready')").fetchall()[0][0]:
            return
    except duckdb.Error:
        pass
    if opts is None:
        from prefixscope.core.config import load_settings

        r = load_settings().retention
        opts = remote_options_from_env(s3_region=r.s3_region, s3_endpoint=r.s3_endpoint,
                                       s3_url_style=r.s3_url_style, s3_use_ssl=r.s3_use_ssl,
                                       extension_directory=r.extension_directory,
                                       extension_repository=r.extension_repository)
    version = duckdb.__version__
    try:
        if opts.extension_directory:
            con.execute(f"SET extension_directory = {_lit(opts.extension_directory)}")
        try:
            con.execute("LOAD httpfs")
        except duckdb.Error:
            con.execute("INSTALL httpfs" + (f" FROM {_lit(opts.extension_repository)}"
                                            if opts.extension_repository else ""))
            con.execute("LOAD httpfs")
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SourceUnavailable(
            f"archive {location}: DuckDB's httpfs extension is needed for object storage and "
            f"could not be installed ({first}). Without network access to DuckDB's extension "
            f"repository, copy httpfs.duckdb_extension for DuckDB v{version} into "
            "[retention] extension_directory (or ~/.duckdb/extensions/v" + version
            + "/<platform>/), point [retention] extension_repository at a mirror, or archive "
            "to a local folder") from None
    sql = secret_sql(location, opts)
    try:
        if sql:
            con.execute(sql)
        con.execute("SET VARIABLE prefixscope_remote_ready = true")
    except duckdb.Error as exc:
        raise SourceUnavailable(f"archive {location}: the storage secret was refused: "
                                f"{str(exc).splitlines()[0]}") from None


# ---------------------------------------------------------------------------------------------
# Archiving
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArchivedDay:
    """One (table, UTC day) that was (or, with a dry run, would be) archived."""

    table: str
    day: str            # YYYY-MM-DD (UTC)
    gen: int            # 0 first; later generations hold rows that arrived after
    rows: int
    files: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """JSON form (``prefixscope archive --json`` ``days``)."""
        return {"table": self.table, "day": self.day, "gen": self.gen, "rows": self.rows,
                "files": list(self.files)}


def day_floor(ts_unix_s: float) -> float:
    """Start of the UTC day holding ``ts_unix_s``."""
    return math.floor(float(ts_unix_s) / DAY_S) * DAY_S


def plan_days(con: duckdb.DuckDBPyConnection, before_s: float,
              cutoffs: dict[str, float] | None = None) -> list[ArchivedDay]:
    """The (table, day) pairs with production rows in whole UTC days before ``before_s``
    (rounded down to a day start; ``cutoffs``: another time for some tables, e.g.
    ``gateway_decisions`` from ``[retention] decision_days``), oldest first per table, with
    their row counts (gen as it would be written)."""
    out: list[ArchivedDay] = []
    for table in ARCHIVED:
        cutoff = day_floor((cutoffs or {}).get(table, before_s))
        rows = con.execute(
            f"SELECT floor(ts_unix_s / 86400) * 86400 AS d, count(*) FROM {table} "
            "WHERE run_id = '' AND ts_unix_s < ? GROUP BY d ORDER BY d", [cutoff]).fetchall()
        for d, n in rows:
            out.append(ArchivedDay(table, _day_text(d), _next_gen(con, table, d), int(n)))
    return out


def _day_text(day_start_s: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day_start_s))



def _table_folder(root: str, table: str) -> str:
    """``<root>/<table>``, the folder one table's Parquet files go to, made when it is local.

    Raises:
        SourceUnavailable: the local folder cannot be made (its reason).
    """
    target = f"{root}/{table}"
    if not is_remote(target):
        try:
            Path(target).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SourceUnavailable(f"cannot write the archive at {target}: "
                                    f"{exc.strerror or exc}") from None
    return target

def _next_gen(con: duckdb.DuckDBPyConnection, table: str, day_start_s: float) -> int:
    row = con.execute("SELECT coalesce(max(gen) + 1, 0) FROM archive_parts WHERE tbl = ? "
                      "AND day = ?::DATE", [table, _day_text(day_start_s)]).fetchall()[0]
    return int(row[0])


def prepare_target(location: str, opts: RemoteOptions | None = None,
                   con: duckdb.DuckDBPyConnection | None = None) -> str:
    """Check that the archive root can be written (create a local folder; load httpfs for a
    remote one) and return it without a trailing ``/``.

    Raises:
        SourceUnavailable: the folder cannot be created or written (named), or httpfs is
            missing for a remote root.
    """
    root = location.rstrip("/") or location
    if is_remote(root):
        if con is not None:
            ensure_remote(con, root, opts)
        return root
    p = Path(root)
    for q in (p, *p.parents):  # a file in the way: say so (mkdir says "File exists")
        if q.exists() and not q.is_dir():
            if q == p:
                raise SourceUnavailable(f"{root} is a file, not a folder: --to (or [retention] "
                                        "archive) names the archive folder")
            raise SourceUnavailable(f"cannot write the archive at {root}: {q} is a file, "
                                    "not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".prefixscope-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SourceUnavailable(f"cannot write the archive at {root}: "
                                f"{exc.strerror or exc}") from None
    return str(p.absolute())  # absolute: archive_parts' files read from any working folder


def recorded_roots(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The archive roots ``archive_parts`` records for this database (oldest first; one
    normally: ``docs/retention.md`` asks for one root per database)."""
    rows = con.execute("SELECT location, min(archived_unix_s) FROM archive_parts "
                       "GROUP BY location ORDER BY 2, 1").fetchall()
    return [r[0] for r in rows]


def same_root(a: str, b: str) -> bool:
    """True when two archive locations name the same root (folders compared as real absolute
    paths, relative ones from the working folder; remote ones without a trailing ``/``)."""
    if is_remote(a) or is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def archive_day(con: duckdb.DuckDBPyConnection, table: str, day_start_s: float,
                root: str) -> ArchivedDay | None:
    """Archive the production rows of ``table`` in the UTC day starting at ``day_start_s``
    to ``root`` (from :func:`prepare_target`), verify them, then delete them: one day, files
    named ``<table>-<day>-g<gen>-<i>.parquet``, verified by reading them back (the path of
    ``prefixscope archive`` before :func:`archive_range`; the baseline of
    ``benchmarks/archive_scale.py``).

    Order (crash-safe, idempotent): (1) COPY the rows to
    ``<root>/<table>/day=.../model=.../<table>-<day>-g<gen>-{i}.parquet`` (the same names on
    a re-run: overwritten); (2) read the returned files back and compare the row count per
    model; (3) one transaction: insert the ``archive_parts`` row listing the files and delete
    the rows. ``con`` must hold the write lock throughout (one :func:`prefixscope.store.db.
    writer`), so no row of the day arrives between (1) and (3).

    Returns:
        What was archived, or None when the day has no production rows.

    Raises:
        SourceUnavailable: writing failed, or the files read back differ (nothing deleted).
    """
    _check_table(table)
    ts_col, exclude, rollup, counted = ARCHIVED[table]
    d0, d1 = float(day_start_s), float(day_start_s) + DAY_S
    day = _day_text(d0)
    where = f"run_id = '' AND {ts_col} >= {d0!r} AND {ts_col} < {d1!r}"
    expected = dict(con.execute(
        f"SELECT coalesce(model, '\x00'), count(*) FROM {table} WHERE {where} GROUP BY ALL"
    ).fetchall())
    if not expected:
        return None
    rows = sum(expected.values())
    rollup_rows = con.execute(f"SELECT count(*) FROM {table} WHERE {where} AND {counted}"
                              ).fetchall()[0][0]
    gen = _next_gen(con, table, d0)
    excl = f" EXCLUDE ({', '.join(exclude)})" if exclude else ""
    target = _table_folder(root, table)
    try:
        n, files = con.execute(
            f"COPY (SELECT *{excl}, DATE {_lit(day)} AS day, {gen} AS archive_gen FROM {table} "
            f"WHERE {where} ORDER BY {ts_col}) TO {_lit(target)} (FORMAT parquet, "
            "PARTITION_BY (day, model), WRITE_PARTITION_COLUMNS true, OVERWRITE_OR_IGNORE, "
            f"FILENAME_PATTERN {_lit(f'{table}-{day}-g{gen}-{{i}}')}, RETURN_FILES)"
        ).fetchall()[0]
    except duckdb.Error as exc:
        raise SourceUnavailable(f"cannot write the archive at {target}: "
                                f"{str(exc).splitlines()[0]}") from None
    files = sorted(str(f) for f in files)
    try:
        got = dict(con.execute(
            "SELECT coalesce(model, '\x00'), count(*) FROM read_parquet(?, hive_partitioning = "
            "false) WHERE day = ?::DATE AND archive_gen = ? GROUP BY ALL", [files, day, gen]
        ).fetchall())
    except duckdb.Error as exc:
        raise SourceUnavailable(f"archive of {table} {day}: reading the written files back "
                                f"failed, nothing deleted: {str(exc).splitlines()[0]}") from None
    if int(n) != rows or got != expected:
        raise SourceUnavailable(
            f"archive of {table} {day}: wrote {n} rows, read back {sum(got.values())}, expected "
            f"{rows}; nothing deleted")
    floor = rollup_floor(con, table)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("INSERT INTO archive_parts VALUES (?, ?::DATE, ?, ?, ?, ?, ?, ?, ?)",
                    [table, day, gen, root, rows, int(rollup_rows), files, time.time(),
                     floor is not None and d1 <= floor]).fetchall()
        deleted = con.execute(f"DELETE FROM {table} WHERE {where}").fetchall()[0][0]
        if int(deleted) != rows:
            raise SourceUnavailable(f"archive of {table} {day}: {deleted} rows to delete, "
                                    f"{rows} archived; nothing deleted")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return ArchivedDay(table, day, gen, rows, tuple(files))


def plan_chunks(plan: Sequence[ArchivedDay], max_rows: int | None = None
                ) -> list[tuple[str, float, float, int]]:
    """Group the days of :func:`plan_days` into runs of whole consecutive days of one table
    holding at most ``max_rows`` rows (default :data:`CHUNK_ROWS`; a larger day alone), each
    archived under one write lock by :func:`archive_range`.

    Returns:
        ``(table, start_s, end_s, rows)`` per chunk, ``[start_s, end_s)`` whole UTC days,
        in the plan's order.
    """
    limit = CHUNK_ROWS if max_rows is None else int(max_rows)
    out: list[tuple[str, float, float, int]] = []
    for item in plan:
        d0 = _day_start(item.day)
        if out and out[-1][0] == item.table and out[-1][3] + item.rows <= limit:
            t, lo, _, n = out[-1]
            out[-1] = (t, lo, d0 + DAY_S, n + item.rows)
        else:
            out.append((item.table, d0, d0 + DAY_S, item.rows))
    return out


def _day_start(day: str) -> float:
    return float(calendar.timegm(time.strptime(day, "%Y-%m-%d")))


_PART_DIRS = re.compile(r"/day=([^/]+)/model=([^/]+)/[^/]+$")


def _file_key(path: str) -> tuple[str, str]:
    """``(day, model or NUL)`` of an archive file from its hive folders."""
    m = _PART_DIRS.search(path.replace("\\", "/"))
    if not m:
        raise SourceUnavailable(f"archive file {path}: not under day=/model= folders")
    model = unquote(m.group(2))
    return unquote(m.group(1)), "\x00" if model == "__HIVE_DEFAULT_PARTITION__" else model


def archive_range(con: duckdb.DuckDBPyConnection, table: str, start_s: float, end_s: float,
                  root: str) -> list[ArchivedDay]:
    """Archive the production rows of ``table`` in the whole UTC days of ``[start_s,
    end_s)`` to ``root`` (from :func:`prepare_target`), verify them, then delete them: the
    fast path of ``prefixscope archive`` (one COPY for all the days, :func:`archive_day` does
    one day with a full read-back).

    Order (crash-safe, idempotent): (1) one ``COPY ... PARTITION_BY (day, model)`` per
    generation (rows in the table's order, no sort: sorting by time doubled the COPY's time) (``<root>/<table>/day=.../model=.../<table>-g<gen>-<i>.parquet``: the same names
    on a re-run, overwritten; a day's next generation gets new names); (2) the row count of
    every written file from its Parquet footer (``parquet_file_metadata``), per day and model
    (from the file's folders) compared with the table's; (3) one transaction: an
    ``archive_parts`` row per day listing its files, and one DELETE of the range, which must
    delete exactly the rows written. ``con`` must hold the write lock throughout (no row of
    the range arrives between (1) and (3)). A crash before (3) commits deletes nothing and lists
    nothing (the files are never read and the next run rewrites them); after it the days are
    done.

    Returns:
        What was archived, one item per day (oldest first); empty when the range has no
        production rows.

    Raises:
        SourceUnavailable: writing failed, or the counts differ (nothing deleted).
    """
    _check_table(table)
    ts_col, exclude, _, counted = ARCHIVED[table]
    d0, d1 = day_floor(start_s), day_floor(end_s)
    where = f"run_id = '' AND {ts_col} >= {d0!r} AND {ts_col} < {d1!r}"
    day_sql = f"floor({ts_col} / 86400) * 86400"
    rows = con.execute(
        f"SELECT {day_sql} AS d, coalesce(model, '\x00'), count(*), count(*) FILTER "
        f"(WHERE {counted}) FROM {table} WHERE {where} GROUP BY ALL ORDER BY d").fetchall()
    if not rows:
        return []
    expected = {(_day_text(d), m): int(n) for d, m, n, _ in rows}
    per_day: dict[str, list[int]] = {}
    for d, _, n, r in rows:
        acc = per_day.setdefault(_day_text(d), [0, 0])
        acc[0] += int(n)
        acc[1] += int(r)
    gens = dict(con.execute(
        "SELECT day::VARCHAR, max(gen) + 1 FROM archive_parts WHERE tbl = ? AND day >= ?::DATE "
        "AND day < ?::DATE GROUP BY ALL", [table, _day_text(d0), _day_text(d1)]).fetchall())
    gen_of = {day: int(gens.get(day, 0)) for day in per_day}
    excl = f" EXCLUDE ({', '.join(exclude)})" if exclude else ""
    target = _table_folder(root, table)
    written = 0
    files: list[str] = []
    for gen in sorted(set(gen_of.values())):
        days = [d for d, g in gen_of.items() if g == gen]
        only = ("" if len(days) == len(gen_of) else
                f" AND {day_sql} IN ({', '.join(repr(_day_start(d)) for d in days)})")
        try:
            n, fs = con.execute(
                f"COPY (SELECT *{excl}, DATE '1970-01-01' + CAST({day_sql} / 86400 AS INTEGER) "
                f"AS day, {gen} AS archive_gen FROM {table} WHERE {where}{only}) "
                f"TO {_lit(target)} (FORMAT parquet, PARTITION_BY (day, model), "
                "WRITE_PARTITION_COLUMNS true, OVERWRITE_OR_IGNORE, "
                f"FILENAME_PATTERN {_lit(f'{table}-g{gen}-{{i}}')}, RETURN_FILES)"
            ).fetchall()[0]
        except duckdb.Error as exc:
            raise SourceUnavailable(f"cannot write the archive at {target}: "
                                    f"{str(exc).splitlines()[0]}") from None
        written += int(n)
        files += [str(f) for f in fs]
    files.sort()
    first, last = _day_text(d0), _day_text(d1 - DAY_S)
    try:
        counts = con.execute("SELECT file_name, num_rows FROM parquet_file_metadata(?)",
                             [files]).fetchall()
    except duckdb.Error as exc:
        raise SourceUnavailable(f"archive of {table} {first}..{last}: reading the written "
                                f"files' footers failed, nothing deleted: "
                                f"{str(exc).splitlines()[0]}") from None
    got: dict[tuple[str, str], int] = {}
    for f, n in counts:
        key = _file_key(str(f))
        got[key] = got.get(key, 0) + int(n)
    total = sum(expected.values())
    if written != total or got != expected or len(counts) != len(files):
        raise SourceUnavailable(
            f"archive of {table} {first}..{last}: wrote {written} rows, the files hold "
            f"{sum(got.values())}, expected {total}; nothing deleted")
    floor = rollup_floor(con, table)
    by_day: dict[str, list[str]] = {}
    for f in files:
        by_day.setdefault(_file_key(f)[0], []).append(f)
    out = [ArchivedDay(table, day, gen_of[day], n, tuple(by_day[day]))
           for day, (n, _) in per_day.items()]
    now = time.time()
    con.execute("BEGIN TRANSACTION")
    try:
        con.executemany("INSERT INTO archive_parts VALUES (?, ?::DATE, ?, ?, ?, ?, ?, ?, ?)",
                        [[table, a.day, a.gen, root, a.rows, per_day[a.day][1], list(a.files),
                          now, floor is not None and _day_start(a.day) + DAY_S <= floor]
                         for a in out])
        deleted = con.execute(f"DELETE FROM {table} WHERE {where}").fetchall()[0][0]
        if int(deleted) != total:
            raise SourceUnavailable(f"archive of {table} {first}..{last}: {deleted} rows to "
                                    f"delete, {total} archived; nothing deleted")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return out


def drop_rollups(con: duckdb.DuckDBPyConnection, before_s: float) -> dict[str, int]:
    """Delete the production rollup rows before ``before_s`` (rounded down to a UTC day) whose
    raw rows are all archived: the cutoff stops at the oldest production row still in the
    table, so a rollup is never dropped for rows only the table holds. Marks the archived
    days below the cutoff ``rollup_dropped``. One transaction per table.

    Returns:
        ``{rollup table: rows deleted}``.
    """
    out: dict[str, int] = {}
    for table, (ts_col, _, rollup, _) in ARCHIVED.items():
        if rollup is None:
            continue
        oldest = con.execute(f"SELECT min({ts_col}) FROM {table} WHERE run_id = ''").fetchall()[0][0]
        cutoff = day_floor(before_s)
        if oldest is not None:
            cutoff = min(cutoff, day_floor(oldest))
        con.execute("BEGIN TRANSACTION")
        try:
            n = con.execute(f"DELETE FROM {rollup} WHERE run_id = '' AND bucket_start_s < ?",
                            [cutoff]).fetchall()[0][0]
            for extra in DROPPED_WITH.get(table, ()):
                con.execute(f"DELETE FROM {extra} WHERE run_id = '' AND bucket_start_s < ?",
                            [cutoff]).fetchall()
            con.execute("UPDATE archive_parts SET rollup_dropped = TRUE WHERE tbl = ? AND "
                        "epoch(day::TIMESTAMP) + 86400 <= ? AND NOT rollup_dropped",
                        [table, cutoff]).fetchall()
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        out[rollup] = int(n)
    return out


def archive_summary(con: duckdb.DuckDBPyConnection) -> dict[str, dict]:
    """Per archived table: days, parts, rows and the oldest/newest day in the archive."""
    rows = con.execute("SELECT tbl, count(DISTINCT day), count(*), sum(rows), min(day)::VARCHAR,"
                       " max(day)::VARCHAR FROM archive_parts GROUP BY tbl ORDER BY tbl"
                       ).fetchall()
    return {t: {"days": int(d), "parts": int(p), "rows": int(r), "oldest_day": lo,
                "newest_day": hi} for t, d, p, r, lo, hi in rows}
