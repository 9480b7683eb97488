"""Shared parts of the trace readers: problems (skipped records), the per-read bookkeeping and
field checks. The readers live in ``replay/traces.py`` (token ids, chat requests, the entry point)
and ``replay/trace_hashid_readers.py`` (Mooncake/Bailian, kv-cache-tester)."""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixscope.core.bounds import (
    TRACE_LINE_TOO_LONG,
    MAX_COUNT,
    MAX_LINE_BYTES,
    MAX_TRACE_LINE_BYTES,
    TOO_DEEP,
    json_too_deep,
    open_regular,
)
from prefixscope.core.errors import (
    NOT_JSON,
    ParseError,
    SourceUnavailable,
    invalid_json_reason,
    problem_text,
)
from prefixscope.replay.types import TraceRequest


@dataclass(frozen=True, slots=True)
class TraceProblem:
    """A trace record that was skipped (same fields as an ingest quarantine entry).

    Attributes:
        location: file path.
        line: 1-based line (JSONL) or request index + 1 (JSON conversation files).
        reason: short reason; never prompt text.
        field: JSON path at fault, if known.
    """

    location: str
    line: int
    reason: str
    field: str | None = None

    def __str__(self) -> str:
        return problem_text(self.location, self.line, self.reason, self.field)


@dataclass
class TraceReadResult:
    """What :func:`read_trace` returns.

    Attributes:
        requests: the requests, in trace order, produced lazily.
        problems: skipped records, filled *while* ``requests`` is consumed.
        format: the format used (resolved when ``auto``).
        stats: counters filled while reading: ``requests``, ``skipped``, ``chain_violations``
            (hash ids seen again in another context, given a fresh alias).
    """

    requests: Iterator[TraceRequest]
    problems: list[TraceProblem]
    format: str
    stats: dict[str, int] = field(default_factory=dict)


def open_text(path: Path):
    """Open a trace file as UTF-8 text (bytes that are not UTF-8 read as U+FFFD); ``.gz``
    files are decompressed on the fly. Only regular files are opened."""
    raw = open_binary(path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", errors="replace")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


def read_document_text(path: Path, limit: int) -> tuple[str | None, int, int]:
    """A whole trace document (``.gz`` decompressed) as strict UTF-8 text, read no further than
    ``limit`` bytes (a longer one is cut there and then fails to parse as JSON).

    Returns:
        ``(text, 0, 0)``, or ``(None, line, byte)`` for bytes that are not UTF-8: the 1-based
        line of the first bad byte and its 0-based offset within that line (the
        ``not UTF-8 text (byte N)`` of the JSONL readers).

    Raises:
        SourceUnavailable: not a regular file. OSError and :data:`GZIP_ERRORS` from reading.
    """
    raw = open_binary(path)
    with raw, (gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw) as fh:
        data = fh.read(limit + 1)
    try:
        return data.decode("utf-8"), 0, 0
    except UnicodeDecodeError as exc:
        if len(data) > limit and exc.start > limit - 4:  # the cut fell inside a character
            return data[:exc.start].decode("utf-8"), 0, 0
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        return None, data.count(b"\n", 0, exc.start) + 1, exc.start - line_start


def open_binary(path: Path):
    """Open a trace file for binary reading, refusing a FIFO, a device, a socket or a folder
    up front (``prefixscope.core.bounds.open_regular``).

    Raises:
        SourceUnavailable: ``<file>: not a regular file: it is a FIFO (named pipe)`` and the like.
    """
    try:
        return open_regular(path)
    except OSError as exc:
        raise SourceUnavailable(f"{path}: {exc}") from None


#: Largest kv-cache-tester conversation document read, bytes (a longer one is cut there and
#: then fails to parse as JSON).
MAX_DOC_BYTES = 256 << 20
#: Errors of a compressed stream that is corrupt or cut short.
GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
GZIP_CORRUPT = "gzip data is corrupt or cut short: reading stopped at this line"


class _Bad(Exception):
    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


#: Largest token count of one trace request (prompt or output), tokens: 10^8. A larger one is
#: a typing error, and simulating it would run for hours.
MAX_TRACE_TOKENS = 100_000_000
#: Largest trace time (a ``timestamp`` in milliseconds or seconds, ``t``), units of its field.
MAX_TRACE_TIME = 4_102_444_800_000.0


def _int_field(obj: Mapping[str, Any], name: str, *, minimum: int = 0, path: str = "$") -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not value.is_integer()):
        raise _Bad(f"{path}.{name}", "missing or not an integer")
    if value < minimum:
        raise _Bad(f"{path}.{name}", f"must be >= {minimum}")
    if value > MAX_TRACE_TOKENS:
        raise _Bad(f"{path}.{name}", f"more than {MAX_TRACE_TOKENS:,} tokens")
    return int(value)


def _num_field(obj: Mapping[str, Any], name: str, *, path: str = "$") -> float:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f"{path}.{name}", "missing or not a number")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x) or abs(x) > MAX_TRACE_TIME:
        raise _Bad(f"{path}.{name}", f"not a finite number within ±{MAX_TRACE_TIME:.2g}")
    return x


