"""``prefixscope demo``: build the demo database from the bundled real data."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, out


def demo_cmd(
    db: DbOption = DB_DEFAULT,
    no_replay: Annotated[bool, typer.Option("--no-replay", help="Skip the replay and scope demos (faster).")] = False,
) -> None:
    """Build the demo database from the real vLLM captures, traces and chat logs in data/.

    Example: prefixscope demo --db data/prefixscope.duckdb && prefixscope dashboard
    """
    from prefixscope.cli.demo import build_demo

    out.print(f"building the demo database {db} (about 80 s of CPU: one to two minutes on a "
              "quiet 2-core machine)",
              markup=False, highlight=False)
    report = build_demo(db, with_replay=not no_replay,
                        progress=lambda line: out.print(f"  {line}", markup=False,
                                                        highlight=False))
    out.print(f"demo database ready: {report.db_path} ({report.seconds:.1f} s)")
    out.print("open the dashboard: prefixscope dashboard --db " + report.db_path)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add the ``demo`` command."""
    groups["app"].command("demo")(demo_cmd)
