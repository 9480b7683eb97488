"""OpenTelemetry GenAI spans -> ``requests`` rows (pure: no I/O, no DuckDB).

An OTLP trace request (``ExportTraceServiceRequest`` of the official ``opentelemetry-proto``
package, decoded from protobuf or from OTLP/JSON) holds spans; a span that carries token usage
becomes one ``requests`` row with the same normalisation as a usage log
(:mod:`prefixscope.ingest.usage_shapes`, ``usage-shapes.md`` sections 1-3):

1. Attribute names: every alias in :data:`INPUT_KEYS`, :data:`OUTPUT_KEYS`,
   :data:`CACHE_READ_KEYS` and :data:`CACHE_WRITE_KEYS` (GenAI semantic conventions, the
   renamed ``cache_write`` and the older ``cache_creation``, OpenLLMetry, Sentry, Langfuse,
   OpenInference ``llm.token_count.*``, Vercel AI SDK ``ai.usage.*``, and the
   ``input_tokens_details`` / legacy ``prompt_tokens`` forms, flat or as a key-value list). The
   first name present wins, in the order listed.
2. ``gen_ai.usage.input_tokens`` is inclusive of cache reads and writes (the conventions say so
   and instrumentations normalise Anthropic and Bedrock counts). Per provider, a count that
   cannot be inclusive is made inclusive and flagged ``exclusive-input-suspected``: for
   Anthropic and AWS Bedrock (exclusive at the API) when reads + writes exceed the input, for
   every other provider when reads alone exceed it (reads + writes above it only flags
   ``cache-exceeds-prompt``). ``input_rule="provider"`` instead takes the input of Anthropic and
   Bedrock spans as exclusive always (for emitters that copy the API's number).
3. A missing cache attribute stays NULL (not reported), never 0.
4. Tenant and user attributes (:data:`TENANT_KEYS`) are never stored: with the server-side HMAC
   key they become the TENANT namespace digest (:func:`prefixscope.ingest.privacy.digest_tenant`),
   without it they are dropped and the row flagged ``tenant-dropped-no-key``.
5. Spans without input or output counts (HTTP, tool and workflow spans) and agent spans that
   sum their children's usage (``gen_ai.operation.name`` ``invoke_agent``/``create_agent``/
   ``execute_tool``, OpenInference ``AGENT``/``CHAIN``) are skipped, not stored twice.
6. ``request_id`` is ``gen_ai.response.id`` when present, else ``<trace id>:<span id>`` (hex),
   so a batch sent again (the collector's retry) adds nothing.

Other fields: time = span start (Unix s), ``latency_ms`` = end - start, ``ttft_ms`` from
``gen_ai.server.time_to_first_token`` / ``gen_ai.response.time_to_first_token`` (seconds),
model = ``gen_ai.request.model`` (else ``gen_ai.response.model``, ``llm.model_name``), instance =
``server.address[:server.port]`` (else the caller's default, else the resource's
``service.name``; at most 256 characters like every instance, else the span is quarantined; an
instance that contains the span's own tenant id, a per-tenant endpoint such as
``acme-corp.openai.azure.com``, is stored only as ``hmac:<digest>`` of the whole instance, or
dropped with flag ``instance-dropped-tenant`` without a key: docs/cache-identity.md, labels
never hold raw tenant ids), endpoint from ``gen_ai.operation.name``, provider from
``gen_ai.provider.name`` / ``gen_ai.system`` / ``llm.provider`` / ``llm.system``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from prefixscope.core.bounds import MAX_TOKENS, TOKENS_OVER, TOO_DEEP, json_too_deep
from prefixscope.core.errors import invalid_json_reason

#: Total input (inclusive of cache reads and writes, rule 2).
INPUT_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt",
              "ai.usage.inputTokens", "ai.usage.promptTokens")
OUTPUT_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
               "llm.token_count.completion", "ai.usage.outputTokens", "ai.usage.completionTokens")
CACHE_READ_KEYS = (
    "gen_ai.usage.cache_read.input_tokens",            # semantic conventions (Development)
    "gen_ai.usage.cache_read_input_tokens",            # OpenLLMetry
    "gen_ai.usage.input_tokens.cached",                # Sentry
    "gen_ai.usage.input_cached_tokens",                # Langfuse alias
    "gen_ai.usage.input_tokens_details.cached_tokens",  # OpenAI Responses form
    "gen_ai.usage.prompt_tokens_details.cached_tokens",  # legacy prompt_tokens form
    "llm.token_count.prompt_details.cache_read",       # OpenInference
    "ai.usage.cachedInputTokens",                      # Vercel AI SDK
)
CACHE_WRITE_KEYS = (
    "gen_ai.usage.cache_write.input_tokens",           # semantic-conventions-genai #440 (2026)
    "gen_ai.usage.cache_creation.input_tokens",        # the name before #440
    "gen_ai.usage.cache_creation_input_tokens",        # OpenLLMetry
    "gen_ai.usage.input_tokens.cache_write",           # Sentry
    "gen_ai.usage.input_tokens_details.cache_write_tokens",
    "gen_ai.usage.prompt_tokens_details.cache_write_tokens",
    "llm.token_count.prompt_details.cache_write",      # OpenInference
)
MODEL_KEYS = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name")
PROVIDER_KEYS = ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")
TTFT_S_KEYS = ("gen_ai.server.time_to_first_token", "gen_ai.response.time_to_first_token")
#: Raw tenant or user ids: only ever digested (rule 4). Span attributes first, then resource.
TENANT_KEYS = ("prefixscope.tenant", "tenant.id", "enduser.id", "user.id", "gen_ai.request.user",
               "langfuse.user.id", "user_id")
_AGGREGATE_OPERATIONS = frozenset({"invoke_agent", "create_agent", "execute_tool"})
_AGGREGATE_KINDS = frozenset({"AGENT", "CHAIN", "TOOL"})
_EXCLUSIVE_PROVIDERS = frozenset({"anthropic", "aws.bedrock", "aws_bedrock", "bedrock"})
_ENDPOINTS = {"chat": "chat", "text_completion": "completions", "generate_content":
              "generateContent", "embeddings": "embeddings", "responses": "responses"}
_MAX_TOKENS = MAX_TOKENS  # one request's token count (docs/ingest.md#bounds)
_TOKEN_KEYS = frozenset((*INPUT_KEYS, *OUTPUT_KEYS, *CACHE_READ_KEYS, *CACHE_WRITE_KEYS))
INPUT_RULES = ("semconv", "provider")


class SpanProblem(Exception):
    """A GenAI span that cannot be stored: ``field`` (attribute name), ``reason`` (never its
    value)."""

    def __init__(self, field: str | None, reason: str):
        super().__init__(reason)
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SpanRef:
    """Where a span sits: hex trace and span ids, and its path in the request."""

    trace_id: str
    span_id: str
    path: str

    def number(self) -> int:
        """A stable 63-bit number for the span (the quarantine's ``line`` for HTTP sources)."""
        return int.from_bytes(hashlib.sha256(
            f"{self.trace_id}:{self.span_id}".encode()).digest()[:8], "big") >> 1


def _value(v: Any) -> Any:
    """An OTLP ``AnyValue`` -> Python (kvlists as dicts, arrays as lists)."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "bytes_value":
        return None  # never read
    return getattr(v, which)


def attributes(kvs) -> dict[str, Any]:
    """OTLP ``KeyValue`` list -> ``{name: value}``; a key-value list value is also flattened
    to dotted names (``gen_ai.usage.input_tokens_details`` = {cached_tokens: 5} gives
    ``gen_ai.usage.input_tokens_details.cached_tokens`` = 5)."""
    out: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        out.setdefault(name, value)
        if isinstance(value, dict):
            for k, x in value.items():
                put(f"{name}.{k}", x)

    for kv in kvs:
        put(kv.key, _value(kv.value))
    return out


def _tokens(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[int | None, str | None]:
    """(count, attribute name) of the first alias present; (None, None) when none is.

    Raises:
        SpanProblem: the value is not a non-negative whole number (int, integral double, or
            digits as text).
    """
    for k in keys:
        if k not in attrs or attrs[k] is None:
            continue
        v = attrs[k]
        if isinstance(v, bool):
            raise SpanProblem(k, "token count is a boolean")
        if isinstance(v, float):
            if not v.is_integer():
                raise SpanProblem(k, "token count is not a whole number")
            v = int(v)
        elif isinstance(v, str):
            if not v.strip().isdigit():
                raise SpanProblem(k, "token count is text that is not a whole number")
            v = int(v)
        elif not isinstance(v, int):
            raise SpanProblem(k, "token count is not a number")
        if v < 0:
            raise SpanProblem(k, "token count is negative")
        if v > _MAX_TOKENS:
            raise SpanProblem(k, TOKENS_OVER)
        return v, k
    return None, None


def _text(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for k in keys:
        v = attrs.get(k)
        if isinstance(v, str) and v:
            return v
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(v)
    return None


def _shape(key: str) -> str:
    if key.startswith("llm."):
        return "openinference"
    if key.startswith("ai."):
        return "vercel-ai"
    return "otel-genai"


def normalise_span(span, resource: Mapping[str, Any], *, run_id: str = "",
                   instance: str | None = None, input_rule: str = "semconv",
                   tenant_digester: Callable[[str], str] | None = None) -> dict[str, Any] | None:
    """One OTLP ``Span`` -> a ``requests`` row as a dict (rules in the module docstring).

    Args:
        span: an ``opentelemetry.proto.trace.v1.trace_pb2.Span``.
        resource: the resource's attributes (:func:`attributes`).
        run_id: stored as ``run_id`` ('' = production traffic).
        instance: instance name when the span has no ``server.address``.
        input_rule: ``semconv`` (input inclusive, corrected when it cannot be) or ``provider``
            (Anthropic and Bedrock input exclusive always).
        tenant_digester: raw tenant id -> namespace digest (the HMAC key's); None = no key.

    Returns:
        The row (keys: the ``requests`` columns this source fills, plus ``provider``), or None
        for a span that is not a request's usage (rule 5).

    Raises:
        SpanProblem: a usage attribute of the wrong type.
    """
    attrs = attributes(span.attributes)
    op = attrs.get("gen_ai.operation.name")
    kind = attrs.get("openinference.span.kind")
    if op in _AGGREGATE_OPERATIONS or (isinstance(kind, str) and kind.upper() in _AGGREGATE_KINDS):
        return None
    inp, in_key = _tokens(attrs, INPUT_KEYS)
    out, out_key = _tokens(attrs, OUTPUT_KEYS)
    if inp is None and out is None:
        return None
    if inp is None:
        raise SpanProblem(INPUT_KEYS[0], "output tokens without input tokens")
    read, _ = _tokens(attrs, CACHE_READ_KEYS)
    write, _ = _tokens(attrs, CACHE_WRITE_KEYS)
    provider = _text(attrs, PROVIDER_KEYS) or _text(resource, PROVIDER_KEYS)
    prov = (provider or "").lower()
    flags: list[str] = []
    exclusive_provider = prov in _EXCLUSIVE_PROVIDERS
    if input_rule not in INPUT_RULES:
        raise ValueError(f"input_rule must be one of {INPUT_RULES}")
    if input_rule == "provider" and exclusive_provider:
        prompt = inp + (read or 0) + (write or 0)
    elif exclusive_provider and (read or 0) + (write or 0) > inp:
        flags.append("exclusive-input-suspected")
        prompt = inp + (read or 0) + (write or 0)
    elif (read or 0) > inp:
        flags.append("exclusive-input-suspected")
        prompt = inp + (read or 0) + (write or 0)
    else:
        prompt = inp
        if (read or 0) + (write or 0) > inp:
            flags.append("cache-exceeds-prompt")
    if prompt > _MAX_TOKENS:  # input + reads + writes, each <= 2^32 - 1
        raise SpanProblem(INPUT_KEYS[0], "prompt tokens with cache reads and writes " + TOKENS_OVER)

    trace_hex, span_hex = span.trace_id.hex(), span.span_id.hex()
    rid = _text(attrs, ("gen_ai.response.id",)) or f"{trace_hex}:{span_hex}"
    start_s = span.start_time_unix_nano / 1e9 if span.start_time_unix_nano else None
    latency = ((span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
               if span.end_time_unix_nano >= span.start_time_unix_nano > 0 else None)
    ttft = None
    for k in TTFT_S_KEYS:
        v = attrs.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            ttft = float(v) * 1000.0
            break
    address = _text(attrs, ("server.address",))
    port = _text(attrs, ("server.port",))
    inst = (f"{address}:{port}" if address and port else address) or instance \
        or _text(resource, ("service.name",))
    scope = digest = None
    raw_tenant = _text(attrs, TENANT_KEYS) or _text(resource, TENANT_KEYS)
    if raw_tenant:
        if tenant_digester is None:
            flags.append("tenant-dropped-no-key")
        else:
            digest, scope = tenant_digester(raw_tenant), "TENANT"
        if inst and raw_tenant.casefold() in inst.casefold():
            # a per-tenant endpoint names the tenant: never stored raw (module docstring)
            if tenant_digester is None:
                inst = None
                flags.append("instance-dropped-tenant")
            else:
                inst = "hmac:" + tenant_digester(inst)
    endpoint = _ENDPOINTS.get(op, op) if isinstance(op, str) else None
    return {
        "run_id": run_id, "request_id": rid, "ts_unix_s": start_s,
        "ts_estimated": start_s is None, "model": _text(attrs, MODEL_KEYS),
        "instance": inst, "endpoint": endpoint, "usage_shape": _shape(in_key or out_key),
        "prompt_tokens": prompt, "cached_tokens": read, "cache_write_tokens": write,
        "cache_write_1h_tokens": None, "completion_tokens": out, "ttft_ms": ttft,
        "latency_ms": latency, "scope": scope, "tenant_digest": digest,
        "flags": ",".join(flags) if flags else None, "provider": provider,
    }


def iter_spans(req: ExportTraceServiceRequest) -> Iterator[tuple[Any, dict[str, Any], SpanRef]]:
    """(span, resource attributes, :class:`SpanRef`) for every span of the request."""
    for i, rs in enumerate(req.resource_spans):
        res = attributes(rs.resource.attributes)
        for j, ss in enumerate(rs.scope_spans):
            for k, span in enumerate(ss.spans):
                yield span, res, SpanRef(span.trace_id.hex(), span.span_id.hex(),
                                         f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]")


class OtlpDecodeError(ValueError):
    """The body is not an OTLP trace request (message safe to show: no values)."""


def decode_protobuf(body: bytes | bytearray) -> ExportTraceServiceRequest:
    """OTLP/HTTP protobuf body -> request. Raises :class:`OtlpDecodeError`."""
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except Exception as exc:  # google.protobuf.message.DecodeError
        raise OtlpDecodeError(f"not an OTLP protobuf trace request: {type(exc).__name__}") from None
    return req


_ID_KEYS = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


_INT64 = (-(2**63), 2**63 - 1)


def _bounded_int_value(value: Any) -> Any:
    """A token attribute's ``{"intValue": V}`` with V past int64 (``10**400``, which protobuf
    cannot hold and ``json_format`` would refuse for the whole request) clamped to int64's
    bound, so the span is quarantined by its attribute and bound (``over 4,294,967,295
    tokens``, ``token count is negative``) and the other spans of the request are kept."""
    v = value.get("intValue")
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        n = int(v)
    elif isinstance(v, int) and not isinstance(v, bool):
        n = int(v)
    else:
        return value
    if _INT64[0] <= n <= _INT64[1]:
        return value
    return {**value, "intValue": str(min(max(n, _INT64[0]), _INT64[1]))}


def hex_ids_to_base64(obj: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex (not protobuf JSON's base64): convert them
    so ``json_format`` reads the right bytes (OTLP spec, "JSON Protobuf Encoding"). A token
    count attribute past int64 is clamped to its bound (:func:`_bounded_int_value`)."""
    if isinstance(obj, dict):
        if obj.get("key") in _TOKEN_KEYS and isinstance(obj.get("value"), dict):
            obj = {**obj, "value": _bounded_int_value(obj["value"])}
        out = {}
        for k, v in obj.items():
            if k in _ID_KEYS and isinstance(v, str):
                try:
                    raw = bytes.fromhex(v)
                except ValueError:
                    raise OtlpDecodeError(f"{k}: not a hex id") from None
                if raw and len(raw) != _ID_KEYS[k]:
                    raise OtlpDecodeError(f"{k}: {len(raw)} bytes, expected {_ID_KEYS[k]}")
                out[k] = base64.b64encode(raw).decode()
            else:
                out[k] = hex_ids_to_base64(v)
        return out
    if isinstance(obj, list):
        return [hex_ids_to_base64(x) for x in obj]
    return obj


def decode_json(body: bytes | bytearray | str | dict) -> ExportTraceServiceRequest:
    """OTLP/JSON (one ``{"resourceSpans": [...]}`` object: an OTLP/HTTP JSON body or one line
    of the collector's file exporter) -> request. Unknown fields are ignored.

    Raises:
        OtlpDecodeError: not JSON (``not valid JSON: <decoder's message> (byte N)``, the words
            of ``ingest requests``; NaN and Infinity are not JSON), not an object, or not of
            the OTLP trace schema.
    """
    if isinstance(body, dict):
        obj = body
    else:
        if json_too_deep(body):  # checked before any decoder: they recurse (issue 12)
            raise OtlpDecodeError(TOO_DEEP)
        raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        try:  # msgspec, as ingest requests: NaN/Infinity are not JSON, offsets are named
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise OtlpDecodeError(invalid_json_reason(exc, raw)) from None
    if not isinstance(obj, dict):
        raise OtlpDecodeError("not a JSON object")
    req = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(hex_ids_to_base64(obj), req, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        # The message names the field and the expected type; cut any quoted value.
        text = str(exc).split(":", 1)[0]
        raise OtlpDecodeError(f"not an OTLP/JSON trace request ({text})") from None
    return req
