"""``prefixscope export``: requests, hit-rate windows, breakers and runs as CSV or Parquet files
(hive-partitioned by day), for notebooks and other tools."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, out, print_json
from prefixscope.core.formatting import count_noun


def export_cmd(
    tables: Annotated[list[str], typer.Argument(
        help="What to export: requests, hitrate, breakers, runs (one or more).")],
    out_dir: Annotated[str, typer.Option("--out", help="Folder to write into.")] = "export",
    fmt: Annotated[str, typer.Option("--format", help="csv or parquet.")] = "parquet",
    by_day: Annotated[bool | None, typer.Option(
        "--by-day/--single-file", help="Hive-partition by UTC day (OUT/<table>/day=YYYY-MM-DD/); "
        "default: by day for parquet, one file for csv.")] = None,
    start: Annotated[str | None, typer.Option(
        "--start", help="Rows from this time: ISO 8601, Unix seconds, or -1d / -6h.")] = None,
    end: Annotated[str | None, typer.Option("--end", help="Rows before this time.")] = None,
    model: Annotated[list[str] | None, typer.Option("--model", help="Only this model (repeat).")] = None,
    instance: Annotated[list[str] | None, typer.Option(
        "--instance", help="Only this instance (repeat).")] = None,
    run: Annotated[list[str] | None, typer.Option(
        "--run", help="Only this run id (repeat; '' = production).")] = None,
    window: Annotated[str, typer.Option("--window", help="hitrate window, e.g. 5m, 1h, 1d.")] = "1h",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing output.")] = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Export store tables with DuckDB COPY: CSV (header row) or Parquet (zstd), optionally
    hive-partitioned by day so notebooks and other tools read them as one table.

    Rows stream from the store to the files (no per-request rows through Python). requests:
    every column but the internal key; hitrate: token-weighted hit-rate windows from the
    counters; breakers: each breaker with its diagnosis' run, model and time; runs: replay runs
    (docs/ingest.md#export).

    Examples:

      prefixscope export requests hitrate --out export/ --format parquet

      prefixscope export requests --format csv --start -7d --model gpt-4o --json
    """
    from prefixscope.core.errors import UsageError
    from prefixscope.core.times import parse_duration, parse_time
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.export import EXPORTS, export_table

    unknown = [t for t in tables if t not in EXPORTS]
    if unknown:
        raise UsageError(f"unknown table {unknown[0]!r}: choose from {', '.join(EXPORTS)}")
    if fmt not in ("csv", "parquet"):
        raise UsageError(f"--format must be csv or parquet, not {fmt!r}")
    start_s = parse_time(start) if start else None
    end_s = parse_time(end) if end else None
    window_s = parse_duration(window)
    results = []
    with store_db.reader(db) as con:
        for t in tables:
            results.append(export_table(
                con, t, out_dir, fmt=fmt, by_day=(fmt == "parquet") if by_day is None else by_day,
                start_s=start_s, end_s=end_s, models=model, instances=instance,
                run_ids=run, window_s=window_s, overwrite=overwrite))
    if as_json:
        print_json({"exports": [r.as_dict() for r in results]})
        return
    for r in results:
        where = f"{r.path} ({count_noun(len(r.files), 'file')})" if r.by_day else r.path
        out.print(f"{r.name}: {count_noun(r.rows, 'row')} -> {where}", markup=False,
                  highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``export``."""
    groups["app"].command("export")(export_cmd)
