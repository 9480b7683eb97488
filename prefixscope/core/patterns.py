"""User-supplied regular expressions (layout transforms' ``pattern``), matched with a time bound.

A pattern from a file is input like any other: ``(a+)+$`` backtracks for ever in Python's
``re`` on a line of ``a``s ending in another character (ReDoS). Patterns are compiled and matched
with the ``regex`` module (mrab-regex: the ``re`` syntax and replacement templates, plus a
``timeout=``): each match or substitution on one text gets :data:`MATCH_TIMEOUT_S` seconds of
wall time, past which :class:`PatternTimeout` is raised (the caller names the file and field).
"""

from __future__ import annotations

from typing import Any

import regex

#: Wall-clock seconds one search or substitution on one text may take.
MATCH_TIMEOUT_S = 2.0
#: ``regex.M``: ``^``/``$`` match at line breaks.
MULTILINE = regex.M
#: The reason given when a pattern overruns :data:`MATCH_TIMEOUT_S`.
TIMEOUT_REASON = (f"the regular expression took longer than {MATCH_TIMEOUT_S:g} s on one "
                  "message (nested repetition such as (a+)+ backtracks without end): "
                  "rewrite it without nested quantifiers")


class PatternTimeout(Exception):
    """A user-supplied pattern ran past :data:`MATCH_TIMEOUT_S` on one text."""


def compile_pattern(text: str, flags: int = 0) -> Any:
    """``text`` compiled (a ``regex.Pattern``), cached by the ``regex`` module.

    Raises:
        ValueError: not a valid regular expression (the engine's message, e.g. ``missing ),
            unterminated subpattern at position 0``).
    """
    try:
        return regex.compile(text, flags)
    except (regex.error, TypeError, OverflowError, RecursionError) as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None


def search(rx: Any, text: str) -> bool:
    """True when compiled pattern ``rx`` matches somewhere in ``text``.

    Raises:
        PatternTimeout: the search took longer than :data:`MATCH_TIMEOUT_S`.
    """
    try:
        return rx.search(text, timeout=MATCH_TIMEOUT_S) is not None
    except TimeoutError:
        raise PatternTimeout(TIMEOUT_REASON) from None


def sub(rx: Any, replacement: str, text: str) -> str:
    """``rx.sub(replacement, text)`` (``\\1`` / ``\\g<1>`` refer to groups).

    Raises:
        PatternTimeout: the substitution took longer than :data:`MATCH_TIMEOUT_S`.
        ValueError: ``replacement`` refers to a group the pattern does not have.
    """
    try:
        return rx.sub(replacement, text, timeout=MATCH_TIMEOUT_S)
    except TimeoutError:
        raise PatternTimeout(TIMEOUT_REASON) from None
    except (regex.error, IndexError) as exc:
        raise ValueError(f"replacement text: {exc}") from None
