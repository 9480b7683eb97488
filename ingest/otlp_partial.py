"""An OTLP trace request decoded span by span when it cannot be decoded whole (partial success).

A collector batches spans of many services into one export; one span with a malformed
attribute (a ``stringValue`` that is a number in OTLP/JSON, an invalid UTF-8 string or a bad
hex id in protobuf...) must not refuse the whole export with a 400, which exporters do not
retry: the good spans are kept and the bad ones counted in the response's
``partial_success.rejected_spans`` (OTLP specification, "OTLP/HTTP", "Partial Success").

The whole request is decoded first (the fast path); only when that fails is it taken apart:

- **protobuf**: the wire format is split by field number, without decoding values
  (``ExportTraceServiceRequest.resource_spans`` = 1; ``ResourceSpans.resource`` = 1,
  ``scope_spans`` = 2; ``ScopeSpans.scope`` = 1, ``spans`` = 2; ``Span.trace_id`` = 1,
  ``span_id`` = 2: ``opentelemetry/proto/trace/v1/trace.proto``), and each span, and each
  resource and scope without its children, is decoded alone. A body whose wire format cannot be
  split is not an OTLP request (400).
- **JSON**: the same, per object of ``resourceSpans[i].scopeSpans[j].spans[k]``.

A resource or scope that cannot be decoded rejects its spans. Reasons name the span's path and
the decoder's type of error, never a value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from prefixscope.core.bounds import TOO_DEEP
from prefixscope.ingest.genai_spans import OtlpDecodeError, hex_ids_to_base64

__all__ = ["RejectedSpan", "PartialRequest", "decode_protobuf_partial", "decode_json_partial"]


@dataclass(frozen=True, slots=True)
class RejectedSpan:
    """A span that could not be decoded.

    Attributes:
        trace_id, span_id: hex ids when they could be read (else ``""``), for the quarantine.
        path: ``resourceSpans[i].scopeSpans[j].spans[k]``.
        reason: why (the decoder's error type or the field at fault; never a value).
    """

    trace_id: str
    span_id: str
    path: str
    reason: str


@dataclass(slots=True)
class PartialRequest:
    """The decodable part of a request and the spans left out (oldest first)."""

    request: ExportTraceServiceRequest
    rejected: list[RejectedSpan] = field(default_factory=list)


#: A body or a part of it (the receiver reads bodies into a bytearray, never copied).
Buf = bytes | bytearray


class _WireError(Exception):
    pass


def _varint(buf: Buf, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise _WireError
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: Buf) -> list[tuple[int, Buf | None, Buf]]:
    """``(field number, value of a length-delimited field or None, the field's raw bytes)``
    of one message, in wire order. Raises _WireError on a malformed wire format."""
    out: list[tuple[int, Buf | None, Buf]] = []
    i, n = 0, len(buf)
    while i < n:
        start = i
        key, i = _varint(buf, i)
        fno, wt = key >> 3, key & 7
        value = None
        if wt == 0:
            _, i = _varint(buf, i)
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        elif wt == 2:
            size, i = _varint(buf, i)
            value = buf[i:i + size]
            i += size
        else:
            raise _WireError
        if i > n or fno == 0:
            raise _WireError
        out.append((fno, value, buf[start:i]))
    return out


def _ids(raw: Buf) -> tuple[str, str]:
    try:
        got = {f: v for f, v, _ in _fields(raw) if f in (1, 2) and v is not None}
    except _WireError:
        return "", ""
    return (got.get(1) or b"").hex(), (got.get(2) or b"").hex()


def _shell(raw: Buf, children: int) -> bytes:
    """A message's bytes without its field ``children`` (the repeated child messages)."""
    return b"".join(r for f, _, r in _fields(raw) if f != children)


def decode_protobuf_partial(body: Buf) -> PartialRequest:
    """An OTLP/HTTP protobuf body -> its decodable spans and the rejected ones.

    Raises:
        OtlpDecodeError: the body's wire format cannot be split (not an OTLP request at all).
    """
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
        return PartialRequest(req)
    except Exception:  # google.protobuf.message.DecodeError (upb: any malformed field)
        req = ExportTraceServiceRequest()
    out = PartialRequest(req)
    try:
        top = _fields(body)
        for i, (_, rs_raw, _) in enumerate(f for f in top if f[0] == 1):
            _resource_spans(out, i, rs_raw or b"")
    except _WireError:
        raise OtlpDecodeError("not an OTLP protobuf trace request: DecodeError") from None
    return out


def _resource_spans(out: PartialRequest, i: int, raw: Buf) -> None:
    rs = ResourceSpans()
    try:
        rs.ParseFromString(raw)
        out.request.resource_spans.append(rs)
        return
    except Exception:
        rs = ResourceSpans()
    scopes = [v or b"" for f, v, _ in _fields(raw) if f == 2]
    shell_ok = _parses(rs, _shell(raw, 2))
    kept = out.request.resource_spans.add()
    kept.CopyFrom(rs)
    for j, ss_raw in enumerate(scopes):
        ss = ScopeSpans()
        spans = [v or b"" for f, v, _ in _fields(ss_raw) if f == 2]
        scope_ok = shell_ok and _parses(ss, _shell(ss_raw, 2))
        kept_ss = kept.scope_spans.add()
        kept_ss.CopyFrom(ss)
        for k, span_raw in enumerate(spans):
            path = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
            span = Span()
            if not scope_ok:
                why = "its resource" if not shell_ok else "its scope"
                out.rejected.append(RejectedSpan(*_ids(span_raw), path,
                                                 f"not an OTLP span ({why} cannot be decoded)"))
            elif _parses(span, span_raw):
                kept_ss.spans.append(span)
            else:
                out.rejected.append(RejectedSpan(*_ids(span_raw), path,
                                                 "not an OTLP span (DecodeError)"))


def _parses(msg: Any, raw: Buf) -> bool:
    try:
        msg.ParseFromString(raw)
        return True
    except Exception:
        return False


def decode_json_partial(obj: dict[str, Any]) -> PartialRequest:
    """An OTLP/JSON request object (already JSON-decoded) -> its decodable spans and the
    rejected ones. Call it when :func:`prefixscope.ingest.genai_spans.decode_json` refused the
    whole object for its schema.

    Raises:
        OtlpDecodeError: ``resourceSpans`` is not a list of objects (nothing to split).
    """
    out = PartialRequest(ExportTraceServiceRequest())
    spans_of = obj.get("resourceSpans")
    if not isinstance(spans_of, list):
        raise OtlpDecodeError("not an OTLP/JSON trace request (resourceSpans)")
    for i, rs in enumerate(spans_of):
        if not isinstance(rs, dict):
            raise OtlpDecodeError(f"not an OTLP/JSON trace request (resourceSpans[{i}])")
        scopes = rs.get("scopeSpans")
        scopes = scopes if isinstance(scopes, list) else []
        kept = out.request.resource_spans.add()
        shell_ok = _json_parses(kept, {k: v for k, v in rs.items() if k != "scopeSpans"})
        for j, ss in enumerate(scopes):
            ss = ss if isinstance(ss, dict) else {}
            spans = ss.get("spans")
            spans = spans if isinstance(spans, list) else []
            kept_ss = kept.scope_spans.add()
            scope_ok = shell_ok and _json_parses(kept_ss, {k: v for k, v in ss.items()
                                                           if k != "spans"})
            for k, span in enumerate(spans):
                path = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                tid, sid = _json_ids(span)
                msg = Span()
                if not scope_ok:
                    why = "its resource" if not shell_ok else "its scope"
                    out.rejected.append(RejectedSpan(tid, sid, path,
                                                     f"not an OTLP span ({why} cannot be decoded)"))
                    continue
                reason = _json_reason(msg, span)
                if reason is None:
                    kept_ss.spans.append(msg)
                else:
                    out.rejected.append(RejectedSpan(tid, sid, path, reason))
    return out


def _json_ids(span: Any) -> tuple[str, str]:
    if not isinstance(span, dict):
        return "", ""
    ids = []
    for key, size in (("traceId", 16), ("spanId", 8)):
        v = span.get(key)
        try:
            ok = isinstance(v, str) and len(bytes.fromhex(v)) == size
        except ValueError:
            ok = False
        ids.append(v.lower() if ok and isinstance(v, str) else "")
    return ids[0], ids[1]


def _json_reason(msg: Any, obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return "not an OTLP span (not a JSON object)"
    try:
        json_format.ParseDict(hex_ids_to_base64(obj), msg, ignore_unknown_fields=True)
    except OtlpDecodeError as exc:
        return f"not an OTLP span ({exc})"
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        # the message names the field and the expected type; cut any quoted value
        return f"not an OTLP span ({str(exc).split(':', 1)[0]})"
    return None


def _json_parses(msg: Any, obj: dict[str, Any]) -> bool:
    return _json_reason(msg, obj) is None


def decode_request(body: Buf, *, is_json: bool) -> PartialRequest:
    """An OTLP/HTTP body (already decompressed) -> its decodable spans and the rejected ones.

    Args:
        body: the request body, protobuf (``application/x-protobuf``) or JSON (bytes or a
            bytearray: not copied).
        is_json: the body is OTLP/JSON.

    Returns:
        A :class:`PartialRequest`; ``rejected`` is empty when the whole body decoded.

    Raises:
        OtlpDecodeError: the body is no OTLP trace request at all (not JSON, not an object, a
            wire format that cannot be split), or it fails as a whole while no span of it
            fails alone (the fault is outside every span: the whole-body reason is raised).
    """
    from prefixscope.ingest.genai_spans import decode_json, decode_protobuf

    if not is_json:
        try:
            return PartialRequest(decode_protobuf(body))
        except OtlpDecodeError as whole:
            got = decode_protobuf_partial(body)
            if not got.rejected:
                raise whole from None
            return got
    try:
        return PartialRequest(decode_json(body))
    except OtlpDecodeError as whole:
        import msgspec

        if str(whole) == TOO_DEEP:  # never decoded again: the decoders recurse
            raise whole from None
        try:
            obj = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):
            raise whole from None
        if not isinstance(obj, dict):
            raise whole from None
        got = decode_json_partial(obj)
        if not got.rejected:
            raise whole from None
        return got
