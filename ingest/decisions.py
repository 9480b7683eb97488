"""Gateway decision-log ingest: JSONL into ``gateway_decisions`` and ``gateway_events``.

One line = one record (format in ``docs/scopes.md#decision-log``):

- a **decision** (``"record": "decision"``, the default): what a cache gateway decided for one
  request — time, request id, scope, namespace digest, decision (``accept``, ``reject``,
  ``miss``), reasons, candidate and accepted cached tokens, and the short digests of the expected
  and the candidate identity;
- a **version event** (``"record": "event"``): a model, tokenizer or adapter upgrade, a policy
  revocation, an epoch bump or a worker restart.

Privacy by construction: every record is decoded against a closed schema (unknown keys are
quarantined, so a ``tenant`` or ``prompt`` key can never slip into a table), namespaces must be
16 lowercase hex characters, digests hex, revisions and epochs integers. A quarantine reason
names the field, never its value.

Decisions join the usage rows of ``requests`` on ``(run_id, request_id)``
(``store/queries/scopes.py``). Reading, checkpoint and the one transaction per file are the
shared JSONL driver's (``ingest/jsonl_driver.py``); the inserts are
``store/queries/decisions.py``. Ingesting is safe to run twice: primary keys plus the file
checkpoint make a second run add nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Annotated, Literal

import duckdb
import msgspec

from prefixscope.ingest.bookkeeping import IngestSummary, Quarantined, source_id_for
from prefixscope.ingest.jsonl_driver import (TAIL_LEFT_NOTE, BadLine, complete_json_tail,
                                             ingest_jsonl_tail, line_parser)
from prefixscope.core.bounds import (MAX_COUNT, MAX_TOKENS, TIME_RANGE, out_of_range_reason,
                                     time_ok, token_bound_reason)
from prefixscope.core.errors import NothingIngested, invalid_json_reason
from prefixscope.core.decision_log import ERROR_CODES
from prefixscope.core.identity import ALL_REASONS
from prefixscope.store.queries.decisions import (  # the column orders are re-exported: parse_line's rows
    DECISION_COLUMNS,  # noqa: F401
    EVENT_COLUMNS,  # noqa: F401
    SHORT_FIELDS,
    insert_decision_rows,
)

KIND = "decisions"
#: Bytes of lines per transaction (each commits its rows, quarantine entries and checkpoint,
#: so a large file never holds one write transaction for long; about 10,000 decisions).
BATCH_BYTES = 4 << 20
FORMAT_VERSION = 1

#: Version events a decision log (or a replay trace) may carry.
EVENT_KINDS = ("model_upgrade", "tokenizer_upgrade", "runtime_upgrade", "adapter_upgrade",
               "prompt_bundle_upgrade", "toolset_upgrade", "policy_revocation",
               "authorization_epoch_bump", "cache_epoch_bump", "worker_restart")

NsDigest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{16}\Z")]
ShortHex = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{0,64}\Z")]
Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]  # summed by the scope rollup
Epoch = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Scope = Literal["PUBLIC", "TENANT", "PRINCIPAL"]
Reason = Literal[ALL_REASONS]  # type: ignore[valid-type]
RunId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:-]{0,128}\Z")]
RequestId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:-]{1,200}\Z")]
Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:/@+-]{1,200}\Z")]


class ShortIdentity(msgspec.Struct, forbid_unknown_fields=True):
    """Short digests of an identity (expected or candidate); every field optional."""

    scope: Scope | None = None
    namespace_digest: NsDigest | None = None
    content_digest: ShortHex | None = None
    model_digest: ShortHex | None = None
    tokenizer_digest: ShortHex | None = None
    runtime_digest: ShortHex | None = None
    adapter_digest: ShortHex | None = None
    prompt_bundle_digest: ShortHex | None = None
    toolset_digest: ShortHex | None = None
    policy_revision: Epoch | None = None
    authorization_epoch: Epoch | None = None
    cache_epoch: Epoch | None = None


class DecisionLine(msgspec.Struct, forbid_unknown_fields=True):
    """One decision record (``docs/scopes.md#decision-log``)."""

    ts_unix_s: float
    request_id: RequestId
    scope: Scope
    namespace_digest: NsDigest
    decision: Literal["accept", "reject", "miss"]
    candidate_cached_tokens: Tokens
    accepted_cached_tokens: Tokens
    reasons: list[Reason] = []
    first_mismatch: Reason | None = None
    record: Literal["decision"] = "decision"
    v: Literal[1] = 1
    run_id: RunId | None = None
    instance: Name | None = None
    model: Name | None = None
    salt_applied: bool | None = None
    candidate_request_id: RequestId | None = None
    expected: ShortIdentity | None = None
    candidate: ShortIdentity | None = None
    error: Literal[ERROR_CODES] | None = None  # type: ignore[valid-type]
    client_salt_replaced: bool | None = None
    candidate_tokens_basis: Literal["exact", "upper_bound"] | None = None
    bypass: bool | None = None


class EventLine(msgspec.Struct, forbid_unknown_fields=True):
    """One version event record (``docs/scopes.md#decision-log``)."""

    record: Literal["event"]
    ts_unix_s: float
    event: Literal[EVENT_KINDS]  # type: ignore[valid-type]
    v: Literal[1] = 1
    run_id: RunId | None = None
    namespace_digest: NsDigest | None = None
    new_value: ShortHex | Epoch | None = None


class _Head(msgspec.Struct):
    record: str = "decision"


_head = msgspec.json.Decoder(_Head)
_dec_decision = msgspec.json.Decoder(DecisionLine)
_dec_event = msgspec.json.Decoder(EventLine)

class _Bad(BadLine):
    """A bad decision-log line: the field at fault and a reason that never quotes the value."""


def _msgspec_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> _Bad:
    text = str(exc)
    field = None
    if " - at `" in text:
        text, _, where = text.partition(" - at `")
        field = where.rstrip("`").removeprefix("$.") or None
        if text == "Number out of range":  # 1e400: past the DOUBLE range
            return _Bad(field, out_of_range_reason(field))
        if field is not None and field.endswith("_tokens"):  # Tokens (epochs: up to 2^62)
            if token_bound_reason(text) != text:
                return _Bad(field, token_bound_reason(text))
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return _Bad(None, invalid_json_reason(exc))  # truncated or not JSON at all
    if field is None and text.startswith("Expected `object`"):
        return _Bad(None, "not a JSON object")  # valid JSON, but an array, string, number...
    if text.startswith("Object contains unknown field"):
        # the key itself is input (it could be a tenant id): say where, never which
        where = field.rsplit(".", 1)[0] if field and "." in field else None
        return _Bad(where, "unknown key (not part of the decision-log format, docs/scopes.md)")
    if text.startswith("Invalid enum value"):
        text = "not one of the allowed values"  # msgspec quotes the value: never store it
    elif "regex" in text:
        # the patterns end in \Z (a "$" would let a trailing newline in); the reason shows
        # them as docs/scopes.md writes them
        text = text.replace("\\\\Z'", "$'")
    elif "'" in text:
        text = text.split("'", 1)[0].strip() or "invalid value"
    return _Bad(field, text[:200])


def _decision_row(rec: DecisionLine, *, source_id: str, line: int, run_id: str) -> tuple:
    reasons = list(rec.reasons)
    if rec.decision == "reject":
        if not reasons:
            raise _Bad("reasons", "a reject needs at least one reason")
        if rec.first_mismatch is not None and rec.first_mismatch != reasons[0]:
            raise _Bad("first_mismatch", "must equal the first entry of reasons")
        if rec.accepted_cached_tokens != 0:
            raise _Bad("accepted_cached_tokens", "must be 0 for a reject")
    else:
        if reasons or rec.first_mismatch is not None:
            raise _Bad("reasons", f"must be empty for {rec.decision}")
    if rec.decision == "miss" and (rec.candidate_cached_tokens or rec.candidate is not None):
        raise _Bad("candidate", "a miss has no candidate")
    if rec.bypass and rec.accepted_cached_tokens != 0:
        # docs/scopes.md: with the bypass on the request went isolated, nothing was accepted
        raise _Bad("accepted_cached_tokens", "must be 0 when bypass is true")
    if rec.accepted_cached_tokens > rec.candidate_cached_tokens:
        raise _Bad("accepted_cached_tokens", "exceeds candidate_cached_tokens")
    if not time_ok(rec.ts_unix_s):
        raise _Bad("ts_unix_s", TIME_RANGE)
    exp = rec.expected or ShortIdentity()
    cand = rec.candidate or ShortIdentity()
    if exp.scope is not None and exp.scope != rec.scope:
        raise _Bad("expected.scope", "differs from scope")
    if exp.namespace_digest is not None and exp.namespace_digest != rec.namespace_digest:
        raise _Bad("expected.namespace_digest", "differs from namespace_digest")
    return (
        rec.run_id if rec.run_id is not None else run_id, rec.request_id, source_id, line,
        float(rec.ts_unix_s), rec.instance, rec.model, rec.scope, rec.namespace_digest,
        rec.decision, reasons[0] if reasons else None, ",".join(reasons),
        rec.candidate_cached_tokens, rec.accepted_cached_tokens, rec.salt_applied,
        *(getattr(exp, f) for f in SHORT_FIELDS),
        rec.candidate_request_id, cand.scope, cand.namespace_digest,
        *(getattr(cand, f) for f in SHORT_FIELDS),
        rec.error, rec.client_salt_replaced, rec.candidate_tokens_basis, rec.bypass,
    )


def _event_row(rec: EventLine, *, source_id: str, line: int, run_id: str) -> tuple:
    if not time_ok(rec.ts_unix_s):
        raise _Bad("ts_unix_s", TIME_RANGE)
    rid = rec.run_id if rec.run_id is not None else run_id
    value = None if rec.new_value is None else str(rec.new_value)
    eid = hashlib.sha256("\x00".join(
        [rid, repr(float(rec.ts_unix_s)), rec.event, rec.namespace_digest or "", value or ""]
    ).encode()).hexdigest()
    return (eid, rid, source_id, line, float(rec.ts_unix_s), rec.event, rec.namespace_digest, value)


def parse_line(raw: bytes, *, source_id: str = "", line: int = 0,
               run_id: str = "") -> tuple[str, tuple]:
    """Decode and validate one JSONL line (pure).

    Returns:
        ``("decision", row)`` or ``("event", row)``, rows in :data:`DECISION_COLUMNS` /
        :data:`EVENT_COLUMNS` order.

    Raises:
        _Bad: with the field at fault and a reason that never quotes the value.
    """
    try:
        head = _head.decode(raw)
        if head.record == "event":
            return "event", _event_row(_dec_event.decode(raw), source_id=source_id, line=line,
                                       run_id=run_id)
        if head.record != "decision":
            raise _Bad("record", "must be 'decision' or 'event'")
        return "decision", _decision_row(_dec_decision.decode(raw), source_id=source_id,
                                         line=line, run_id=run_id)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        # msgspec checks UTF-8 only in the strings it reads (an unknown key may come first)
        # and names no offset: say so with the first bad byte
        if isinstance(exc, msgspec.ValidationError) or "UTF-8" in str(exc):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                raise _Bad(None, invalid_json_reason(bad)) from None
        raise _msgspec_error(exc) from None


def save_decisions(con: duckdb.DuckDBPyConnection, decisions: list[tuple],
                   events: list[tuple]) -> int:
    """Insert decision and event rows (existing keys skipped); returns rows added. Runs inside
    the caller's transaction (``prefixscope.store.queries.decisions.insert_decision_rows``)."""
    return insert_decision_rows(con, decisions, events)


def _insert_tagged(con: duckdb.DuckDBPyConnection, rows: list[tuple[str, tuple]]) -> int:
    """The driver's inserter: rows tagged ``("decision", row)`` / ``("event", row)``."""
    return save_decisions(con, [r for k, r in rows if k == "decision"],
                          [r for k, r in rows if k == "event"])


def ingest_decisions_file(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str], *,
                          run_id: str | None = None) -> IngestSummary:
    """Ingest one gateway decision log; see :func:`ingest_decisions_file_detailed` (this
    returns only its summary)."""
    return ingest_decisions_file_detailed(con, path, run_id=run_id)[0]


