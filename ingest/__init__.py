"""Ingest: read sources and write them to the store.

Each source has a ``fetch_*`` that only reads (file or network) and yields typed records or
quarantine entries, and a ``save_*`` that only writes, is safe to run twice and returns the rows
written. Modules: ``exposition`` (Prometheus text from /metrics or a file), ``prometheus_api``
(range queries on a Prometheus-compatible server), ``usage`` (per-request usage JSONL: the
writer; ``usage_shapes`` normalises one line, ``usage_read`` reads lines into Arrow batches),
``genai_spans`` (OpenTelemetry GenAI spans -> rows), ``otlp`` (OTLP file and request
storage), ``otlp_http`` (the OTLP/HTTP receiver), ``usage_rows`` (the writer those and the
LiteLLM/Langfuse readers share), ``litellm`` and ``langfuse`` (their record mappings),
``record_files`` (JSON lines, JSON document or CSV files of such records), ``prices`` (price table), ``decisions`` (gateway acceptance logs), ``kv_events`` (vLLM KV events),
``runs`` (a simulated replay run's directory), ``live_run`` (a live replay run's directory),
``jsonl_driver`` (the one JSONL tail driver: checkpoint, complete lines, one transaction per
batch), ``bookkeeping`` (sources, checkpoints, quarantine), ``privacy`` (digesting raw tenant
ids).
"""
