"""Replay: an exact CPU model of vLLM's prefix cache, trace readers and the live replayer.

Pure computation (no DuckDB, no HTTP) except the live replayer (``prefixscope.replay.live`` client,
``prefixscope.replay.live_metrics`` scrapes, ``prefixscope.replay.live_run`` a whole run; ``prefixscope.replay.live_outputs`` is
pure). Layers, as in vLLM's v1 core:
``hashing`` (block hashes), ``block_pool`` (pool and free queue), ``kv_cache_manager`` (lookup,
allocate, free), ``scheduler`` (sequential and step-based concurrent admission), ``traces``
(readers; ``trace_common``, ``trace_hashids`` and ``trace_hashid_readers`` for hash-id traces),
``sim`` (a trace through the model), ``outputs`` (usage JSONL and Prometheus exposition in
production formats), ``runner`` (one simulated run to files), ``compare`` (A/B of two runs),
``layouts`` (prompt layout transforms), ``chat_requests``, ``chat_captures`` and
``tokenization`` (chat traces, rendered and tokenised offline). Multi-tenant gateway model
(its rules are ``prefixscope.core.identity`` and ``prefixscope.core.decision``, the live
gateway's): ``gateway_trace`` (the trace and its reader), ``gateway`` (the gateway and its
decisions), ``gateway_replay`` (a whole trace, the decision log). Fleets: ``ledger`` (the miss
ledger), ``routers`` (routing policies), ``fleet`` and ``fleet_run`` (N instances behind a
router; the capacity sweep), ``belady`` (LRU against Belady's MIN). Diagnosis (``prefixscope diagnose``): ``diagnose_render`` (rendered chats with an
offset map, a piece-cached tokeniser), ``diagnose_replay`` (reading with structure, the exact
model one request at a time), ``diagnose`` (per-request attribution), ``diagnose_fix`` (breakers,
lost tokens, levels, the suggested layout), ``diagnose_ledger`` (the trace's miss ledger as a
waterfall), ``diagnose_store`` (the stored summary file).
Shared value types are in ``prefixscope.replay.types``.
"""
