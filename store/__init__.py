"""The DuckDB store: schema and migrations (``store.schema``), connections and the locking
protocol (``store.db``), and every query as a named, typed function (``store.queries``).

No SQL lives outside this package.
"""
