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

    out.print(f"building the demo database {db} (CPU-bound: about "
              "1 minute on a quiet 2-core machine, 6-7 on a busy one)",
              markup=False, highlight=False)
    report = build_demo(db, with_replay=not no_replay,
                        progress=lambda line: out.print(f"  {line}", markup=False,
                                                        highlight=False))
    out.print(f"demo database ready: {report.db_path} ({report.seconds:.1f} s)")
    out.print(f"open the dashboard: {command_name()} dashboard --db " + report.db_path,
              markup=False, highlight=False)


def command_name() -> str:
    """How to type ``prefixscope`` from here: the bare name when the PATH finds this very
    executable, else its path (``.venv/bin/prefixscope`` under the current directory, else
    absolute), so the printed hint works when the venv is not activated."""
    import os
    import shutil
    import sys
    from pathlib import Path

    mine = Path(sys.executable).parent / "prefixscope"
    found = shutil.which("prefixscope")
    if not mine.exists() or (found is not None and Path(found).resolve() == mine.resolve()):
        return "prefixscope"
    try:
        return os.path.relpath(mine, Path.cwd()) if mine.is_relative_to(Path.cwd()) else str(mine)
    except ValueError:
        return str(mine)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add the ``demo`` command."""
    groups["app"].command("demo")(demo_cmd)
