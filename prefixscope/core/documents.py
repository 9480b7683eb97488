"""Whole documents read at once: config files, price tables, layouts, manifests, token lists.

Line-oriented sources (JSONL logs, expositions, traces) are streamed by their readers; the files
here are small documents a user or a tool wrote, read whole and parsed once. One reader for all
of them, so every such file gets the same bounds (``docs/ingest.md#bounds``) and words:

- only a regular file is opened (:func:`prefixscope.core.bounds.open_regular`: a FIFO, a device
  such as ``/dev/zero``, a socket or a folder is refused with its kind named, never read);
- at most :data:`prefixscope.core.bounds.MAX_DOCUMENT_BYTES` are read (a larger file is refused
  without being held whole);
- the text is strict UTF-8 (a leading BOM is dropped); invalid bytes are refused with their
  offset;
- TOML, JSON and YAML nested deeper than :data:`prefixscope.core.bounds.MAX_DEPTH` levels are
  refused (the parsers recurse: a RecursionError at about 1,000 levels).

Every reason names a position (line, column, byte) and never quotes the document's text.
"""

from __future__ import annotations

import codecs
import json
import os
import tomllib
from typing import Any

from prefixscope.core.bounds import (
    DOCUMENT_TOO_LARGE,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    TOO_DEEP,
    NotReadable,
    json_too_deep,
    open_regular,
)
from prefixscope.core.errors import ConfigError, ParseError, SourceUnavailable, invalid_json_reason


class DocumentError(ValueError):
    """A document that cannot be read or parsed.

    ``str()`` is the reason without the path (callers prefix it in their own error type);
    :attr:`missing` is True when the path does not exist; :attr:`unreadable` when the file could
    not be read at all (missing, not a regular file, an OS error: a source problem, not a
    content problem); :attr:`line` is the 1-based line of a parse error when known.
    """

    def __init__(self, reason: str, *, missing: bool = False, unreadable: bool = False,
                 line: int | None = None) -> None:
        super().__init__(reason)
        self.missing = missing
        self.unreadable = unreadable or missing
        self.line = line


def _too_deep(kind: str) -> str:
    return TOO_DEEP.replace("JSON", kind)  # one wording: "<kind> nested deeper than 64 levels"


