"""prefixscope: observability, hit-rate analytics and replay for LLM prompt prefix caching.

Data flows one way: sources -> ``ingest`` -> DuckDB (``store``) -> ``dashboard`` and ``alerts``.
``replay`` writes the same per-request logs and metric expositions that production emits, and
they re-enter through ``ingest``. See ``docs/architecture.md``.
"""

__version__ = "0.1.0"
