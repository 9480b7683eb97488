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


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``db migrate`` and ``db info``."""
    groups["db"].command("migrate")(migrate_cmd)
    groups["db"].command("info")(info_cmd)
