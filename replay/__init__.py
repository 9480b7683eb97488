"""Replay: an exact CPU model of vLLM's prefix cache, trace readers and the live replayer.

Pure computation (no DuckDB, no HTTP) except the live replayer (``replay.live`` client,
``replay.live_metrics`` scrapes, ``replay.live_run`` a whole run; ``replay.live_outputs`` is
pure). Layers, as in vLLM's v1 core:
``hashing`` (block hashes), ``block_pool`` (pool and free queue), ``kv_cache_manager`` (lookup,
allocate, free), ``scheduler`` (sequential and step-based concurrent admission), ``traces``
(readers), ``outputs`` (usage JSONL and Prometheus exposition in production formats),
``layouts`` (prompt layout transforms). Shared value types are in ``replay.types``.
"""
