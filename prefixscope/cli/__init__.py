"""The top layer: the ``prefixscope`` command (``main``, ``run``), its subcommands and the demo."""

from prefixscope.cli.main import app, main, run

__all__ = ["app", "main", "run"]
