"""Usage-log ingest: JSONL of per-request usage objects into the ``requests`` table.

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

Reading is fast: msgspec decodes each line straight into typed structs (unknown keys such as
``choices`` or ``request_body.messages`` are skipped, never materialised), and rows go to DuckDB
as Arrow batches of :data:`BATCH_ROWS` with ``INSERT ... ON CONFLICT DO NOTHING``. Each batch is
committed together with the file checkpoint (``ingest/bookkeeping.py``), so a crash repeats
nothing and a second run adds nothing.
"""

from __future__ import annotations

import gc
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import duckdb
import msgspec
import pyarrow as pa
from msgspec import UNSET, UnsetType

from ingest.bookkeeping import (
    Checkpoint,
    IngestSummary,
    Quarantined,
    fingerprint_upto,
    new_ingest_run_id,
    record_quarantine,
    record_run,
    resume_offset,
    source_id_for,
    upsert_source,
)
from prefixscope.errors import ParseError, SourceUnavailable

KIND = "requests"
#: Rows per transaction (and per Arrow batch).
BATCH_ROWS = 50_000
#: Bytes read from the file at a time.
READ_BYTES = 8 << 20
#: A number in ``ts``/``time``/``timestamp`` above this is taken as milliseconds.
MS_THRESHOLD = 1e11

#: A token count: a non-negative integer that fits a BIGINT (larger is quarantined, not stored).
Tok = Annotated[int, msgspec.Meta(ge=0, le=2**62)]
OptTok = Tok | None | UnsetType
_VALID_SCOPES = frozenset({"PUBLIC", "TENANT", "PRINCIPAL"})
_DIGEST = re.compile(r"^[0-9a-f]{8,64}$")


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
    ttft_ms: float | None = None
    latency_ms: float | None = None
    scope: str | None = None
    tenant_digest: str | None = None


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
    ttft_ms: float | None = None
    latency_ms: float | None = None
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


def _normalise(rec: _Record) -> tuple:
    """Normalise one decoded line (rules in the module docstring).

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
        raise _Bad(path, "no usage object (null or missing)")

    flags: list[str] = []
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
            flags.append("exclusive-input-suspected")
            prompt = prompt + cached + (write or 0)
        elif (cached or 0) + (write or 0) > prompt:
            flags.append("cache-exceeds-prompt")

    # Time: the response's created, else the log record's time, else (caller) the file mtime.
    ts = resp.created
    if ts is None:
        ts = resp.created_at
    if ts is not None:
        if ts > MS_THRESHOLD:
            ts = ts / 1000.0
    elif rec.ts_unix_s is not None:
        ts = rec.ts_unix_s
    else:
        for name in ("ts", "time", "timestamp"):
            val = getattr(rec, name)
            if val is not None:
                ts = _parse_ts(val, "$." + name)
                break
    ts_estimated = rec.ts_estimated is True

    rid = rec.request_id
    if rid is None:
        rid = resp.id if resp.id is not None else (resp.responseId or rec.id)
    if rid is not None:
        rid = str(rid)

    # The log record's own model (for a bare response: the response's), else the wrapped
    # response's, else the request body's (pydantic-ai captures).
    model = rec.model or resp.model or resp.modelVersion or rec.modelVersion
    if model is None and rec.request_body is not None and len(rec.request_body) > 4:
        try:
            model = _BODY_DECODER.decode(rec.request_body).model
        except msgspec.MsgspecError:
            model = None

    scope = rec.scope
    if scope is not None:
        scope = scope.upper()
        if scope not in _VALID_SCOPES:
            flags.append("scope-invalid")
            scope = None
    digest = rec.tenant_digest
    if digest is not None and not _DIGEST.match(digest):
        flags.append("tenant-digest-invalid")  # could be a raw id: never stored
        digest = None

    return (rid, ts, ts_estimated, rec.run_id, model, rec.instance, endpoint, shape, prompt,
            cached, write, write_1h, completion, rec.ttft_ms, latency_ms, scope, digest,
            ",".join(flags) if flags else None)


def _split_error(exc: Exception) -> tuple[str | None, str]:
    """msgspec's message -> (JSON path, reason). Its messages name types and paths, not values."""
    text = str(exc)
    if " - at `" in text:
        reason, _, where = text.partition(" - at `")
        return where.rstrip("`"), reason
    return None, (f"not valid JSON: {text}" if isinstance(exc, msgspec.DecodeError)
                  and not isinstance(exc, msgspec.ValidationError) else text)


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
        field, reason = _split_error(exc)
        raise ParseError("<object>", None, reason, field) from None
    (rid, ts, ts_est, run_id, model, instance, endpoint, shape, prompt, cached, write, write_1h,
     completion, ttft, latency, scope, digest, flags) = t
    return UsageRecord(
        usage_shape=shape, prompt_tokens=prompt, cached_tokens=cached, cache_write_tokens=write,
        completion_tokens=completion, request_id=rid, ts_unix_s=ts, ts_estimated=ts_est,
        run_id=run_id, model=model, instance=instance, endpoint=endpoint, ttft_ms=ttft,
        latency_ms=latency, scope=scope, tenant_digest=digest, cache_write_1h_tokens=write_1h,
        flags=tuple(flags.split(",")) if flags else ())


