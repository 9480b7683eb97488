"""SQL fragments shared by the query modules of ``store/queries`` (SQL stays in ``store/``).

One fragment per idea, returned with its bound parameters (values never enter the SQL text);
the column it reads is a name from our own code, checked to be a plain identifier.
"""

from __future__ import annotations

import math
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


def insert_rows_bulk(con, table: str, columns, rows, *, conflict: str = "ON CONFLICT DO NOTHING"
                     ) -> None:
    """Insert many row tuples in one statement through an Arrow table (``executemany`` inserts
    a row at a time, about 300 rows/s; this is thousands of times faster).

    Args:
        con: a DuckDB connection (inside the caller's transaction).
        table: target table (a plain identifier from our own code).
        columns: the column names, in the order of each row tuple.
        rows: tuples; Python ints, floats, strings, bools and None (a column of only None is
            inserted as NULL of the target type).
        conflict: the ``ON CONFLICT`` clause.
    """
    import pyarrow as pa

    rows = list(rows)
    if not rows:
        return
    for name in (table, *columns):
        if not _IDENTIFIER.fullmatch(name):
            raise ValueError(f"not a plain identifier: {name!r}")
    cols = list(zip(*rows))
    _prefixscope_bulk_rows = pa.table(  # noqa: F841 - read by DuckDB's replacement scan
        {name: pa.array(list(values)) for name, values in zip(columns, cols)})
    names = ", ".join(columns)
    # a replacement scan of the local Arrow table (register() would refuse while a caller's
    # earlier result is unfinished)
    con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM _prefixscope_bulk_rows "
                f"{conflict}").fetchall()


class BucketSplit:
    """A time range cut into whole rollup buckets and the part ranges at either end
    (:func:`bucket_split`): every rollup-backed query reads its rollup for ``[lo, hi)`` and
    raw rows for :attr:`head` and :attr:`tail`, so that the sum equals the raw query.

    Attributes:
        lo: start of the first whole bucket, Unix s (None: unbounded below).
        hi: end of the last whole bucket, Unix s (None: unbounded above).
        head: ``(start_s, lo)`` of the raw part before the whole buckets (``start_s`` None =
            from the oldest row: the range reaches before a rollup's floor), or None.
        tail: ``(hi, end_s)`` of the raw part after them, or None.
    """

    __slots__ = ("lo", "hi", "head", "tail")

    def __init__(self, lo: float | None, hi: float | None, head: tuple | None,
                 tail: tuple | None):
        self.lo, self.hi, self.head, self.tail = lo, hi, head, tail

    def whole_where(self, column: str = "bucket_start_s", *,
                    null_below: bool = False) -> tuple[str, list[float]]:
        """``(sql, params)``: the condition selecting the whole buckets on ``column`` (a plain
        identifier); ``TRUE`` when unbounded. ``null_below``: a NULL bucket (rows without a
        time) also passes the lower bound (for a range open below)."""
        assert _IDENTIFIER.fullmatch(column), f"not a column name: {column!r}"
        parts, params = [], []
        if self.lo is not None:
            parts.append(f"({column} >= ? OR {column} IS NULL)" if null_below
                         else f"{column} >= ?")
            params.append(self.lo)
        if self.hi is not None:
            parts.append(f"{column} < ?")
            params.append(self.hi)
        return (" AND ".join(parts) or "TRUE"), params


def bucket_split(start_s: float | None, end_s: float | None, step_s: float, *,
                 floor_s: float | None = None) -> BucketSplit | None:
    """Cut ``[start_s, end_s)`` (None = unbounded) into the whole buckets of ``step_s``
    seconds (aligned to the Unix epoch) and the parts at either end; with ``floor_s`` (the
    time before which a rollup was dropped, ``archive.rollup_floor``) the whole buckets start
    no earlier than it and the head part reaches back from it to ``start_s``.

    Used by the rollup readers of ``store/queries/requests.py`` (1-minute and daily),
    ``metrics.py`` (5-minute counters) and ``scopes.py`` (5-minute scopes): one rule for all.

    Returns:
        The split, or None when the rollup cannot serve the range: it lies inside one bucket
        (no whole bucket and the two parts would overlap), or wholly before ``floor_s``.
    """
    step = float(step_s)
    lo = None if start_s is None else math.ceil(float(start_s) / step) * step
    hi = None if end_s is None else math.floor(float(end_s) / step) * step
    if floor_s is not None:
        if hi is not None and hi <= floor_s:
            return None
        if lo is None or lo < floor_s:
            lo = float(floor_s)
    if lo is not None and hi is not None and lo > hi:
        return None
    head = None
    if lo is not None and (start_s is None or lo > float(start_s)):
        head = (None if start_s is None else float(start_s), lo)
    tail = (hi, float(end_s)) if end_s is not None and hi < float(end_s) else None
    return BucketSplit(lo, hi, head, tail)
