"""Usage-log shapes: one JSONL line -> one normalised request (pure: no I/O, no DuckDB).

One line = one request. A line is a provider response (OpenAI-compatible completions, chat, the
final usage chunk of a stream, ``/v1/responses``; vLLM's Anthropic-compatible ``/v1/messages``;
Anthropic, Bedrock Converse, Gemini, DeepSeek, OpenRouter, Groq, Mistral), or a log record that
holds one: a *prefixscope usage log* record (``docs/ingest.md#usage-logs``) with ``usage`` or
``response``, or a pydantic-ai capture line with ``response_usage``. Every shape is normalised to
one row (``usage-shapes.md`` section 1, vLLM 0.32 ``vllm/entrypoints/openai/*/serving.py`` and
``vllm/entrypoints/anthropic/serving.py``):

1. ``prompt_tokens`` is INCLUSIVE of cache reads and writes. Exclusive shapes (Anthropic,
   vLLM ``/v1/messages``, Bedrock) get ``input + cache_read + cache_write``.
2. ``cached_tokens`` NULL = the source did not report it (e.g. vLLM without
   ``--enable-prompt-tokens-details``: ``prompt_tokens_details`` is null); 0 = reported, no hit.
3. ``cache_write_tokens``: OpenAI/OpenRouter ``cache_write_tokens``, vLLM chat
   ``created_cache_tokens`` (null on vLLM completions), Anthropic ``cache_creation_input_tokens``,
   Bedrock ``cacheWriteInputTokens``; NULL when not reported.
4. An inclusive source reporting ``cached > prompt`` was really exclusive: the row is flagged
   ``exclusive-input-suspected`` and made inclusive (``prompt + cached + write``).
5. Raw tenant ids (``tenant``, ``user``) and prompt text are never read into a row; only an
   already-digested ``tenant_digest`` (hex, 8 to 64 characters) is kept.

msgspec decodes each line straight into typed structs (unknown keys such as ``choices`` or
``request_body.messages`` are skipped, never materialised); a key of the wrong type makes the
line a quarantine entry naming the JSON path.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

from prefixscope.core.bounds import (ID_NOT_TEXT, ID_TOO_LONG, MAX_ID_CHARS, MAX_TOKENS,
                                     TOKENS_OVER, id_blank, id_text_ok, out_of_range_reason,
                                     token_bound_reason)
from prefixscope.core.errors import ParseError, invalid_json_reason

#: A number in ``ts``/``time``/``timestamp`` above this is taken as milliseconds.
MS_THRESHOLD = 1e11

#: Request times outside [TS_MIN_UNIX_S, TS_MAX_UNIX_S) (seconds, after the milliseconds rule)
#: are quarantined: 1970-01-01 to 2100-01-01 UTC. Outside it a time is a unit or typing error
#: (and beyond year 9999 no report could print it).
TS_MIN_UNIX_S = 0.0
TS_MAX_UNIX_S = 4102444800.0

#: A token count: an integer in [0, 2^32 - 1] (larger is quarantined, not stored; bounds.MAX_TOKENS).
Tok = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]
#: A duration in milliseconds: 0 to 10^9 (11.6 days); outside it is a unit error.
Ms = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
OptTok = Tok | None | UnsetType
_VALID_SCOPES = frozenset({"PUBLIC", "TENANT", "PRINCIPAL"})
_DIGEST = re.compile(r"[0-9a-f]{8,64}")  # fullmatch: "$" would let a trailing newline in


# ---------------------------------------------------------------------------------------------
# Typed shapes (msgspec): only the keys we read. UNSET = key absent; None = JSON null.
# ---------------------------------------------------------------------------------------------


class _Details(msgspec.Struct, gc=False):
    """``prompt_tokens_details`` / ``input_tokens_details``."""

    cached_tokens: OptTok = UNSET
    created_cache_tokens: OptTok = UNSET  # vLLM extension (chat only)
    cache_write_tokens: OptTok = UNSET  # OpenAI, OpenRouter, vLLM /v1/responses


class _CacheCreation(msgspec.Struct, gc=False):
    """Anthropic ``usage.cache_creation`` (split of writes by TTL)."""

    ephemeral_5m_input_tokens: OptTok = UNSET
    ephemeral_1h_input_tokens: OptTok = UNSET


class _Usage(msgspec.Struct, gc=False):
    """Union of every usage key prefixscope reads (OpenAI, vLLM, Anthropic, Bedrock, Gemini...)."""

    # OpenAI-compatible (vLLM, OpenAI, OpenRouter, DeepSeek, Groq, Mistral, SGLang)
    prompt_tokens: OptTok = UNSET
    completion_tokens: OptTok = UNSET
    prompt_tokens_details: _Details | None | UnsetType = UNSET
    prompt_cache_hit_tokens: OptTok = UNSET  # DeepSeek
    # OpenAI Responses (inclusive) and Anthropic Messages (exclusive)
    input_tokens: OptTok = UNSET
    output_tokens: OptTok = UNSET
    input_tokens_details: _Details | None | UnsetType = UNSET
    cache_read_input_tokens: OptTok = UNSET  # Anthropic, vLLM /v1/messages, LiteLLM
    cache_creation_input_tokens: OptTok = UNSET
    cache_creation: _CacheCreation | None | UnsetType = UNSET
    # AWS Bedrock Converse (exclusive)
    inputTokens: OptTok = UNSET
    outputTokens: OptTok = UNSET
    cacheReadInputTokens: OptTok = UNSET
    cacheWriteInputTokens: OptTok = UNSET
    # Gemini usageMetadata (inclusive)
    promptTokenCount: OptTok = UNSET
    candidatesTokenCount: OptTok = UNSET
    thoughtsTokenCount: OptTok = UNSET
    cachedContentTokenCount: OptTok = UNSET


class _BedrockMetrics(msgspec.Struct, gc=False):
    latencyMs: float | None = None


class _RequestBody(msgspec.Struct, gc=False):
    model: str | None = None


class _Response(msgspec.Struct, gc=False):
    """A provider response object (the keys read from it)."""

    id: str | int | None = None
    object: str | None = None  # text_completion, chat.completion, chat.completion.chunk, response
    type: str | None = None  # Anthropic: message
    created: float | None = None  # Unix seconds (OpenAI-compatible)
    created_at: float | None = None  # Unix seconds (/v1/responses)
    model: str | None = None
    modelVersion: str | None = None  # Gemini
    responseId: str | None = None  # Gemini
    usage: _Usage | None = None
    usageMetadata: _Usage | None = None  # Gemini
    metrics: msgspec.Raw = msgspec.Raw(b"null")  # Bedrock {latencyMs}; vLLM sends null


class _Record(_Response):
    """A JSONL line: a response itself, or a log record holding one (see docs/ingest.md)."""

    response: _Response | None = None
    response_usage: _Usage | None | UnsetType = UNSET  # pydantic-ai capture lines
    request_body: msgspec.Raw = msgspec.Raw(b"null")  # only .model is ever read
    uri: str | None = None
    ts_unix_s: float | None = None
    ts: str | float | None = None
    time: str | float | None = None
    timestamp: str | float | None = None
    ts_estimated: bool | None = None
    request_id: str | int | None = None
    run_id: str | None = None
    instance: str | None = None
    endpoint: str | None = None
    ttft_ms: Ms | None = None
    latency_ms: Ms | None = None
    scope: str | None = None
    tenant_digest: str | None = None
    # Never read: their presence names the tool whose export this is (a hint, rule below).
    resourceSpans: msgspec.Raw = msgspec.Raw(b"null")  # OTLP/JSON trace export
    usageDetails: msgspec.Raw = msgspec.Raw(b"null")  # Langfuse observation
    call_type: msgspec.Raw = msgspec.Raw(b"null")  # LiteLLM SpendLogs row
    messages: msgspec.Raw = msgspec.Raw(b"null")  # a chat request (a replay trace)
    hash_ids: msgspec.Raw = msgspec.Raw(b"null")  # a Mooncake trace record
    prompt_token_ids: msgspec.Raw = msgspec.Raw(b"null")  # a token-ids trace record


#: The command for a line that is another tool's record, not a usage object.
_OTHER_TOOLS = (("resourceSpans", "an OTLP trace export: use prefixscope ingest otlp"),
                ("usageDetails", "a Langfuse observation: use prefixscope ingest langfuse"),
                ("call_type", "a LiteLLM SpendLogs row: use prefixscope ingest litellm"),
                ("messages", "a chat request without its response's usage: replay it "
                             "(prefixscope replay sim FILE) or find what breaks its prefix "
                             "(prefixscope diagnose FILE)"),
                ("hash_ids", "a Mooncake trace record: replay it (prefixscope replay sim FILE)"),
                ("prompt_token_ids", "a token-ids trace record: replay it (prefixscope replay "
                                     "sim FILE)"))


def _other_tool(rec: "_Record") -> str:
    for name, hint in _OTHER_TOOLS:
        raw = getattr(rec, name)
        if raw is not None and bytes(raw) != b"null":
            return "; " + hint
    return ""


_DECODER = msgspec.json.Decoder(_Record)
_BODY_DECODER = msgspec.json.Decoder(_RequestBody)
_METRICS_DECODER = msgspec.json.Decoder(_BedrockMetrics | None)

_STREAM_EVENT_TYPES = frozenset({
    "ping", "content_block_start", "content_block_delta", "content_block_stop", "message_stop",
})


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One request, normalised (what becomes a ``requests`` row).

    Token counts are tokens (int) or None for "not reported". ``prompt_tokens`` includes cache
    reads and writes. ``request_id``/``ts_unix_s`` are None when the line carries none (the file
    ingest then uses ``<file>:<line>`` and the file's mtime). ``flags`` lists oddities found.
    """

    usage_shape: str
    prompt_tokens: int | None
    cached_tokens: int | None
    cache_write_tokens: int | None
    completion_tokens: int | None
    request_id: str | None = None
    ts_unix_s: float | None = None
    ts_estimated: bool = False
    run_id: str | None = None
    model: str | None = None
    instance: str | None = None
    endpoint: str | None = None
    ttft_ms: Ms | None = None
    latency_ms: Ms | None = None
    scope: str | None = None
    tenant_digest: str | None = None
    cache_write_1h_tokens: int | None = None
    flags: tuple[str, ...] = ()