# ---------------------------------------------------------------------------------------------
# fetch (read only) and save (write only)
# ---------------------------------------------------------------------------------------------

_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("run_id", pa.string()), ("request_id", pa.string()), ("source_id", pa.string()),
    ("line", pa.int64()), ("ts_unix_s", pa.float64()), ("ts_estimated", pa.bool_()),
    ("model", pa.string()), ("instance", pa.string()), ("endpoint", pa.string()),
    ("usage_shape", pa.string()), ("prompt_tokens", pa.int64()), ("cached_tokens", pa.int64()),
    ("cache_write_tokens", pa.int64()), ("cache_write_1h_tokens", pa.int64()),
    ("completion_tokens", pa.int64()), ("ttft_ms", pa.float64()), ("latency_ms", pa.float64()),
    ("scope", pa.string()), ("tenant_digest", pa.string()), ("flags", pa.string()),
)
_SCHEMA = pa.schema([pa.field(n, t) for n, t in _COLUMNS])
_COLUMN_LIST = ", ".join(n for n, _ in _COLUMNS)


@dataclass(slots=True)
class UsageBatch:
    """Rows parsed from a run of lines, with the checkpoint after them.

    Attributes:
        rows: row tuples in ``requests`` column order (:data:`_COLUMNS`).
        quarantined: lines set aside, with file:line:field:reason.
        skipped: lines that are not requests (blank lines, stream chunks without usage).
        checkpoint: byte offset and line count after the last consumed line.
    """

    rows: list[tuple]
    quarantined: list[Quarantined]
    skipped: int
    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class _LineContext:
    """What every row of one file shares (picklable: sent to parser processes)."""

    location: str
    source_id: str
    run_id: str
    instance: str | None
    default_model: str | None
    mtime: float
    fallback_prefix: str  # "<absolute path>:" for request ids of lines without one


def _context(path: str | os.PathLike[str], source_id: str, run_id: str, instance: str | None,
             default_model: str | None, mtime: float) -> _LineContext:
    return _LineContext(str(path), source_id, run_id, instance, default_model, mtime,
                        str(Path(path).resolve()) + ":")


def _parse_lines(lines: list[bytes], line_no: int, ctx: _LineContext
                 ) -> tuple[list[tuple], list[Quarantined], int]:
    """Parse complete lines (no newline) numbered ``line_no + 1``...; returns (rows in
    ``requests`` column order, quarantined, skipped)."""
    decode = _DECODER.decode
    normalise = _normalise
    rows: list[tuple] = []
    append = rows.append
    quarantined: list[Quarantined] = []
    skipped = 0
    run_id, source_id, instance = ctx.run_id, ctx.source_id, ctx.instance
    default_model, mtime, prefix = ctx.default_model, ctx.mtime, ctx.fallback_prefix
    for raw in lines:
        line_no += 1
        try:
            t = normalise(decode(raw))
        except _Skip:
            skipped += 1
            continue
        except _Bad as exc:
            quarantined.append(Quarantined(ctx.location, line_no, exc.reason, exc.field))
            continue
        except msgspec.MsgspecError as exc:
            if not raw.strip():
                skipped += 1  # a blank line
                continue
            field, reason = _split_error(exc)
            quarantined.append(Quarantined(ctx.location, line_no, reason, field))
            continue
        # t = (rid, ts, ts_est, run_id, model, instance, endpoint, ...): see _normalise
        ts = t[1]
        append((t[3] if t[3] is not None else run_id,
                t[0] if t[0] is not None else prefix + str(line_no),
                source_id, line_no,
                ts if ts is not None else mtime, t[2] if ts is not None else True,
                t[4] or default_model, t[5] or instance) + t[6:])
    return rows, quarantined, skipped


