"""LiteLLM proxy spend logs (``LiteLLM_SpendLogs`` rows) -> ``requests`` rows (pure mapping).

The rows as LiteLLM stores and exports them: JSON lines of the table (``row_to_json`` or the
``/spend/logs`` API: ``metadata`` a nested object) or the Postgres table's columns (``psql
\\copy ... CSV HEADER``: ``metadata`` JSON text, ``startTime`` ``YYYY-MM-DD HH:MM:SS.fff``
without zone, which LiteLLM writes in UTC). Columns read (``schema.prisma`` model
``LiteLLM_SpendLogs``): ``request_id``, ``call_type``, ``api_key`` (hashed), ``startTime``,
``endTime``, ``completionStartTime``, ``request_duration_ms``, ``model``, ``model_group``,
``custom_llm_provider``, ``api_base``, ``prompt_tokens``, ``completion_tokens``, ``team_id``,
``end_user``, ``status``, ``cache_hit`` and ``metadata.usage_object``.

Rules (``usage-shapes.md`` section 3, LiteLLM ``litellm/proxy/spend_tracking/cache_savings.py``
and ``llms/anthropic/chat/transformation.py``):

1. ``prompt_tokens`` is inclusive: LiteLLM adds Anthropic's cache reads and writes to it.
2. Cache read: ``usage_object.cache_read_input_tokens`` when above 0, else
   ``usage_object.prompt_tokens_details.cached_tokens``, else the explicit 0; a top-level
   ``cache_read_input_tokens`` column (daily-spend exports) is read the same way. Cache write:
   ``cache_creation_input_tokens``, else ``prompt_tokens_details.cache_creation_tokens`` /
   ``cache_write_tokens``. Neither reported -> NULL, never 0.
3. ``cache_hit`` is LiteLLM's own *response* cache, not provider prefix caching: it is never a
   prefix hit; such rows are flagged ``litellm-response-cache-hit``.
4. Team, key and end user become the namespace digest, never stored raw: tenant = ``team_id``
   (else ``key:<api_key hash>``), principal = ``end_user``; scope PRINCIPAL with a principal,
   else TENANT (:func:`prefixscope.ingest.privacy.digest_namespace`). Without the HMAC key they
   are dropped and the row flagged ``tenant-dropped-no-key``.
5. Rows with ``status`` ``failure`` are skipped (no usage).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from prefixscope.core.bounds import MAX_TOKENS, TIME_RANGE, TOKENS_OVER, TOO_DEEP
from prefixscope.ingest.jsonl_driver import BadLine
from prefixscope.ingest.usage_rows import NOT_TEXT
from prefixscope.ingest.privacy import digest_namespace

KIND = "litellm"
_MAX = MAX_TOKENS  # one request's token count (docs/ingest.md#bounds)
_ENDPOINTS = {"completion": "chat", "acompletion": "chat", "text_completion": "completions",
              "atext_completion": "completions", "embedding": "embeddings",
              "aembedding": "embeddings", "anthropic_messages": "messages",
              "responses": "responses", "aresponses": "responses"}


#: Reason for a line without LiteLLM's token columns that holds a top-level ``usage`` object
#: (an OpenAI-style response, whose counts are not read here: ``ingest requests`` reads them).
NOT_SPEND_LOG = ("no prompt token count: not a LiteLLM spend-log row (it has a top-level usage "
                 "object, as a provider response has: ingest requests reads those)")


def tokens(value: Any, field: str) -> int | None:
    """A token count from JSON or CSV text: int, integral float, digits; None for null/''.

    Raises:
        BadLine: negative, fractional, a boolean or other text (the value is not quoted).
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise BadLine(field, "token count is a boolean")
    if isinstance(value, float):
        if not value.is_integer():
            raise BadLine(field, "token count is not a whole number")
        value = int(value)
    elif isinstance(value, str):
        t = value.strip()
        if not t.isdigit():
            raise BadLine(field, "token count is not a whole number")
        value = int(t)
    elif not isinstance(value, int):
        raise BadLine(field, "token count is not a number")
    if value < 0:
        raise BadLine(field, "token count is negative")
    if value > _MAX:
        raise BadLine(field, TOKENS_OVER)
    return value


def json_field(rec: dict[str, Any], name: str) -> dict[str, Any]:
    """A JSON column: a nested object, or its JSON text (CSV); {} when absent or null."""
    v = rec.get(name)
    if v is None or v == "":
        return {}
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            raise BadLine(name, "JSON column is not valid JSON") from None
        except RecursionError:  # a CSV cell is not screened by the line guard
            raise BadLine(name, TOO_DEEP) from None
    if not isinstance(v, dict):
        raise BadLine(name, "not a JSON object")
    return v


def time_s(value: Any, field: str) -> float | None:
    """ISO 8601 / Postgres timestamp text (no zone = UTC) or Unix seconds -> Unix seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            x = float(value)
        except OverflowError:  # an integer past a double's range
            raise BadLine(field, TIME_RANGE) from None
        return x / 1000.0 if x > 1e11 else x
    if not isinstance(value, str):
        raise BadLine(field, "time is not text or a number")
    from datetime import datetime, timezone

    t = value.strip().replace(" ", "T", 1)
    if t.endswith(("Z", "z")):
        t = t[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise BadLine(field, "time is not ISO 8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    try:
        return dt.timestamp()
    except (OverflowError, ValueError):  # year 1 with a positive offset, year 9999 with -23:59
        raise BadLine(field, TIME_RANGE) from None


def _ms(x: float | None) -> float | None:
    """Milliseconds to the microsecond (timestamps carry float noise below it)."""
    return None if x is None else round(x, 3)


def _first_reported(*candidates: tuple[Any, str]) -> int | None:
    """LiteLLM's read order: the first candidate above 0, else the first reported 0."""
    zero = None
    for value, field in candidates:
        n = tokens(value, field)
        if n is None:
            continue
        if n > 0:
            return n
        zero = 0 if zero is None else zero
    return zero


