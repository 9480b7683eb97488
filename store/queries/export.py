"""``prefixscope export``: store tables to CSV or Parquet files with DuckDB ``COPY``.

What can be exported (:data:`EXPORTS`): ``requests`` (every column but the internal
``request_key``), ``hitrate`` (token-weighted hit-rate windows from the counters,
:func:`prefixscope.store.queries.metrics.hit_rate_by_window`), ``breakers`` (with their
diagnosis' run, model and time) and ``runs``. The rows are written by DuckDB itself
(``COPY (SELECT ...) TO ...``), streamed from the store: nothing passes through pandas except
the hit-rate windows, which are already aggregated (one row per window and group).

Layout: ``OUT/<name>.csv`` or ``OUT/<name>.parquet``; with ``by_day``, a hive-partitioned folder
``OUT/<name>/day=YYYY-MM-DD/data_0.<ext>`` (``day`` = the UTC day of the row's time column; rows
without a time go to ``day=__HIVE_DEFAULT_PARTITION__``, DuckDB's name for NULL), which DuckDB,
pandas/pyarrow, Spark and Polars read back as one table with a ``day`` column.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from prefixscope.core.errors import InvalidArgument
from prefixscope.core.formatting import FORMULA_STARTS, NEGATIVE_NUMBER

FORMATS = ("csv", "parquet")


@dataclass(frozen=True, slots=True)
class ExportSpec:
    """One exportable table: its SELECT (``{where}`` placeholder), the time column for ``day``
    and the filters it takes."""

    select: str
    time_column: str | None
    filters: tuple[str, ...]


_REQUEST_COLUMNS = (
    "run_id, request_id, source_id, line, ts_unix_s, ts_estimated, model, instance, endpoint, "
    "usage_shape, provider, prompt_tokens, cached_tokens, cache_write_tokens, "
    "cache_write_1h_tokens, completion_tokens, ttft_ms, latency_ms, scope, tenant_digest, flags")

EXPORTS: dict[str, ExportSpec] = {
    "requests": ExportSpec(
        f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE {{where}}", "ts_unix_s",
        ("time", "model", "instance", "run")),
    "runs": ExportSpec("SELECT * FROM runs WHERE {where}", "created_unix_s", ("time",)),
    "breakers": ExportSpec(
        "SELECT d.run_id, d.model, d.created_unix_s, b.* EXCLUDE (diagnosis_id), "
        "b.diagnosis_id FROM breakers b JOIN diagnoses d USING (diagnosis_id) WHERE {where}",
        "created_unix_s", ("time", "model", "run")),
    "hitrate": ExportSpec("SELECT * FROM _prefixscope_export_hitrate WHERE {where}",
                          "window_start_s", ()),
}


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What :func:`export_table` wrote: ``name``, ``rows``, ``path`` (file or folder), ``files``
    (every file written, sorted), ``format``, ``by_day``."""

    name: str
    rows: int
    path: str
    files: list[str]
    format: str
    by_day: bool

    def as_dict(self) -> dict:
        return {"table": self.name, "rows": self.rows, "path": self.path, "files": self.files,
                "format": self.format, "by_day": self.by_day}


def _formula_safe(con: duckdb.DuckDBPyConnection, select: str, params: list) -> str:
    """``select`` with every text column as :func:`prefixscope.core.formatting.csv_cell` writes
    it (a leading apostrophe before a cell a spreadsheet would run as a formula)."""
    cols = con.execute(f"SELECT * FROM ({select}) LIMIT 0", params).description
    text = [_ident(name) for name, typ, *_ in cols if str(typ) == "VARCHAR"]
    if not text:
        return select
    starts = ", ".join(f"chr({ord(c)})" for c in FORMULA_STARTS)
    number = "'" + NEGATIVE_NUMBER.replace("'", "''") + "'"
    repl = ", ".join(f"CASE WHEN left({c}, 1) IN ({starts}) AND NOT regexp_full_match({c}, "
                     f"{number}) THEN chr(39) || {c} ELSE {c} END AS {c}" for c in text)
    return f"SELECT * REPLACE ({repl}) FROM ({select})"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"