class _Bad(Exception):
    def __init__(self, field: str | None, reason: str):
        super().__init__(reason)
        self.field = field
        self.reason = reason


class _Skip(Exception):
    """A line that is not a request (a stream chunk without usage)."""


def _v(x: Any) -> Any:
    return None if x is UNSET else x


def _add(*parts: int | None) -> int | None:
    """Sum of the known parts (None parts count 0); None if the first part is None."""
    if parts[0] is None:
        return None
    return sum(p for p in parts if p is not None)


_ENDPOINT_BY_OBJECT = {
    "text_completion": "completions",
    "chat.completion": "chat",
    "chat.completion.chunk": "chat",
    "response": "responses",
}


def _endpoint_from_uri(uri: str) -> str | None:
    path = uri.split("?", 1)[0]
    for suffix, name in (("/chat/completions", "chat"), ("/completions", "completions"),
                         ("/messages", "messages"), ("/responses", "responses"),
                         (":generateContent", "generateContent"),
                         (":streamGenerateContent", "generateContent"),
                         ("/converse", "converse"), ("/converse-stream", "converse")):
        if path.endswith(suffix):
            return name
    return None


def _parse_ts(value: str | float, field: str) -> float:
    """ISO 8601 text (naive = UTC) or Unix seconds; numbers above 1e11 are milliseconds."""
    if isinstance(value, str):
        t = value.strip()
        try:
            x = float(t)
        except ValueError:
            try:
                return _iso(t)
            except ValueError:
                raise _Bad(field, "time is neither ISO 8601 nor Unix seconds") from None
    else:
        x = float(value)
    if not math.isfinite(x):
        raise _Bad(field, "time is not a finite number")
    return x / 1000.0 if x > MS_THRESHOLD else x