def spendlog_to_row(rec: dict[str, Any], *, hmac_key: bytes | None = None, run_id: str = "",
                    instance: str | None = None) -> dict[str, Any] | None:
    """One ``LiteLLM_SpendLogs`` row -> a ``requests`` row dict (rules in the module docstring).

    Returns:
        The row, or None for a failed request (``status`` ``failure``).

    Raises:
        BadLine: no request id or time, or a token count of the wrong type.
    """
    if not isinstance(rec.get("status"), (str, type(None))):
        raise BadLine("status", NOT_TEXT)
    if str(rec.get("status") or "").lower() == "failure":
        return None
    rid = rec.get("request_id") or rec.get("id")
    if not rid:
        raise BadLine("request_id", "no request id")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise BadLine("request_id", NOT_TEXT)
    meta = json_field(rec, "metadata")
    usage = meta.get("usage_object") or {}
    if not isinstance(usage, dict):
        raise BadLine("metadata.usage_object", "not a JSON object")
    details = usage.get("prompt_tokens_details") or {}
    if not isinstance(details, dict):
        details = {}
    prompt = tokens(usage.get("prompt_tokens"), "metadata.usage_object.prompt_tokens")
    if prompt is None:
        prompt = tokens(rec.get("prompt_tokens"), "prompt_tokens")
    completion = tokens(usage.get("completion_tokens"), "metadata.usage_object.completion_tokens")
    if completion is None:
        completion = tokens(rec.get("completion_tokens"), "completion_tokens")
    if prompt is None:
        if isinstance(rec.get("usage"), dict):  # a provider response, not a spend-log row
            raise BadLine("prompt_tokens", NOT_SPEND_LOG)
        raise BadLine("prompt_tokens", "no prompt token count")
    read = _first_reported(
        (usage.get("cache_read_input_tokens"), "metadata.usage_object.cache_read_input_tokens"),
        (details.get("cached_tokens"), "metadata.usage_object.prompt_tokens_details.cached_tokens"),
        (rec.get("cache_read_input_tokens"), "cache_read_input_tokens"))
    write = _first_reported(
        (usage.get("cache_creation_input_tokens"),
         "metadata.usage_object.cache_creation_input_tokens"),
        (details.get("cache_creation_tokens"),
         "metadata.usage_object.prompt_tokens_details.cache_creation_tokens"),
        (details.get("cache_write_tokens"),
         "metadata.usage_object.prompt_tokens_details.cache_write_tokens"),
        (rec.get("cache_creation_input_tokens"), "cache_creation_input_tokens"))
    flags: list[str] = []
    if read is not None and read > prompt:
        flags.append("exclusive-input-suspected")
        prompt = prompt + read + (write or 0)
    elif (read or 0) + (write or 0) > prompt:
        flags.append("cache-exceeds-prompt")
    if prompt > _MAX:  # input + reads + writes, each <= 2^32 - 1
        raise BadLine("prompt_tokens", "prompt tokens with cache reads and writes " + TOKENS_OVER)
    if str(rec.get("cache_hit") or "").lower() == "true":
        flags.append("litellm-response-cache-hit")

    start = time_s(rec.get("startTime") or rec.get("start_time"), "startTime")
    if start is None:
        raise BadLine("startTime", "no start time")
    end = time_s(rec.get("endTime") or rec.get("end_time"), "endTime")
    first = time_s(rec.get("completionStartTime"), "completionStartTime")
    duration = rec.get("request_duration_ms")
    if isinstance(duration, int) and not isinstance(duration, bool) and abs(duration) > 2**53:
        raise BadLine("request_duration_ms", "not a finite number of milliseconds from 0 to 10^9")
    latency = (float(duration) if isinstance(duration, (int, float)) and not
               isinstance(duration, bool) else (end - start) * 1000.0 if end else None)
    ttft = (first - start) * 1000.0 if first and first >= start else None

    scope = digest = None
    team, api_key, end_user = rec.get("team_id"), rec.get("api_key"), rec.get("end_user")
    tenant = team or (f"key:{api_key}" if api_key else None)
    if tenant or end_user:
        if hmac_key is None:
            flags.append("tenant-dropped-no-key")
        elif tenant:
            scope, digest = digest_namespace(hmac_key, tenant_id=str(tenant),
                                             principal_id=str(end_user) if end_user else None)
        else:
            flags.append("principal-without-tenant")
    base = rec.get("api_base")
    host = None
    if isinstance(base, str) and "://" in base:
        try:
            host = urlsplit(base).netloc or None
        except ValueError:  # "http://[::1" (an unclosed IPv6 bracket): no host
            host = None
    call = rec.get("call_type") if isinstance(rec.get("call_type"), str) else ""
    return {
        "run_id": run_id, "request_id": str(rid), "ts_unix_s": start, "ts_estimated": False,
        "model": rec.get("model") or rec.get("model_group") or None,
        "instance": host or instance, "endpoint": _ENDPOINTS.get(call, call or None),
        "usage_shape": "litellm-spendlogs", "prompt_tokens": prompt, "cached_tokens": read,
        "cache_write_tokens": write, "completion_tokens": completion, "ttft_ms": _ms(ttft),
        "latency_ms": _ms(latency), "scope": scope, "tenant_digest": digest,
        "flags": ",".join(flags) if flags else None,
        "provider": rec.get("custom_llm_provider") or None,
    }