def export_table(con: duckdb.DuckDBPyConnection, name: str, out_dir: str | os.PathLike[str], *,
                 fmt: str = "parquet", by_day: bool = False, start_s: float | None = None,
                 end_s: float | None = None, models: Sequence[str] | None = None,
                 instances: Sequence[str] | None = None, run_ids: Sequence[str] | None = None,
                 window_s: float = 3600.0, overwrite: bool = False) -> ExportResult:
    """Write one table to ``out_dir`` (layout in the module docstring) with DuckDB ``COPY``.

    Args:
        con: a connection (read-only is enough: ``COPY ... TO`` writes files, not the store).
        name: a key of :data:`EXPORTS`.
        fmt: ``csv`` (header row) or ``parquet`` (zstd).
        by_day: hive-partition by the UTC day of the table's time column.
        start_s, end_s: rows whose time column is in [start_s, end_s) (Unix s).
        models, instances, run_ids: filters where the table has the column.
        window_s: ``hitrate`` window length in seconds.
        overwrite: replace an existing file or folder of the same name.

    Returns:
        An :class:`ExportResult`.

    Raises:
        InvalidArgument: unknown table or format, a filter the table does not have, or the
            output exists without ``overwrite``, or ``out_dir`` is not a folder that can be
            written into.
    """
    if name not in EXPORTS:
        raise InvalidArgument(f"unknown export {name!r}: choose from {', '.join(EXPORTS)}")
    if fmt not in FORMATS:
        raise InvalidArgument(f"format must be csv or parquet, not {fmt!r}")
    spec = EXPORTS[name]
    where, params = ["TRUE"], []
    tcol = spec.time_column
    if start_s is not None or end_s is not None:
        if "time" not in spec.filters and name != "hitrate":
            raise InvalidArgument(f"{name} has no time column to filter on")
        if name != "hitrate":
            col = f"d.{tcol}" if name == "breakers" else tcol
            where.append(f"{col} >= coalesce(?, -1e300) AND {col} < coalesce(?, 1e300)")
            params += [start_s, end_s]
    for key, col, vals in (("model", "model", models), ("instance", "instance", instances),
                           ("run", "run_id", run_ids)):
        if vals is None or name == "hitrate":
            continue
        if key not in spec.filters:
            raise InvalidArgument(f"{name} cannot be filtered by {key}")
        where.append(f"{'d.' if name == 'breakers' else ''}{col} IN (SELECT unnest(?))")
        params.append(list(vals))
    select = spec.select.format(where=" AND ".join(where))
    if name == "requests":  # the archived days the range reaches too (docs/retention.md)
        from prefixscope.store.queries import archive

        select = select.replace(" FROM requests WHERE ",
                                f" FROM {archive.relation(con, 'requests', start_s, end_s)} "
                                "WHERE ", 1)
    if name == "hitrate":
        from prefixscope.store.queries.metrics import hit_rate_by_window

        df = hit_rate_by_window(con, start_s=start_s, end_s=end_s, window_s=window_s,
                                models=models, instances=instances,
                                run_ids=run_ids if run_ids is not None else [""])
        con.register("_prefixscope_export_hitrate", df)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"cannot export into {out}: it exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgument(f"cannot export into {out}: {exc.strerror or exc}") from None
    target = out / (name if by_day else f"{name}.{fmt}")
    if target.exists():
        if not overwrite:
            raise InvalidArgument(f"{target} exists: remove it or pass --overwrite")
        if target.is_dir():
            import shutil

            shutil.rmtree(target)
        else:
            target.unlink()
    options = ["FORMAT csv, HEADER true"] if fmt == "csv" else ["FORMAT parquet, COMPRESSION zstd"]
    if fmt == "csv":
        select = _formula_safe(con, select, params)
    if by_day:
        select = (f"SELECT *, strftime(to_timestamp({tcol}) AT TIME ZONE 'UTC', '%Y-%m-%d') "
                  f"AS day FROM ({select})")
        options.append("PARTITION_BY (day)")
    try:
        n = con.execute(f"SELECT count(*) FROM ({select})", params).fetchone()[0]
        try:
            con.execute(f"COPY ({select}) TO {_quote(str(target))} ({', '.join(options)})",
                        params)
        except duckdb.IOException as exc:  # a folder we may not write into (/sys, read-only)
            raise InvalidArgument(f"cannot export into {out}: {exc}") from None
    finally:
        if name == "hitrate":
            con.unregister("_prefixscope_export_hitrate")
    files = sorted(str(p) for p in ([target] if target.is_file() else target.rglob("*.*")))
    return ExportResult(name, int(n), str(target), files, fmt, by_day)
