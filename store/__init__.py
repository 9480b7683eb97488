"""The DuckDB store: schema and migrations (``prefixscope.store.schema``), connections and the locking
protocol (``prefixscope.store.db``), and every query as a named, typed function (``prefixscope.store.queries``).

No SQL lives outside this package.
"""