def read_document(path: str | os.PathLike[str], *, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The whole text of a small document.

    Args:
        path: a regular file.
        limit: largest size read, bytes (default :data:`MAX_DOCUMENT_BYTES`, 16 MiB).

    Returns:
        The decoded text (UTF-8, a leading BOM removed).

    Raises:
        DocumentError: no such file (``missing``), not a regular file (its kind named) or an OS
            error (both ``unreadable``); larger than ``limit`` or not UTF-8 (the byte offset).
    """
    try:
        with open_regular(path) as fh:
            data = fh.read(limit + 1)
    except NotReadable as exc:
        raise DocumentError(str(exc), missing=str(exc) == "no such file", unreadable=True) from None
    except OSError as exc:
        raise DocumentError(f"cannot read: {exc.strerror or exc}", unreadable=True) from None
    if len(data) > limit:
        reason = DOCUMENT_TOO_LARGE if limit == MAX_DOCUMENT_BYTES else \
            f"larger than {limit:,} bytes"
        raise DocumentError(reason)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DocumentError(f"not UTF-8 text (byte {exc.start})", line=line) from None


def parse_toml(text: str, **kwargs: Any) -> dict[str, Any]:
    """Parse TOML text (``kwargs`` go to :func:`tomllib.loads`, e.g. ``parse_float``).

    Raises:
        DocumentError: not valid TOML (tomllib's message, which gives line and column and quotes
            no text), or nested deeper than :data:`MAX_DEPTH`.
    """
    if json_too_deep(text):  # TOML's inline arrays and tables use the same brackets
        raise DocumentError(_too_deep("TOML"))
    try:
        return tomllib.loads(text, **kwargs)
    except tomllib.TOMLDecodeError as exc:
        raise DocumentError(f"not valid TOML: {exc}", line=getattr(exc, "lineno", None)) from None
    except RecursionError:  # brackets inside TOML string forms the JSON scan does not know
        raise DocumentError(_too_deep("TOML")) from None


def parse_json(text: str) -> Any:
    """Parse one JSON document.

    Raises:
        DocumentError: not valid JSON (the shared ``not valid JSON: ... (byte N)`` wording, with
            the line), or nested deeper than :data:`MAX_DEPTH`.
    """
    if json_too_deep(text):
        raise DocumentError(TOO_DEEP)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(invalid_json_reason(exc), line=exc.lineno) from None
    except RecursionError:
        raise DocumentError(TOO_DEEP) from None


def parse_yaml(text: str) -> Any:
    """Parse one YAML document with ``yaml.safe_load``.

    Raises:
        DocumentError: not valid YAML (the parser's problem and its line and column only: the
            parser's own message quotes the offending text), or nested deeper than
            :data:`MAX_DEPTH`.
    """
    import yaml

    if json_too_deep(text):  # flow sequences and mappings use [] and {}
        raise DocumentError(_too_deep("YAML"))
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        line = mark.line + 1 if mark is not None else None
        raise DocumentError(f"not valid YAML: {exc.problem or 'parse error'}{where}",
                            line=line) from None
    except yaml.YAMLError:
        raise DocumentError("not valid YAML") from None
    except RecursionError:
        raise DocumentError(_too_deep("YAML")) from None


def _source_error(path: str | os.PathLike[str], exc: DocumentError, what: str) -> SourceUnavailable:
    if exc.missing:
        return SourceUnavailable(f"{path}: no such {what}")
    return SourceUnavailable(f"{path}: cannot read: {exc}")


def load_json_file(path: str | os.PathLike[str], *, what: str = "file") -> Any:
    """Read and parse one JSON document (:func:`read_document` + :func:`parse_json`).

    Args:
        path: the file. what: its kind for the "no such ..." message (e.g. ``"manifest"``).

    Raises:
        SourceUnavailable: missing, not a regular file, unreadable (exit 3).
        ParseError: too large, not UTF-8, not JSON, too deep (``file:line: reason``, exit 4).
    """
    try:
        return parse_json(read_document(path))
    except DocumentError as exc:
        if exc.unreadable:
            raise _source_error(path, exc, what) from None
        raise ParseError(str(path), exc.line, str(exc)) from None


def load_summary_file(path: str | os.PathLike[str], *, unreadable: str = "") -> Any:
    """Read and parse one JSON summary a replay run wrote for ingest (``breakers.json``,
    ``ledger.json``, ``run.json``); ``unreadable`` goes before the reader's words when the
    file cannot be read (``run.json``: ``"cannot read: "``).

    Raises:
        SourceUnavailable: missing, not a regular file, unreadable (exit 3; the reader's words).
        ConfigError: too large, not UTF-8, not JSON, too deep (``file:line: reason``, exit 2).
    """
    from prefixscope.core.errors import problem_text

    try:
        return parse_json(read_document(path))
    except DocumentError as exc:
        if exc.unreadable:
            raise SourceUnavailable(f"{path}: {unreadable}{exc}") from None
        raise ConfigError(problem_text(str(path), exc.line, str(exc))) from None


def load_config_file(path: str | os.PathLike[str], *, what: str = "file", parse=None,
                     limit: int = MAX_DOCUMENT_BYTES, **kwargs: Any) -> Any:
    """Read and parse one configuration document: TOML by default (``kwargs`` go to
    :func:`parse_toml`), or with ``parse`` (e.g. :func:`parse_json`, :func:`parse_yaml`, or
    ``str`` for the text itself) another format, with the same errors.

    Args:
        limit: largest size read, bytes (default :data:`MAX_DOCUMENT_BYTES`, 16 MiB; larger
            for documents that grow with use, such as the gateway's state file).

    Raises:
        SourceUnavailable: missing (``no such <what>``), not a regular file, unreadable (exit 3).
        ConfigError: too large, not UTF-8, not parsable, too deep (``file: reason``, exit 2).
    """
    try:
        return (parse or parse_toml)(read_document(path, limit=limit), **kwargs)
    except DocumentError as exc:
        if exc.unreadable:
            raise _source_error(path, exc, what) from None
        raise ConfigError(f"{path}: {exc}") from None


__all__ = ["load_config_file", "load_json_file", "load_summary_file", "DocumentError", "MAX_DEPTH", "parse_json",
           "parse_toml", "parse_yaml", "read_document"]