def _iso(t: str) -> float:
    dt = datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _normalise(rec: _Record, UNSET: UnsetType = UNSET, MAX_TOKENS: int = MAX_TOKENS,
               MAX_ID_CHARS: int = MAX_ID_CHARS, MS_THRESHOLD: float = MS_THRESHOLD) -> tuple:
    """Normalise one decoded line (rules in the module docstring).

    (The keyword defaults bind module constants as locals: this runs once per line; never
    pass them.)

    Returns:
        ``(request_id, ts_unix_s, ts_estimated, run_id, model, instance, endpoint, usage_shape,
        prompt_tokens, cached_tokens, cache_write_tokens, cache_write_1h_tokens,
        completion_tokens, ttft_ms, latency_ms, scope, tenant_digest, flags)``; None where the
        line gives no value (:func:`_parse_lines` fills the file's defaults). From
        ``endpoint`` on, the order is that of :data:`_COLUMNS`.

    Raises:
        _Bad: no usable usage (JSON path and reason); _Skip: a stream chunk without usage.
    """
    resp = rec.response if rec.response is not None else rec
    usage = resp.usage
    path = "$.response.usage" if resp is not rec else "$.usage"
    gemini = False
    if usage is None and resp.usageMetadata is not None:
        usage, gemini = resp.usageMetadata, True
        path = path[:-5] + "usageMetadata"
    if usage is None and resp is not rec and rec.usage is not None:
        usage, path = rec.usage, "$.usage"  # a log record's own usage beside a response
    if usage is None and rec.response_usage is not UNSET:
        usage, path = rec.response_usage, "$.response_usage"
    if usage is None:
        if (resp.object or "").endswith(".chunk") or (resp.type or "") in _STREAM_EVENT_TYPES \
                or (resp.type or "").startswith("response.") and resp.type != "response.completed":
            raise _Skip()
        raise _Bad(path, "no usage object (null or missing)" + _other_tool(rec))

    flags = ""  # each flag as ",name" (joined without a list: the usual line has none)
    endpoint = rec.endpoint or _ENDPOINT_BY_OBJECT.get(resp.object or "")
    if endpoint is None and resp.type == "message":
        endpoint = "messages"
    if endpoint is None and rec.uri:
        endpoint = _endpoint_from_uri(rec.uri)
    write_1h = None
    latency_ms = rec.latency_ms

    if usage.prompt_tokens is not UNSET:
        shape = "openai"
        prompt = usage.prompt_tokens
        if prompt is None:
            raise _Bad(path + ".prompt_tokens", "prompt_tokens is null")
        d = usage.prompt_tokens_details
        if d is not UNSET and d is not None:
            cached = d.cached_tokens
            if cached is UNSET:
                cached = None
            write = d.cache_write_tokens
            if write is UNSET or write is None:
                write = d.created_cache_tokens
                if write is UNSET:
                    write = None
        else:
            cached = write = None
        if cached is None:
            if usage.prompt_cache_hit_tokens is not UNSET:
                cached = usage.prompt_cache_hit_tokens  # DeepSeek without a details object
            elif usage.cache_read_input_tokens is not UNSET:
                cached = usage.cache_read_input_tokens  # LiteLLM top-level copy
        completion = usage.completion_tokens
        if completion is UNSET:
            completion = None
    elif gemini or usage.promptTokenCount is not UNSET:
        shape = "gemini"
        prompt = _v(usage.promptTokenCount)
        if prompt is None:
            raise _Bad(path + ".promptTokenCount", "promptTokenCount is null or missing")
        cached = _v(usage.cachedContentTokenCount)
        write = None
        out = _v(usage.candidatesTokenCount)
        completion = _add(out, _v(usage.thoughtsTokenCount))
        endpoint = endpoint or "generateContent"
    elif usage.inputTokens is not UNSET:
        shape = "bedrock"
        inp = usage.inputTokens
        if inp is None:
            raise _Bad(path + ".inputTokens", "inputTokens is null")
        cached = _v(usage.cacheReadInputTokens)
        write = _v(usage.cacheWriteInputTokens)
        prompt = _add(inp, cached, write)
        completion = _v(usage.outputTokens)
        endpoint = endpoint or "converse"
        if latency_ms is None and resp.metrics is not None:
            try:
                m = _METRICS_DECODER.decode(resp.metrics)
                latency_ms = m.latencyMs if m is not None else None
            except msgspec.MsgspecError:
                pass
    elif usage.input_tokens is not UNSET:
        inp = usage.input_tokens
        if inp is None:
            raise _Bad(path + ".input_tokens", "input_tokens is null")
        completion = _v(usage.output_tokens)
        if usage.input_tokens_details is not UNSET or resp.object == "response":
            shape = "openai-responses"
            d = usage.input_tokens_details
            cached = _v(d.cached_tokens) if d not in (None, UNSET) else None
            write = _v(d.cache_write_tokens) if d not in (None, UNSET) else None
            prompt = inp
            endpoint = endpoint or "responses"
        else:
            # Anthropic Messages and vLLM /v1/messages: input_tokens EXCLUDES reads and writes.
            shape = "anthropic"
            cached = _v(usage.cache_read_input_tokens)
            write = _v(usage.cache_creation_input_tokens)
            cc = usage.cache_creation
            if cc is not UNSET and cc is not None:
                write_1h = _v(cc.ephemeral_1h_input_tokens)
            prompt = _add(inp, cached, write)
            endpoint = endpoint or "messages"
    else:
        raise _Bad(path, "no token counts (prompt_tokens, input_tokens, inputTokens or "
                         "promptTokenCount)")

    if shape in ("openai", "openai-responses", "gemini"):
        if cached is not None and cached > prompt:
            # An "inclusive" source whose reads exceed its total was really exclusive.
            flags += ",exclusive-input-suspected"
            prompt = prompt + cached + (write or 0)
        elif (cached or 0) + (write or 0) > prompt:
            flags += ",cache-exceeds-prompt"

    if prompt is not None and prompt > MAX_TOKENS:
        raise _Bad(path, "prompt tokens with cache reads and writes " + TOKENS_OVER)
    if completion is not None and completion > MAX_TOKENS:
        raise _Bad(path, "completion tokens " + TOKENS_OVER)

    # Time: the response's created, else the log record's time, else (caller) the file mtime.
    # (the JSON path of each value is spelled out only for an error: once per line it cost)
    prefix = "$.response." if resp is not rec else "$."
    ts, ts_field = resp.created, "created"  # a name without "$": under prefix
    if ts is None:
        ts, ts_field = resp.created_at, "created_at"
    if ts is not None:
        if ts > MS_THRESHOLD:
            ts = ts / 1000.0
    elif rec.ts_unix_s is not None:
        ts, ts_field = rec.ts_unix_s, "$.ts_unix_s"
    else:
        for name in ("ts", "time", "timestamp"):
            val = getattr(rec, name)
            if val is not None:
                ts, ts_field = _parse_ts(val, "$." + name), "$." + name
                break
    if ts is not None and not TS_MIN_UNIX_S <= ts < TS_MAX_UNIX_S:
        raise _Bad(ts_field if ts_field[0] == "$" else prefix + ts_field, "time is outside 1970-01-01 to 2100-01-01 UTC (Unix seconds, or "
                             f"milliseconds above {MS_THRESHOLD:.0e})")
    ts_estimated = rec.ts_estimated is True

    # an empty or blank id is a missing id (else every later one would be "already stored");
    # an id is printable text without spaces around it (bounds.id_text_ok), else quarantined
    rid, rid_field = rec.request_id, "$.request_id"
    if rid is None or rid == "" or (isinstance(rid, str) and rid.isspace()):
        rid, rid_field = ((resp.id, "id") if not id_blank(resp.id) else
                          (resp.responseId, "responseId") if not id_blank(resp.responseId) else
                          (rec.id, "$.id"))
        if id_blank(rid):
            rid = None
    if rid is not None:
        rid = str(rid)
        if len(rid) > MAX_ID_CHARS:
            raise _Bad(rid_field if rid_field[0] == "$" else prefix + rid_field, ID_TOO_LONG)
        if not id_text_ok(rid):
            raise _Bad(rid_field if rid_field[0] == "$" else prefix + rid_field, ID_NOT_TEXT)

    # The log record's own model (for a bare response: the response's), else the wrapped
    # response's, else the request body's (pydantic-ai captures).
    model = rec.model or resp.model or resp.modelVersion or rec.modelVersion
    if model is None and rec.request_body is not None and len(rec.request_body) > 4:
        try:
            model = _BODY_DECODER.decode(rec.request_body).model
        except msgspec.MsgspecError:
            model = None

    # each name at most MAX_ID_CHARS (written out: a loop over pairs cost 0.15 us a line)
    if model is not None and len(model) > MAX_ID_CHARS:
        raise _Bad("$.model", ID_TOO_LONG)
    run_id = rec.run_id
    if run_id is not None and run_id != "":
        if len(run_id) > MAX_ID_CHARS:
            raise _Bad("$.run_id", ID_TOO_LONG)
        if run_id.isspace():
            run_id = ""  # blank is as empty: production traffic
        elif not id_text_ok(run_id):
            raise _Bad("$.run_id", ID_NOT_TEXT)
    if rec.instance is not None and len(rec.instance) > MAX_ID_CHARS:
        raise _Bad("$.instance", ID_TOO_LONG)
    if endpoint is not None and len(endpoint) > MAX_ID_CHARS:
        raise _Bad("$.endpoint", ID_TOO_LONG)

    scope = rec.scope
    if scope is not None:
        scope = scope.upper()
        if scope not in _VALID_SCOPES:
            flags += ",scope-invalid"
            scope = None
    digest = rec.tenant_digest
    if digest is not None and not _DIGEST.fullmatch(digest):
        flags += ",tenant-digest-invalid"  # could be a raw id: never stored
        digest = None

    return (rid, ts, ts_estimated, run_id, model, rec.instance, endpoint, shape, prompt,
            cached, write, write_1h, completion, rec.ttft_ms, latency_ms, scope, digest,
            flags[1:] or None)


