"""``prefixscope db``: migrate and inspect the DuckDB file."""

from __future__ import annotations

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, out, print_json
from prefixscope.store import db as store_db


def migrate_cmd(db: DbOption = DB_DEFAULT) -> None:
    """Create the database or apply pending schema migrations.

    Example: prefixscope db migrate --db data/prefixscope.duckdb
    """
    with store_db.writer(db) as con:
        version = store_db.schema_version(con)
    out.print(f"{db}: schema migrations {version}")


def info_cmd(db: DbOption = DB_DEFAULT, as_json: JsonOption = False) -> None:
    """Show schema migrations and row counts per table.

    Example: prefixscope db info --json
    """
    from prefixscope.store.queries.ingest import table_row_counts

    with store_db.reader(db) as con:
        version = store_db.schema_version(con)
        counts = table_row_counts(con)
    if as_json:
        print_json({"db": db, "migrations": version, "tables": counts})
        return
    out.print(f"{db}: schema migrations {version}")
    for table, n in counts.items():
        out.print(f"  {table:<24} {n:>12,}")


def rebuild_rollups_cmd(
        db: DbOption = DB_DEFAULT,
        only_stale: bool = typer.Option(False, "--only-stale",
                                        help="Rebuild only the rollups the pages do not read "
                                             "today (they read the raw rows instead)."),
        as_json: JsonOption = False) -> None:
    """Rebuild the rollup tables from the stored rows (and archived days), in one transaction.

    The ingest keeps the rollups current; rows written with SQL, or a database migrated with
    archived days, can leave one stale: the pages then read the raw rows (the same numbers,
    slower). ``db info`` is unchanged; this command says which rollups were stale.

    Example: prefixscope db rebuild-rollups --db data/prefixscope.duckdb --json
    """
    from prefixscope.store.queries.maintenance import rebuild_rollups

    with store_db.writer(db) as con:
        states = rebuild_rollups(con, only_stale=only_stale)
    if as_json:
        print_json({"db": db, "rollups": [
            {"table": s.table, "current_before": s.current_before,
             "current_after": s.current_after, "rows_written": s.rows} for s in states]})
        return
    for s in states:
        done = "kept (current)" if s.rows is None else f"rebuilt: {s.rows:,} rows"
        was = "" if s.current_before else " (was stale: pages read the raw rows)"
        out.print(f"  {s.table:<20} {done}{was}", markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``db migrate``, ``db info`` and ``db rebuild-rollups``."""
    groups["db"].command("migrate")(migrate_cmd)
    groups["db"].command("info")(info_cmd)
    groups["db"].command("rebuild-rollups")(rebuild_rollups_cmd)
