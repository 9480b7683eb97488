"""SQL fragments shared by the query modules of ``store/queries`` (SQL stays in ``store/``).

One fragment per idea, returned with its bound parameters (values never enter the SQL text);
the column it reads is a name from our own code, checked to be a plain identifier.
"""

from __future__ import annotations

import re

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")


def window_start_sql(ts_column: str, *, window_s: float,
                     origin_s: float = 0.0) -> tuple[str, list[float]]:
    """The start of the time window holding ``ts_column``: ``origin_s + floor((ts - origin_s) /
    window_s) * window_s``.

    Windows are ``[origin_s + k * window_s, origin_s + (k + 1) * window_s)`` for integer ``k``
    (negative before ``origin_s``); ``origin_s = 0`` aligns them to the UTC epoch (whole
    minutes, hours, days in UTC). A time on a boundary starts its window. Used by every
    "per window" query so that all of them cut time the same way (``docs/metrics.md``).

    Args:
        ts_column: the time column, Unix seconds (``ts_unix_s``, ``batch_ts_unix_s``, or
            ``alias.column``); a plain identifier from our own code, never user input.
        window_s: window length, seconds (> 0; the caller has already rejected others with
            its own ``InvalidArgument``).
        origin_s: where windows are aligned, Unix seconds.

    Returns:
        ``(sql, params)``: a parenthesised DOUBLE expression with four ``?`` placeholders and
        their values in order; splice ``sql`` where the expression goes and ``params`` at the
        same position of the statement's parameter list.
    """
    assert _IDENTIFIER.fullmatch(ts_column), f"not a column name: {ts_column!r}"
    assert window_s > 0, "window_s must be > 0 (checked by the caller)"
    o, w = float(origin_s), float(window_s)
    return f"(? + floor(({ts_column} - ?) / ?) * ?)", [o, o, w, w]
