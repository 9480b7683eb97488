"""Every query of prefixscope: one named, typed function per question, values bound as
parameters. Modules by subject: ``metrics`` (counters, hit rate windows), ``requests`` (usage,
per-request hit rate, coverage), ``savings`` (prices, cost), ``ingest`` (bookkeeping),
``replay`` (runs side by side), ``scopes`` (decisions, invariants), ``alerts`` (daily report, sends).

Functions take a DuckDB connection first and keyword-only filters; they return pandas
DataFrames (documented columns) or small typed records.
"""