def _open(path: str | os.PathLike[str]):
    try:
        fh = open(path, "rb")
        return fh, os.fstat(fh.fileno()).st_mtime
    except OSError as exc:
        raise SourceUnavailable(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _complete_tail(tail: bytes) -> bool:
    """A final line without a newline counts only when it is complete JSON (a writer may still
    be writing it); it is then read, otherwise left for the next run."""
    if not tail.strip():
        return False
    try:
        msgspec.json.decode(tail)
    except msgspec.DecodeError:
        return False
    return True


def fetch_usage(path: str | os.PathLike[str], *, start: Checkpoint, source_id: str,
                run_id: str = "", instance: str | None = None, default_model: str | None = None,
                batch_rows: int = BATCH_ROWS) -> Iterator[UsageBatch]:
    """Read a usage JSONL file from ``start`` and yield parsed batches (reads only; one thread).

    A final line without a newline is consumed only if it is complete JSON (a writer may still
    be writing it); otherwise it is left for the next run.

    Args:
        path: the JSONL file.
        start: where to begin (byte offset, lines already read).
        source_id: stored with each row.
        run_id, instance, default_model: used when a line carries none.
        batch_rows: lines per batch.

    Yields:
        :class:`UsageBatch` objects (``rows`` as tuples), file order; checkpoints without
        fingerprint.

    Raises:
        SourceUnavailable: the file cannot be opened.
    """
    fh, mtime = _open(path)
    ctx = _context(path, source_id, run_id, instance, default_model, mtime)
    with fh:
        fh.seek(start.offset)
        offset, line_no = start.offset, start.line
        pending = b""
        lines: list[bytes] = []
        while True:
            chunk = fh.read(READ_BYTES)
            if not chunk:
                if pending and _complete_tail(pending):
                    lines.append(pending)
                    pending = b""
                    chunk_end = True
                else:
                    chunk_end = False
                if lines or chunk_end:
                    n = len(lines)
                    rows, quarantined, skipped = _parse_lines(lines, line_no, ctx)
                    offset += sum(len(x) for x in lines) + n - (1 if chunk_end else 0)
                    line_no += n
                    yield UsageBatch(rows, quarantined, skipped, Checkpoint(offset, line_no, None))
                return
            buf = pending + chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                pending = buf
                continue
            pending = buf[cut + 1:]
            lines.extend(buf[:cut].split(b"\n"))
            while len(lines) >= batch_rows:
                part, lines = lines[:batch_rows], lines[batch_rows:]
                rows, quarantined, skipped = _parse_lines(part, line_no, ctx)
                offset += sum(len(x) for x in part) + len(part)
                line_no += len(part)
                yield UsageBatch(rows, quarantined, skipped, Checkpoint(offset, line_no, None))


#: Files (from their checkpoint) at least this large are parsed by a pool of processes.
PARALLEL_MIN_BYTES = 64 << 20
#: Bytes of complete lines per parallel batch (about 45,000 lines of 550 bytes).
REGION_BYTES = 24 << 20


def _parse_region(path: str, offset: int, nbytes: int, line_no: int, ctx: _LineContext
                  ) -> tuple[pa.Table, list[Quarantined], int]:
    """Parse the complete lines in ``[offset, offset + nbytes)`` (runs in a parser process)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        buf = fh.read(nbytes)
    lines = buf.split(b"\n")
    lines.pop()  # the region ends with a newline
    rows, quarantined, skipped = _parse_lines(lines, line_no, ctx)
    return rows_to_arrow(rows), quarantined, skipped


def _worker_init() -> None:
    gc.disable()


def fetch_usage_parallel(path: str | os.PathLike[str], *, start: Checkpoint, source_id: str,
                         run_id: str = "", instance: str | None = None,
                         default_model: str | None = None, workers: int = 1,
                         region_bytes: int | None = None) -> Iterator[UsageBatch]:
    """As :func:`fetch_usage`, but the lines are parsed by ``workers`` processes (forked: they
    run only the pure parsing code, never DuckDB), one region of about ``region_bytes`` of
    complete lines each, while the caller inserts earlier ones; batches are still yielded in
    file order (``rows`` as Arrow tables), so checkpoints advance in order.

    Raises:
        SourceUnavailable: the file cannot be opened.
    """
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    region_bytes = region_bytes or REGION_BYTES
    fh, mtime = _open(path)
    ctx = _context(path, source_id, run_id, instance, default_model, mtime)
    location = str(path)
    with fh, ProcessPoolExecutor(max_workers=workers, initializer=_worker_init,
                                 mp_context=multiprocessing.get_context("fork")) as pool:
        fh.seek(start.offset)
        offset, line_no = start.offset, start.line
        pending = b""
        inflight: deque = deque()

        def drain(limit: int) -> Iterator[UsageBatch]:
            while len(inflight) > limit:
                fut, cp = inflight.popleft()
                table, quarantined, skipped = fut.result()
                yield UsageBatch(table, quarantined, skipped, cp)

        while True:
            chunk = fh.read(region_bytes)
            if not chunk:
                break
            buf = pending + chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                pending = buf
                continue
            pending = buf[cut + 1:]
            n = buf.count(b"\n", 0, cut + 1)
            fut = pool.submit(_parse_region, location, offset, cut + 1, line_no, ctx)
            offset += cut + 1
            line_no += n
            inflight.append((fut, Checkpoint(offset, line_no, None)))
            yield from drain(2 * workers)
        yield from drain(0)
    if pending and _complete_tail(pending):
        rows, quarantined, skipped = _parse_lines([pending], line_no, ctx)
        yield UsageBatch(rows, quarantined, skipped,
                         Checkpoint(offset + len(pending), line_no + 1, None))


def rows_to_arrow(rows: list[tuple]) -> pa.Table:
    """Row tuples (``requests`` column order) -> an Arrow table with the ``requests`` types."""
    cols = list(zip(*rows)) if rows else [()] * len(_COLUMNS)
    return pa.Table.from_arrays(
        [pa.array(c, type=t) for c, (_, t) in zip(cols, _COLUMNS)], schema=_SCHEMA)


def save_usage_rows(con: duckdb.DuckDBPyConnection, rows: list[tuple] | pa.Table, *,
                    assume_new: bool = False) -> int:
    """Insert rows (tuples in ``requests`` column order, or their Arrow table) into
    ``requests``; rows whose (run_id, request_id) exists are skipped. Runs inside the caller's
    transaction. Returns the number of rows added.

    With ``assume_new`` a plain INSERT is used (faster); it raises
    ``duckdb.ConstraintException`` on any existing key, after which the caller rolls back and
    calls again without ``assume_new``."""
    table = rows if isinstance(rows, pa.Table) else rows_to_arrow(rows)
    if table.num_rows == 0:
        return 0
    from store.queries.requests import insert_new_request_rows, insert_request_rows

    insert = insert_new_request_rows if assume_new else insert_request_rows
    return insert(con, table, _COLUMN_LIST)


def _save_batch(con: duckdb.DuckDBPyConnection, table: pa.Table, quarantined: list[Quarantined],
                *, source_id: str, location: str, ingest_run_id: str, checkpoint: Checkpoint,
                assume_new: bool) -> tuple[int, bool]:
    """Rows + quarantine + checkpoint of one batch in one transaction.

    Returns:
        (rows added, whether the next batch may still assume new keys).
    """
    for attempt_new in ((True, False) if assume_new else (False,)):
        con.execute("BEGIN TRANSACTION")
        try:
            n = save_usage_rows(con, table, assume_new=attempt_new)
            record_quarantine(con, source_id=source_id, ingest_run_id=ingest_run_id,
                              entries=quarantined)
            upsert_source(con, source_id=source_id, kind=KIND, location=location,
                          rows_added=n, checkpoint=checkpoint)
            con.execute("COMMIT")
            return n, attempt_new
        except duckdb.ConstraintException:
            con.execute("ROLLBACK")
            if not attempt_new:
                raise
        except BaseException:
            con.execute("ROLLBACK")
            raise
    raise AssertionError("unreachable")


def ingest_usage_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                      run_id: str | None = None, instance: str | None = None,
                      default_model: str | None = None, batch_rows: int = BATCH_ROWS,
                      workers: int | None = None) -> IngestSummary:
    """Ingest one usage JSONL file into ``requests``; see :func:`ingest_usage_file_detailed`
    (this returns only its summary)."""
    return ingest_usage_file_detailed(con, path, run_id=run_id, instance=instance,
                                      default_model=default_model, batch_rows=batch_rows,
                                      workers=workers)[0]


#: How many quarantine entries :func:`ingest_usage_file_detailed` returns (all are stored).
PROBLEMS_RETURNED = 100


def ingest_usage_file_detailed(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                               run_id: str | None = None, instance: str | None = None,
                               default_model: str | None = None, batch_rows: int = BATCH_ROWS,
                               workers: int | None = None
                               ) -> tuple[IngestSummary, list[Quarantined]]:
    """Ingest one usage JSONL file into ``requests``, from its checkpoint on.

    Each batch of up to ``batch_rows`` lines is committed with its quarantine entries and the
    new checkpoint in one transaction. Safe to run twice: the primary key
    ``(run_id, request_id)`` and the checkpoint make a second run add nothing.

    Args:
        con: a read-write, migrated connection, not inside a transaction.
        path: the JSONL file.
        run_id: for lines without ``run_id`` (default ``''``, production traffic).
        instance: for lines without ``instance``.
        default_model: for lines whose record and response name no model.
        batch_rows: lines per batch when parsed in this process.
        workers: parser processes; 0 = parse in this process. Default: 0 when less than
            :data:`PARALLEL_MIN_BYTES` remain to be read, else one per CPU but one (at least 1,
            at most 4), leaving a CPU to DuckDB's insert. With workers, batches are regions of
            about :data:`REGION_BYTES` of lines, parsed while the previous region is inserted,
            and committed in file order.

    Returns:
        (:class:`IngestSummary`, the first :data:`PROBLEMS_RETURNED` lines quarantined by this
        call, file order). The summary counts rows read/added/duplicate/quarantined; its
        ``note`` counts skipped lines and says when the file had nothing new.

    Raises:
        SourceUnavailable: the file does not exist or cannot be read.
    """
    location = str(path)
    if not os.path.isfile(path):
        raise SourceUnavailable(f"{location}: no such file")
    started = time.time()
    source_id = source_id_for(KIND, location)
    start = resume_offset(con, source_id, path)
    ingest_run_id = new_ingest_run_id()
    read = added = n_quarantined = skipped = 0
    problems: list[Quarantined] = []
    con.execute("SET enable_progress_bar = false")  # never draw on the caller's terminal
    # Rows from new lines are nearly always new keys: try the plain INSERT first and fall back
    # to ON CONFLICT DO NOTHING for this and later batches once a key repeats.
    assume_new = True
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of small acyclic objects: collection passes only cost time
    try:
        kwargs = dict(start=start, source_id=source_id, run_id=run_id or "",
                      instance=instance, default_model=default_model)
        if workers is None:
            big = os.path.getsize(path) - start.offset >= PARALLEL_MIN_BYTES
            workers = max(1, min((os.cpu_count() or 1) - 1, 4)) if big else 0
        batches = (fetch_usage_parallel(path, workers=workers, **kwargs) if workers > 0
                   else fetch_usage(path, batch_rows=batch_rows, **kwargs))
        for batch in batches:
            cp = Checkpoint(batch.checkpoint.offset, batch.checkpoint.line,
                            fingerprint_upto(path, batch.checkpoint.offset))
            table = batch.rows if isinstance(batch.rows, pa.Table) else rows_to_arrow(batch.rows)
            n, assume_new = _save_batch(con, table, batch.quarantined,
                                        source_id=source_id, location=location,
                                        ingest_run_id=ingest_run_id, checkpoint=cp,
                                        assume_new=assume_new)
            read += table.num_rows
            added += n
            n_quarantined += len(batch.quarantined)
            skipped += batch.skipped
            if len(problems) < PROBLEMS_RETURNED:
                problems.extend(batch.quarantined[:PROBLEMS_RETURNED - len(problems)])
    finally:
        if gc_was_enabled:
            gc.enable()
    notes = []
    if read == 0 and n_quarantined == 0 and skipped == 0:
        notes.append("no new lines since the last ingest" if start.offset else "empty file")
    if skipped:
        notes.append(f"{skipped} lines skipped (blank, or stream chunks without usage)")
    summary = IngestSummary(source=location, kind=KIND, rows_read=read, rows_added=added,
                            rows_duplicate=read - added, rows_quarantined=n_quarantined,
                            note="; ".join(notes) or None)
    status = "ok" if n_quarantined == 0 else ("partial" if read else "failed")
    record_run(con, source_id=source_id, kind=KIND, started_unix_s=started, summary=summary,
               status=status, ingest_run_id=ingest_run_id)
    return summary, problems
