"""OTLP trace ingest: the collector's file exporter (JSON lines) and OTLP/HTTP request bodies.

Spans become ``requests`` rows by :mod:`prefixscope.ingest.genai_spans` (attribute aliases, the
inclusive/exclusive rule, tenant digests) and are written by :mod:`prefixscope.ingest.usage_rows`
with the usage-log writer, so a span and a usage-log line of the same request land in one
table under one rule. The HTTP listener is ``ingest/otlp_http.py``.

File source (``kind`` ``otlp-file``): one ``ExportTraceServiceRequest`` in OTLP/JSON per line,
as the collector's ``file`` exporter writes it (lines of ``resourceMetrics`` or
``resourceLogs`` are skipped). Read by the line loop of ``ingest/record_files.py``, tailed from
its checkpoint by ``ingest/jsonl_driver.py``: one transaction per batch with its quarantine
entries and checkpoint; read twice, adds nothing.
A span with a bad usage attribute quarantines its line (``file:line: <span path>.<attribute>:
reason``), the line's other spans are still stored.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from prefixscope.core.bounds import LINE_TOO_LONG, MAX_LINE_BYTES
from prefixscope.ingest.bookkeeping import (
    IngestSummary,
    Quarantined,
    new_ingest_run_id,
    source_id_for,
)
from prefixscope.ingest.genai_spans import (
    OtlpDecodeError,
    SpanProblem,
    iter_spans,
    normalise_span,
)
from prefixscope.ingest.jsonl_driver import BadLine, TailResult, commit_batch
from prefixscope.ingest.record_files import LineRows, ingest_record_lines
from prefixscope.ingest.usage_rows import insert_dict_rows, row_problem

KIND_FILE = "otlp-file"
#: Longest line of a file-exporter file: one export (a collector batch of thousands of spans is
#: several MiB, above the 1 MiB JSONL bound); the same bound as an OTLP/HTTP body.
MAX_EXPORT_LINE_BYTES = 64 << 20
KIND_HTTP = "otlp-http"


@dataclass(frozen=True, slots=True)
class SpanOptions:
    """How spans become rows (see :func:`prefixscope.ingest.genai_spans.normalise_span`).

    Attributes:
        run_id: '' = production traffic. instance: for spans without ``server.address``.
        input_rule: ``semconv`` or ``provider``. tenant_digester: raw id -> digest, None = no
            HMAC key (tenant attributes dropped, rows flagged).
    """

    run_id: str = ""
    instance: str | None = None
    input_rule: str = "semconv"
    tenant_digester: Callable[[str], str] | None = None


@dataclass(slots=True)
class SpanRows:
    """Rows from one OTLP request: ``rows`` (dicts), ``problems`` ((SpanRef, field, reason)),
    ``skipped`` spans without usage, ``spans`` seen."""

    rows: list[dict[str, Any]]
    problems: list[tuple[Any, str | None, str]]
    skipped: int
    spans: int


def rows_from_request(req, opts: SpanOptions, *, source_id: str) -> SpanRows:
    """Every span of an ``ExportTraceServiceRequest`` -> rows (``source_id`` stored on each)."""
    out = SpanRows([], [], 0, 0)
    for span, resource, ref in iter_spans(req):
        out.spans += 1
        try:
            row = normalise_span(span, resource, run_id=opts.run_id, instance=opts.instance,
                                 input_rule=opts.input_rule,
                                 tenant_digester=opts.tenant_digester)
        except SpanProblem as exc:
            out.problems.append((ref, f"{ref.path}.attributes.{exc.field}", exc.reason))
            continue
        if row is None:
            out.skipped += 1
            continue
        problem = row_problem(row)
        if problem is not None:
            out.problems.append((ref, f"{ref.path}.{problem[0]}", problem[1]))
            continue
        row["source_id"] = source_id
        out.rows.append(row)
    return out


def _looks_like_other_signal(line: bytes) -> bool:
    head = line[:200]
    return b'"resourceMetrics"' in head or b'"resourceLogs"' in head or \
        b'"resourceProfiles"' in head


def _looks_like_export(line: bytes) -> bool:
    """True when a line starts as the file exporter writes an export (``{"resourceSpans":``
    first): only such a line may be longer than the shared 1 MiB bound."""
    return b'"resourceSpans"' in line[:64]


def ingest_otlp_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str],
                     opts: SpanOptions = SpanOptions(), *,
                     keep_problems: int = 100) -> TailResult:
    """Ingest what is new in a collector file-exporter file (OTLP/JSON, one request a line).

    Lines are bounded as every JSONL ingester's (``prefixscope.core.bounds``: 1 MiB, 64
    levels, the same reasons as ``ingest requests``), except that a line starting as an
    export (``{"resourceSpans": ...``) may be up to :data:`MAX_EXPORT_LINE_BYTES` (a
    collector batch of thousands of spans is several MiB).

    Returns:
        The driver's :class:`~prefixscope.ingest.jsonl_driver.TailResult`: ``rows_read`` counts
        GenAI spans with usage, ``lines_skipped`` blank lines and lines without such spans.

    Raises:
        SourceUnavailable: the file cannot be read.
    """
    source_id = source_id_for(KIND_FILE, str(path))

    def line_rows(raw: bytes) -> LineRows:
        from prefixscope.ingest.otlp_partial import decode_request

        if len(raw) > MAX_LINE_BYTES and not _looks_like_export(raw):
            raise BadLine(None, LINE_TOO_LONG)  # the shared bound, for what is no export
        try:  # a span that cannot be decoded is left out, the others kept (as over HTTP)
            decoded = decode_request(raw, is_json=True)
        except OtlpDecodeError as exc:
            raise BadLine(None, str(exc)) from None
        got = rows_from_request(decoded.request, opts, source_id=source_id)
        problems = [(r.path, r.reason) for r in decoded.rejected] + \
            [(field, reason) for _, field, reason in got.problems]
        return got.rows, (problems[0] if problems else None)

    def note(counts) -> str | None:
        if counts.rows_read == 0 and counts.rows_quarantined == 0:
            return ("no new lines since the last ingest" if counts.start.offset and
                    counts.lines_skipped == 0 else
                    "no GenAI spans with token usage (gen_ai.usage.* / llm.token_count.*)")
        return None

    return ingest_record_lines(con, path, kind=KIND_FILE, line_rows=line_rows,
                               skip_line=_looks_like_other_signal, note=note,
                               max_line_bytes=MAX_EXPORT_LINE_BYTES, keep_problems=keep_problems)


@dataclass(frozen=True, slots=True)
class StoredRequest:
    """Outcome of :func:`store_otlp_request`: spans seen, rows added, already stored,
    rejected (quarantined) and skipped (no usage)."""

    spans: int
    added: int
    duplicate: int
    rejected: int
    skipped: int
    first_problem: str | None


def store_otlp_request(con: duckdb.DuckDBPyConnection, req, opts: SpanOptions, *,
                       location: str, rejected: Sequence[Any] = ()) -> StoredRequest:
    """Store one OTLP/HTTP request's spans in one transaction (rows, quarantine entries, the
    source row and an ``ingest_runs`` record), so the caller acknowledges only what is
    committed. Quarantine entries name ``<location> span <trace>/<span>`` and, as ``line``, a
    63-bit number of the span (:meth:`~prefixscope.ingest.genai_spans.SpanRef.number`): a
    retried bad span is kept once.

    Args:
        rejected: spans the body held that could not be decoded
            (:class:`prefixscope.ingest.otlp_partial.RejectedSpan`): quarantined with the rest,
            counted in ``rejected``.

    Raises:
        Whatever the store raises (nothing of the request is kept).
    """
    from prefixscope.ingest.genai_spans import SpanRef

    started = time.time()
    source_id = source_id_for(KIND_HTTP, location)
    got = rows_from_request(req, opts, source_id=source_id)
    # spans that could not be decoded first; a span without ids is keyed by its path, so a
    # retried export quarantines it once
    undecoded = [(SpanRef(r.trace_id, r.span_id or r.path, r.path), r.path, r.reason)
                 for r in rejected]
    got.problems[:0] = undecoded
    quarantined = [Quarantined(f"{location} span {ref.trace_id}/{ref.span_id}", ref.number(),
                               reason, field) for ref, field, reason in got.problems]
    read = len(got.rows)

    def summary(n: int) -> IngestSummary:
        return IngestSummary(location, KIND_HTTP, read, n, read - n, len(quarantined), None)

    added = commit_batch(con, insert=insert_dict_rows, rows=got.rows, quarantined=quarantined,
                         source_id=source_id, kind=KIND_HTTP, location=location,
                         ingest_run_id=new_ingest_run_id(), checkpoint=None,
                         run_summary=summary, started_unix_s=started)
    first = None
    if got.problems:
        ref, field, reason = got.problems[0]
        first = f"span {ref.trace_id}/{ref.span_id}: {field}: {reason}"
    return StoredRequest(got.spans, added, read - added, len(quarantined), got.skipped, first)
