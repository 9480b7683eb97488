"""Error types of prefixscope.

One base class, :class:`PrefixscopeError`, and subclasses named for the condition. The CLI turns
any of them into a one-line message and a non-zero exit code; users never see a traceback for
an expected condition. Bugs are assertions, not these.
"""

from __future__ import annotations

import json
import re

#: The reason every reader (ingest and replay) gives for a line or file that is not JSON.
NOT_JSON = "not valid JSON"


def problem_text(source: str, line: int | None, reason: str, field: str | None = None) -> str:
    """The one wording of a bad record, for errors, quarantine lines and skipped trace records:
    ``file:line: field: reason`` (``file: ...`` without a line, no ``field:`` part without a
    field; an empty field counts as none)."""
    where = source if line is None else f"{source}:{line}"
    return f"{where}: {field}: {reason}" if field else f"{where}: {reason}"


def invalid_json_reason(exc: ValueError, raw: bytes | None = None) -> str:
    """The reason for a JSON decode error, the same words whichever decoder failed:
    ``not valid JSON: <decoder's message> (byte N)``.

    Args:
        exc: a :class:`json.JSONDecodeError` (stdlib; ``N`` is then the 0-based byte offset of
            the error within its line, as msgspec reports it for a one-line document) or a
            ``msgspec.DecodeError`` (its message already ends in ``(byte N)`` where it knows
            the offset, e.g. ``JSON is malformed: trailing characters (byte 8)``).

        raw: the bytes that failed to decode, when the caller has them: an invalid UTF-8
            sequence (msgspec: ``Invalid UTF-8 encoded string``, no offset) is then
            ``not valid JSON: not UTF-8 text (byte N)`` with its first bad byte, as a
            :class:`UnicodeDecodeError` is (the wording of the KV-event and trace readers).

    Returns:
        The reason; it quotes no input text (only the decoder's description and an offset).
    """
    if isinstance(exc, UnicodeDecodeError):
        return f"{NOT_JSON}: not UTF-8 text (byte {exc.start})"
    text = str(exc)
    if raw is not None:
        # an invalid UTF-8 sequence at or before the decoder's error is the reason: msgspec
        # says "Invalid UTF-8 encoded string" without an offset inside a string, and
        # "invalid character (byte N)" for one outside a string
        at = re.search(r"\(byte (\d+)\)$", text)
        if at is not None or "UTF-8" in text:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                if at is None or bad.start <= int(at.group(1)):
                    return f"{NOT_JSON}: not UTF-8 text (byte {bad.start})"
    if isinstance(exc, json.JSONDecodeError):
        line_start = exc.doc.rfind("\n", 0, exc.pos) + 1
        offset = len(exc.doc[line_start:exc.pos].encode("utf-8", "surrogatepass"))
        return f"{NOT_JSON}: {exc.msg} (byte {offset})"
    return f"{NOT_JSON}: {text}"


class PrefixscopeError(Exception):
    """Base class of every expected error prefixscope raises."""

    exit_code: int = 1


class ConfigError(PrefixscopeError):
    """A configuration value or file is missing or invalid (names the key and the file)."""

    exit_code = 2


class InvalidArgument(PrefixscopeError):
    """A library function was given a value it cannot work with (a non-positive window, an
    unknown grouping column, a start after the end). The CLI reports it as a usage error."""

    exit_code = 2


class UsageError(InvalidArgument):
    """Command-line arguments that cannot work together (e.g. ``--start`` after ``--end``)."""


class SourceUnavailable(PrefixscopeError):
    """A source (file, URL, database, server) could not be read at all."""

    exit_code = 3


class ParseError(PrefixscopeError):
    """A record of a source could not be parsed.

    Carries where it happened so that the quarantine and the message can name it:

    Attributes:
        source: file path or URL of the source.
        line: 1-based line number in the source, or None when the source has no lines.
        field: the JSON path or metric/label name at fault, or None.
        reason: a short human-readable reason. Never contains prompt text or tenant ids.
    """

    exit_code = 4

    def __init__(self, source: str, line: int | None, reason: str, field: str | None = None):
        self.source = source
        self.line = line
        self.field = field
        self.reason = reason
        super().__init__(problem_text(source, line, reason, field))


class NothingIngested(PrefixscopeError):
    """Every record of every given source was unreadable; the message says why."""

    exit_code = 4


class SchemaMismatch(PrefixscopeError):
    """The database was written by a newer prefixscope (unknown migration) or is not ours."""

    exit_code = 5


class StoreLocked(PrefixscopeError):
    """The DuckDB file stayed locked by another process for longer than the retry budget."""

    exit_code = 6


class SimulationError(PrefixscopeError):
    """A replay configuration the exact simulator cannot model (names the unsupported feature)."""

    exit_code = 7


class StoreFull(PrefixscopeError):
    """The database could not be written: the device (or the user's quota) is full. What was
    committed before is kept; the transaction in progress was rolled back."""

    exit_code = 8

