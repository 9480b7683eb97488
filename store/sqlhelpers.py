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