def _split_error(exc: Exception, raw: bytes | None = None) -> tuple[str | None, str]:
    """msgspec's message -> (JSON path, reason). Its messages name types and paths, not values.

    ``raw`` (the line) turns msgspec's offsetless ``Invalid UTF-8 encoded string`` into
    ``not valid JSON: not UTF-8 text (byte N)``, N the 0-based offset of the first bad byte
    within the line (:func:`prefixscope.core.errors.invalid_json_reason`)."""
    text = str(exc)
    if " - at `" in text:
        reason, _, where = text.partition(" - at `")
        where = where.rstrip("`")
        if reason == "Number out of range":  # 1e400: past the DOUBLE range
            return where, out_of_range_reason(where)
        return where, token_bound_reason(reason)  # Tok is the only int >= 0
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return None, invalid_json_reason(exc, raw)
    return None, text


def not_utf8_reason(raw: bytes) -> str | None:
    """``not valid JSON: not UTF-8 text (byte N)`` for a line that is not UTF-8 (N: 0-based
    offset of its first bad byte within the line), else None. msgspec checks UTF-8 only in the
    strings it reads: a bad line is checked whole before its reason is given, so a line with
    invalid UTF-8 in a key it skips is called what it is (not "no usage object")."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return invalid_json_reason(exc)
    return None


def normalise_usage(obj: dict[str, Any] | bytes | str) -> UsageRecord | None:
    """Normalise one usage-carrying object (pure: no I/O, no DuckDB).

    Args:
        obj: a decoded JSON object (dict) or its JSON text: a provider response, a final stream
            chunk, a prefixscope usage log record or a pydantic-ai capture line.

    Returns:
        The :class:`UsageRecord`, or None for a line that is not a request (a stream chunk or
        event without usage).

    Raises:
        ParseError: the object has no usable usage (``field`` names the JSON path, ``reason``
            says why; neither carries prompt text).
    """
    try:
        # Through JSON text so that a dict takes exactly the path a file line takes.
        rec = _DECODER.decode(obj if isinstance(obj, (bytes, str)) else msgspec.json.encode(obj))
        t = _normalise(rec)
    except _Skip:
        return None
    except _Bad as exc:
        raise ParseError("<object>", None, exc.reason, exc.field) from None
    except msgspec.MsgspecError as exc:
        field, reason = _split_error(exc, obj if isinstance(obj, bytes) else None)
        raise ParseError("<object>", None, reason, field) from None
    (rid, ts, ts_est, run_id, model, instance, endpoint, shape, prompt, cached, write, write_1h,
     completion, ttft, latency, scope, digest, flags) = t
    return UsageRecord(
        usage_shape=shape, prompt_tokens=prompt, cached_tokens=cached, cache_write_tokens=write,
        completion_tokens=completion, request_id=rid, ts_unix_s=ts, ts_estimated=ts_est,
        run_id=run_id, model=model, instance=instance, endpoint=endpoint, ttft_ms=ttft,
        latency_ms=latency, scope=scope, tenant_digest=digest, cache_write_1h_tokens=write_1h,
        flags=tuple(flags.split(",")) if flags else ())
