"""Langfuse observation exports -> ``requests`` rows (pure mapping).

Observations as the public API (``GET /api/public/observations``, ``/api/public/v2/observations``)
and the UI export give them (camelCase: ``id``, ``traceId``, ``type``, ``startTime``,
``endTime``, ``completionStartTime``, ``model``, ``usageDetails``, ``userId``), or as blob-storage
exports write them (snake_case: ``start_time``, ``usage_details``, ``provided_model_name``,
``user_id``); ``usageDetails`` may be an object or its JSON text (CSV).

Rules (Langfuse docs, "Token & Cost Tracking": usage types are mutually exclusive buckets):

0. A record without an ``id`` and one of ``traceId``, ``type``, ``startTime`` (or their
   snake_case names) is not a Langfuse observation (a usage log line, a chat...): quarantined
   ``id: not a Langfuse observation ...``, never skipped in silence.
1. Only ``GENERATION`` and ``EMBEDDING`` observations carry usage; other types, and
   generations without usage, are skipped.
2. ``prompt_tokens`` = the sum of every ``usageDetails`` key containing ``input`` (``input``
   excludes ``input_*`` buckets such as ``input_cached_tokens``, so the sum is the inclusive
   total); ``completion_tokens`` = the sum of keys containing ``output``. ``total`` is not read.
3. Cache read = the input keys naming a cache read (``input_cached_tokens``, ``input_cache_read``,
   ``cache_read_input_tokens``, ...: ``cache_read`` or ``cached``); cache write = those naming a
   write (``input_cache_creation``, ``cache_creation_input_tokens``, ``input_cache_write``...).
   No such key -> NULL, not 0.
4. The legacy ``usage`` object (``input``/``output`` or ``promptTokens``/``completionTokens``)
   is read when ``usageDetails`` is absent; it has no cache split (NULL).
5. ``userId`` becomes the TENANT namespace digest with the HMAC key, else is dropped (flag
   ``tenant-dropped-no-key``).
"""

from __future__ import annotations

from typing import Any

from prefixscope.core.bounds import TOKENS_OVER
from prefixscope.ingest.jsonl_driver import BadLine
from prefixscope.ingest.litellm import _MAX, _ms, json_field, time_s, tokens
from prefixscope.ingest.privacy import digest_namespace
from prefixscope.ingest.usage_rows import NOT_TEXT

KIND = "langfuse"
_USAGE_TYPES = frozenset({"GENERATION", "EMBEDDING"})
#: Keys of which every Langfuse observation (API, UI or blob export) has one besides ``id``.
_OBSERVATION_KEYS = ("traceId", "trace_id", "type", "startTime", "start_time")
NOT_OBSERVATION = ("not a Langfuse observation (an id with a traceId, type or startTime): a "
                   "line of another source")


def _is_read(key: str) -> bool:
    k = key.lower()
    return "input" in k and ("cache_read" in k or "cached" in k)


def _is_write(key: str) -> bool:
    k = key.lower()
    return "input" in k and ("cache_creation" in k or "cache_write" in k)


def observation_to_row(rec: dict[str, Any], *, hmac_key: bytes | None = None,
                       run_id: str = "", instance: str | None = None) -> dict[str, Any] | None:
    """One Langfuse observation -> a ``requests`` row dict (rules in the module docstring).

    Returns:
        The row, or None for an observation that is not a request with usage.

    Raises:
        BadLine: not a Langfuse observation (rule 0), no id or start time, or a usage value of
            the wrong type.
    """
    if not rec.get("id") or not any(rec.get(k) for k in _OBSERVATION_KEYS):
        # a JSON object of another source (a usage log line, a chat, a LiteLLM row...) is not
        # skipped in silence: every line is ingested, skipped as a non-usage observation, or
        # quarantined
        raise BadLine("id", NOT_OBSERVATION)
    otype = str(rec.get("type") or "GENERATION").upper()
    if otype not in _USAGE_TYPES:
        return None
    name = "usageDetails" if "usageDetails" in rec else "usage_details"
    details = json_field(rec, name)
    prompt = completion = read = write = None
    shape = "langfuse"
    if details:
        for k, v in details.items():
            # The key is input (a usage type may be any name): the field names the object only.
            n = tokens(v, name)
            if n is None:
                continue
            kl = k.lower()
            if "input" in kl:
                prompt = (prompt or 0) + n
                if _is_read(k):
                    read = (read or 0) + n
                elif _is_write(k):
                    write = (write or 0) + n
            elif "output" in kl:
                completion = (completion or 0) + n
    else:
        usage = json_field(rec, "usage")
        shape = "langfuse-usage"
        prompt = tokens(usage.get("input", usage.get("promptTokens")), "usage.input")
        completion = tokens(usage.get("output", usage.get("completionTokens")), "usage.output")
    if prompt is None and completion is None:
        return None
    if max(prompt or 0, completion or 0) > _MAX:  # a sum of buckets each <= 2^32 - 1
        raise BadLine(name, "token counts summed over usage types " + TOKENS_OVER)
    if prompt is None:
        raise BadLine(name, "output usage without input usage")
    rid = rec.get("id")
    if not rid:
        raise BadLine("id", "no observation id")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise BadLine("id", NOT_TEXT)
    start = time_s(rec.get("startTime") or rec.get("start_time"), "startTime")
    if start is None:
        raise BadLine("startTime", "no start time")
    end = time_s(rec.get("endTime") or rec.get("end_time"), "endTime")
    first = time_s(rec.get("completionStartTime") or rec.get("completion_start_time"),
                   "completionStartTime")
    flags: list[str] = []
    scope = digest = None
    user = rec.get("userId") or rec.get("user_id")
    if user:
        if hmac_key is None:
            flags.append("tenant-dropped-no-key")
        else:
            scope, digest = digest_namespace(hmac_key, tenant_id=str(user))
    return {
        "run_id": run_id, "request_id": str(rid), "ts_unix_s": start, "ts_estimated": False,
        "model": rec.get("model") or rec.get("provided_model_name") or rec.get("providedModelName")
        or None,
        "instance": instance, "endpoint": "embeddings" if otype == "EMBEDDING" else None,
        "usage_shape": shape, "prompt_tokens": prompt, "cached_tokens": read,
        "cache_write_tokens": write, "completion_tokens": completion,
        "ttft_ms": _ms((first - start) * 1000.0 if first and first >= start else None),
        "latency_ms": _ms((end - start) * 1000.0 if end and end >= start else None),
        "scope": scope, "tenant_digest": digest, "flags": ",".join(flags) if flags else None,
        "provider": None,
    }
