"""Ingest: read sources and write them to the store.

Each source has a ``fetch_*`` that only reads (file or network) and yields typed records or
quarantine entries, and a ``save_*`` that only writes, is safe to run twice and returns the rows
written. Modules: ``exposition`` (Prometheus text from /metrics or a file), ``prometheus_api``
(range queries on a Prometheus-compatible server), ``usage`` (per-request usage JSONL),
``prices`` (price table), ``decisions`` (gateway acceptance logs), ``kv_events`` (vLLM KV events),
``bookkeeping`` (sources, checkpoints, quarantine).
"""
