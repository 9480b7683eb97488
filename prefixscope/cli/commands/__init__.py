"""CLI commands, one module per subject. Each module defines ``register(groups)`` where
``groups`` maps ``app``, ``ingest``, ``replay``, ``report`` and ``db`` to their Typer apps."""
