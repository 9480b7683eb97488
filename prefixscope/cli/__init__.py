"""The top layer: the ``prefixscope`` command (``main``, ``run``, ``app``), its subcommands and
the demo.

``main`` is the console script. ``prefixscope --version`` is answered here, before the command
modules (and through them duckdb, pandas, pydantic) are imported: it prints as fast as the
interpreter starts (issue 30 item 6; ``benchmarks/cli_start.py``). ``app`` and ``run`` are
:mod:`prefixscope.cli.root`'s (the Typer app), imported on first use.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["app", "main", "run"]


def main() -> None:
    """Console-script entry point: ``sys.exit(run())``, with ``--version`` answered first."""
    if sys.argv[1:] == ["--version"]:
        from prefixscope import __version__

        sys.stdout.write(f"prefixscope {__version__}\n")
        sys.exit(0)
    sys.exit(__getattr__("run")())


def __getattr__(name: str) -> Any:
    """``app`` and ``run`` from :mod:`prefixscope.cli.root`, imported on first use."""
    if name not in ("app", "run"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("prefixscope.cli.root"), name)