def ingest_decisions_file_detailed(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str],
                                   *, run_id: str | None = None,
                                   raise_when_nothing: bool = True
                                   ) -> tuple[IngestSummary, list[Quarantined]]:
    """Ingest one gateway decision log (JSONL) into ``gateway_decisions``/``gateway_events``.

    Everything new since the file's checkpoint is stored in one transaction with its
    quarantine entries, the new checkpoint and the ``ingest_runs`` record
    (:func:`prefixscope.ingest.jsonl_driver.ingest_jsonl_tail`). A final line without newline
    is read when it is complete JSON
    (:func:`prefixscope.ingest.jsonl_driver.complete_json_tail`, the rule of ``ingest
    requests``), else left for the next run and the summary's note says so.

    Args:
        con: read-write connection (migrated), not inside a transaction.
        path: the JSONL file; read from its checkpoint when ingested before.
        run_id: for lines without ``run_id`` (default ``''``: production traffic). Replay
            decision logs carry the replay's run id so they join its usage rows.
        raise_when_nothing: False returns even when every new line was quarantined (the CLI
            prints them first, then fails with :func:`all_quarantined_message`).

    Returns:
        (:class:`IngestSummary`, the lines this call quarantined, file order);
        ``rows_read``/``rows_added`` count decisions + events.

    Raises:
        SourceUnavailable: the file cannot be read.
        NothingIngested: the new lines were all quarantined (they are stored in ``quarantine``
            and the checkpoint moves past them before this is raised).
    """
    location = str(path)
    source_id = source_id_for(KIND, location)
    rid = run_id or ""

    def one_line(raw: bytes, line: int) -> list[tuple[str, tuple]]:
        return [parse_line(raw, source_id=source_id, line=line, run_id=rid)]

    result = ingest_jsonl_tail(con, location, kind=KIND,
                               parse_chunk=line_parser(one_line, location=location),
                               insert=_insert_tagged, batch_bytes=BATCH_BYTES,
                               accept_tail=complete_json_tail)
    summary = result.summary
    try:
        size = os.stat(location).st_size
    except OSError:
        size = result.end.offset
    if size > result.end.offset and not summary.note:  # a final line left for the next run
        summary = dataclasses.replace(summary, note=TAIL_LEFT_NOTE)
    if raise_when_nothing and summary.rows_quarantined and not summary.rows_read:
        raise NothingIngested(all_quarantined_message(summary, result.problems))
    return summary, list(result.problems)


def all_quarantined_message(summary: IngestSummary, problems: list[Quarantined]) -> str:
    """``<file>: all N lines quarantined; the first: file:line: field: reason`` for a decision
    log whose new lines were all quarantined (``problems``: at least the first of them)."""
    from prefixscope.core.errors import problem_text

    first = problems[0]
    return (f"{summary.source}: all {summary.rows_quarantined:,} lines quarantined; the first: "
            f"{problem_text(first.location, first.line, first.reason, first.field)}")
