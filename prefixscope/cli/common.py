"""Options and output helpers shared by every CLI command (see ``prefixscope.cli``)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

from prefixscope.core.config import DEFAULT_DB_PATH

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="PREFIXSCOPE_DB",
        help="DuckDB file (env PREFIXSCOPE_DB).",
        show_default=True,
    ),
]
DB_DEFAULT = DEFAULT_DB_PATH

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def count_noun(n: int, noun: str) -> str:
    """``1 line``, ``2 lines``, ``500,000 requests``: thousands separators, singular for 1."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def print_json(value: Any) -> None:
    """Print ``value`` as JSON on stdout (no colour, one document), for ``--json``."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()
