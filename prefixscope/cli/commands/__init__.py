"""CLI commands, one module per subject. Each command is a module-level function (call it
directly, e.g. ``db.info_cmd(db="x.duckdb", as_json=True)``); each module's ``register(groups)``
adds them to ``groups``, which maps ``app``, ``ingest``, ``replay``, ``report`` and ``db`` to
their Typer apps. Shared option declarations: :mod:`prefixscope.cli.options`."""