def _id_list(obj: Mapping[str, Any], name: str, *, path: str = "$") -> list[int]:
    ids = obj.get(name)
    # type() is int excludes bool and float; map/set keep this check at C speed.
    if not isinstance(ids, list) or not set(map(type, ids)) <= {int} or \
            (ids and (min(ids) < 0 or max(ids) > MAX_COUNT)):
        raise _Bad(f"{path}.{name}", "missing or not a list of integers from 0 to 2^62")
    return ids


class _Reader:
    """Shared bookkeeping of one read: problems, strictness, output-token policy, stats."""

    def __init__(self, path: Path, *, strict: bool, output_tokens: str, limit: int | None):
        self.path = path
        self.location = str(path)
        self.stem = path.name.split(".")[0] or path.name
        self.strict = strict
        self.keep_output = output_tokens == "trace"
        self.limit = limit
        self.problems: list[TraceProblem] = []
        self.stats = {"requests": 0, "skipped": 0, "chain_violations": 0}

    def bad(self, location: str, line: int, exc: _Bad) -> None:
        if self.strict:
            raise ParseError(location, line, exc.reason, exc.field)
        self.problems.append(TraceProblem(location, line, exc.reason, exc.field))
        self.stats["skipped"] += 1

    def done(self) -> bool:
        return self.limit is not None and self.stats["requests"] >= self.limit

    def jsonl(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, object) for every non-blank line; bad lines are reported here: not
        UTF-8, longer than 16 MiB (a prompt's token ids), nested deeper than 64 levels, not JSON (NaN and Infinity
        are not JSON), a lone surrogate, not an object. A corrupt or truncated ``.gz`` stops
        the read with a problem at the line it reached (the requests before it are kept)."""
        raw_fh = open_binary(self.path)
        fh = gzip.GzipFile(fileobj=raw_fh) if self.path.suffix == ".gz" else raw_fh
        with raw_fh, fh:
            lineno = 0
            while True:
                try:
                    raw = fh.readline(MAX_TRACE_LINE_BYTES + 1)
                    long = len(raw) > MAX_TRACE_LINE_BYTES and not raw.endswith(b"\n")
                    rest = raw
                    while long and rest and not rest.endswith(b"\n"):
                        # Skip the rest, never held whole; a last line without its newline
                        # ends at EOF (b""), and is still reported below as too long.
                        rest = fh.readline(MAX_LINE_BYTES)  # 1 MiB steps
                except GZIP_ERRORS:
                    self.bad(self.location, lineno + 1, _Bad(None, GZIP_CORRUPT))
                    return
                except OSError as exc:
                    raise SourceUnavailable(f"{self.location}: cannot read "
                                            f"({exc.strerror or exc})") from None
                if not raw:
                    return
                lineno += 1
                if long or len(raw.rstrip(b"\r\n")) > MAX_TRACE_LINE_BYTES:
                    self.bad(self.location, lineno, _Bad(None, TRACE_LINE_TOO_LONG))
                    continue
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                if not raw.strip():
                    continue
                obj = self._decode(raw, lineno)
                if obj is not None:
                    yield lineno, obj

    def _decode(self, raw: bytes, lineno: int) -> dict[str, Any] | None:
        """One JSONL line as an object, or None after reporting why it is not one."""
        try:
            # without its newline: a line cut short is at fault at its end (byte N of this
            # line), not at byte 0 of a second line json.loads would otherwise count
            text = raw.rstrip(b"\r\n").decode("utf-8")
        except UnicodeDecodeError as exc:  # (byte N): within the line, as the ingesters say
            self.bad(self.location, lineno, _Bad(None, invalid_json_reason(exc)))
            return None
        if json_too_deep(raw):
            self.bad(self.location, lineno, _Bad(None, TOO_DEEP))
            return None
        try:
            obj = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            self.bad(self.location, lineno, _Bad(None, invalid_json_reason(exc)))
            return None
        except _NonFinite:
            self.bad(self.location, lineno, _Bad(None, NON_FINITE_JSON))
            return None
        except ValueError:  # an integer of more than 4,300 digits
            self.bad(self.location, lineno, _Bad(None, LONG_NUMBER_JSON))
            return None
        if not isinstance(obj, dict):
            self.bad(self.location, lineno, _Bad("$", "not a JSON object"))
            return None
        if _SURROGATE.search(text) and _has_lone_surrogate(obj):
            self.bad(self.location, lineno, _Bad(None, f"{NOT_JSON}: a lone UTF-16 surrogate "
                                                       "escape (not Unicode text)"))
            return None
        return obj


_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _has_lone_surrogate(obj: Any) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _NonFinite(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in JSON text (Python's parser accepts them)."""


NON_FINITE_JSON = f"{NOT_JSON}: NaN and Infinity are not JSON numbers"
#: Bytes that are not UTF-8, before `` (byte N)`` (0-based, within the line).
NOT_UTF8_JSON = f"{NOT_JSON}: not UTF-8 text"
LONG_NUMBER_JSON = f"{NOT_JSON}: a number of more than 4,300 digits"


def _no_constant(name: str) -> Any:
    raise _NonFinite(name)


