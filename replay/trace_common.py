"""Shared parts of the trace readers: problems (skipped records), the per-read bookkeeping and
field checks. The readers live in ``replay/traces.py`` (token ids, chat requests, the entry point)
and ``replay/trace_hashid_readers.py`` (Mooncake/Bailian, kv-cache-tester)."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixscope.core.errors import ParseError, invalid_json_reason, problem_text
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
    """Open a trace file as UTF-8 text; ``.gz`` files are decompressed on the fly."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


class _Bad(Exception):
    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def _int_field(obj: Mapping[str, Any], name: str, *, minimum: int = 0, path: str = "$") -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not value.is_integer()):
        raise _Bad(f"{path}.{name}", "missing or not an integer")
    if value < minimum:
        raise _Bad(f"{path}.{name}", f"must be >= {minimum}")
    return int(value)


def _num_field(obj: Mapping[str, Any], name: str, *, path: str = "$") -> float:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Bad(f"{path}.{name}", "missing or not a number")
    return float(value)


def _id_list(obj: Mapping[str, Any], name: str, *, path: str = "$") -> list[int]:
    ids = obj.get(name)
    # type() is int excludes bool and float; map/set keep this check at C speed.
    if not isinstance(ids, list) or not set(map(type, ids)) <= {int} or (ids and min(ids) < 0):
        raise _Bad(f"{path}.{name}", "missing or not a list of non-negative integers")
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
        """(line number, object) for every non-blank line; bad JSON is reported here."""
        with open_text(self.path) as fh:
            for lineno, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    self.bad(self.location, lineno, _Bad(None, invalid_json_reason(exc)))
                    continue
                if not isinstance(obj, dict):
                    self.bad(self.location, lineno, _Bad("$", "not a JSON object"))
                    continue
                yield lineno, obj


