"""The dashboard's tables, drawn in one place: :func:`show_table` (human column names, one
cell format, status as coloured text, the caption, and the table as shown as CSV or Parquet).

Every page draws its tables with :func:`show_table`; the rules live in :func:`table_frame`
(pure, unit-tested):

1. Column names are for people: a store column (``prompt_tokens``, ``run_id``) reads as
   :data:`COLUMN_NAMES` says (``Prompt tokens``, ``Run``), any other name gets its ``_`` turned
   into spaces and its first letter capitalised (``hit rate`` -> ``Hit rate``). Never snake case.
2. Cells: counts (integer columns, and float columns holding whole numbers) with thousands
   separators, lists joined with ``, `` (:func:`prefixscope.core.formatting.fmt_int`); other numbers with separators and
   two decimals; times as ``YYYY-MM-DD HH:MM:SS UTC``; booleans ``yes`` / ``no``; a missing
   value (None, NaN, NaT, or the text ``None`` / ``nan``) as an em dash, never as 0 or "None".
   Percents arrive formatted by the page with :func:`prefixscope.core.formatting.fmt_pct`
   (the one percent format).
3. A ``Status`` column (OK / ALERT / NO DATA / STALE / INCONSISTENT; sent / failed) is text in
   its colour (:data:`STATUS_CSS`): emoji need fonts a server may lack.
4. Every column is visible without scrolling sideways at a 1400 px window: when the columns'
   natural widths (header or longest cell, :func:`fit_widths`) add up to more than
   :data:`TABLE_WIDTH_PX`, the narrow columns keep theirs and the wide ones (a report line, a
   run label) share the rest, their long cells cut with an ellipsis (the whole text shows on
   hover and is in the download). A width the page gives in ``column_config`` is kept.

The CSV and Parquet buttons export the frame exactly as shown (same headers, same cells). The
frame is the page's already-aggregated table (at most a page of rows: per model, per window,
per bucket), so nothing per request leaves the store that the page did not already show; whole
tables are exported with ``prefixscope export`` (DuckDB ``COPY``).
"""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd

from prefixscope.core.formatting import MISSING, csv_safe_frame, fmt_int, fmt_time

#: Store column -> the name a table shows (rule 1 of the module docstring). Names not listed
#: get the generic rule (:func:`human_column`).
COLUMN_NAMES: dict[str, str] = {
    "run_id": "Run", "request_id": "Request id", "ts_unix_s": "Time", "time": "Time",
    "model": "Model", "instance": "Instance", "scope": "Scope",
    "namespace_digest": "Namespace digest", "decision": "Decision",
    "first_mismatch": "First mismatch", "reasons": "Reasons",
    "candidate_request_id": "Candidate request id", "candidate_scope": "Candidate scope",
    "candidate_namespace_digest": "Candidate namespace digest",
    "candidate_cached_tokens": "Candidate cached tokens",
    "accepted_cached_tokens": "Accepted cached tokens", "prompt_tokens": "Prompt tokens",
    "cached_tokens": "Cached tokens", "requests": "Requests", "rejects": "Rejected",
    "reject_fraction": "Rejected share", "top_reason": "Top reason",
    "lost_candidate_tokens": "Candidate tokens refused", "event": "Event",
    "new_value": "New value", "ttft_ms": "TTFT (ms)", "latency_ms": "Latency (ms)",
    "hit_rate": "Hit rate",
}

#: Status word -> CSS colour of its text (the email's colours; GitHub's palette).
STATUS_CSS: dict[str, str] = {
    "OK": "#1a7f37", "ALERT": "#cf222e", "NO DATA": "#57606a", "STALE": "#9a6700",
    "INCONSISTENT": "#cf222e", "sent": "#1a7f37", "failed": "#cf222e",
}
#: Columns whose cells are status words, coloured by :data:`STATUS_CSS`.
STATUS_COLUMNS = ("Status", "Report status")
_ACRONYMS = {"ttft": "TTFT", "itl": "ITL", "kv": "KV", "gpu": "GPU", "id": "id", "url": "URL",
             "ms": "ms"}


#: The width (px) the main area gives a full-width table at a 1400 px browser window with the
#: sidebar open (layout "wide"; measured in headless Chromium: about 940 px).
TABLE_WIDTH_PX = 920
#: Average width (px) of one character of a cell or a header in the dashboard's table font
#: (Source Sans, 14 px: about 5 px a header letter, 6 a text and 7 a digit in headless
#: Chromium; a little more, so a column is never too narrow), and the padding of a cell.
CHAR_PX = 6.6
CELL_PAD_PX = 18
#: A column never gets less than this (px) when widths are shared out.
MIN_COLUMN_PX = 60
#: Characters of a header a narrowed column still shows whole.
HEADER_CHARS = 12
#: A column at most this wide (px) keeps its natural width while wider ones give way.
SHORT_COLUMN_PX = 110


def natural_width(header: str, cells: pd.Series) -> int:
    """The width (px) a column needs to show its header and its longest cell (the first 1,000
    cells) on one line: characters x :data:`CHAR_PX` + :data:`CELL_PAD_PX`."""
    longest = int(cells.head(1000).astype(str).map(len).max()) if len(cells) else 0
    return int(round(max(len(str(header)), longest) * CHAR_PX + CELL_PAD_PX))


def fit_widths(frame: pd.DataFrame, *, budget_px: int = TABLE_WIDTH_PX,
               fixed: dict[str, int] | None = None) -> dict[str, int]:
    """Column widths (px) that fit ``budget_px`` (rule 4). Pure.

    {} when the natural widths (:func:`natural_width`) already fit. Else every column keeps a
    floor (its natural width when at most :data:`SHORT_COLUMN_PX`, else its header up to
    :data:`HEADER_CHARS` characters, at least :data:`MIN_COLUMN_PX`) and the widest columns
    are cut to one common cap, the largest that fits: ``width = max(floor, min(natural,
    cap))``. So a long text (a report line, a file location, a run label) gives way first and
    times and counts keep their width. When even the floors do not fit, the floors are
    water-filled: columns under an equal share keep theirs, the others share the rest
    equally.

    Args:
        frame: the table as shown (:func:`table_frame`).
        budget_px: the table's width.
        fixed: widths the page set (kept, counted in the budget, not returned).
    """
    fixed = {c: int(w) for c, w in (fixed or {}).items() if c in frame.columns}
    natural = {c: natural_width(c, frame[c]) for c in frame.columns if c not in fixed}
    left = budget_px - sum(fixed.values())
    if not natural or sum(natural.values()) <= left:
        return {}
    floor = {c: n if n <= SHORT_COLUMN_PX else
             min(n, max(MIN_COLUMN_PX, int(round(min(len(str(c)), HEADER_CHARS) * CHAR_PX
                                                 + CELL_PAD_PX))))
             for c, n in natural.items()}
    if sum(floor.values()) < left:
        def total(cap: int) -> int:
            return sum(max(floor[c], min(natural[c], cap)) for c in natural)

        lo, hi = 0, max(natural.values())  # total(lo) <= left < total(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if total(mid) <= left else (lo, mid)
        return {c: max(floor[c], min(natural[c], lo)) for c in natural}
    out: dict[str, int] = {}
    pending = sorted(floor, key=lambda c: floor[c])
    while pending:
        share = left / len(pending)
        c = pending[0]
        if floor[c] <= share:
            out[c] = floor[c]
            left -= floor[c]
            pending.pop(0)
            continue
        for c in pending:
            out[c] = max(MIN_COLUMN_PX, int(share))
        break
    return out


def _with_widths(frame: pd.DataFrame, column_config: dict | None) -> dict:
    """``column_config`` with a width for every column :func:`fit_widths` narrows (a width the
    page set, or a column it hid, is kept)."""
    config = dict(column_config or {})
    fixed = {}
    for name, cfg in config.items():
        if isinstance(cfg, dict) and isinstance(cfg.get("width"), int):
            fixed[name] = cfg["width"]
        elif isinstance(cfg, dict) and cfg.get("width") in ("small", "medium", "large"):
            fixed[name] = {"small": 75, "medium": 200, "large": 400}[cfg["width"]]
        elif cfg is None:  # hidden
            fixed[name] = 0
    for name, width in fit_widths(frame, fixed=fixed).items():
        cfg = config.get(name)
        if isinstance(cfg, str):  # a label only
            cfg = {"label": cfg}
        config[name] = {**(cfg or {}), "width": width}
    return config


def human_column(name: object) -> str:
    """The name a table shows for column ``name``: :data:`COLUMN_NAMES`, else ``_`` as spaces,
    known acronyms upper-cased (``ttft`` -> ``TTFT``) and the first letter capitalised:
    ``'reported prompt tokens' -> 'Reported prompt tokens'``, ``'p90_ms' -> 'P90 ms'``."""
    text = str(name)
    if text in COLUMN_NAMES:
        return COLUMN_NAMES[text]
    words = [_ACRONYMS.get(w.lower(), w) for w in text.replace("_", " ").split()]
    out = " ".join(words)
    return out[:1].upper() + out[1:] if out else out


def _is_missing(v: object) -> bool:
    if v is None or v is pd.NaT or v is pd.NA:
        return True
    if isinstance(v, float) and v != v:
        return True
    return isinstance(v, str) and v.strip().lower() in ("none", "nan", "nat", "null", "<na>")


def _cell(v: object) -> object:
    """One object-column cell as shown: text as given, missing as an em dash, numbers and
    times by rule 2."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return ", ".join(str(_cell(x)) for x in v) if len(v) else MISSING
    if _is_missing(v):
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, pd.Timestamp):
        return v.strftime("%Y-%m-%d %H:%M:%S UTC")
    if isinstance(v, (int, np.integer)):
        return fmt_int(v)
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return fmt_int(v) if v.is_integer() else f"{v:,.2f}"
    return v if isinstance(v, str) else str(v)


def table_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as a table shows it and its download exports it (rules 1 and 2 of the module
    docstring): human column names, every cell text (counts with thousands separators, missing
    values as ``—``). Pure; the input is not changed.

    Raises:
        ValueError: two columns end up with one name (the page named them twice).
    """
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        s = df[col]
        if pd.api.types.is_bool_dtype(s):
            shown = s.map(_cell)
        elif pd.api.types.is_integer_dtype(s):
            shown = s.map(lambda v: MISSING if _is_missing(v) else fmt_int(v))
        elif pd.api.types.is_float_dtype(s):
            whole = bool(s.dropna().map(float.is_integer).all())
            shown = s.map(lambda v, whole=whole: MISSING if _is_missing(v) else
                          (fmt_int(v) if whole else f"{float(v):,.2f}"))
        elif pd.api.types.is_datetime64_any_dtype(s):
            shown = s.map(lambda v: MISSING if _is_missing(v) else
                          pd.Timestamp(v).strftime("%Y-%m-%d %H:%M:%S UTC"))
        else:
            shown = s.astype("object").map(_cell)
        name = human_column(col)
        if name in out.columns:
            raise ValueError(f"two columns named {name!r} in one table")
        out[name] = shown.astype("object")
    return out.reset_index(drop=True)


def status_style(value: object) -> str:
    """The CSS of a status cell: its colour (:data:`STATUS_CSS`) in bold; '' for other text."""
    colour = STATUS_CSS.get(str(value))
    return f"color: {colour}; font-weight: bold" if colour else ""


def utc_column(ts_unix_s: pd.Series) -> pd.Series:
    """Unix seconds as the table's time text (``2026-11-28 10:00:05 UTC``; ``—`` when missing)."""
    return ts_unix_s.map(lambda t: fmt_time(t, seconds=True))


def csv_bytes(df: pd.DataFrame) -> bytes:
    """The frame as UTF-8 CSV with a header row, without the index; a text cell a spreadsheet
    would run as a formula (``= + - @``, tab, CR first) gets a leading apostrophe
    (:func:`prefixscope.core.formatting.csv_safe_frame`, the OWASP CSV-injection rule)."""
    return csv_safe_frame(df).to_csv(index=False).encode("utf-8")


def parquet_bytes(df: pd.DataFrame) -> bytes:
    """The frame as a Parquet file (pyarrow), without the index."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def download_button(df: pd.DataFrame, name: str, *, label: str = "CSV") -> None:
    """Two buttons under a table: ``<name>.csv`` and ``<name>.parquet``.

    Args:
        df: the table as shown (object columns of mixed types become text in Parquet).
        name: file stem, e.g. ``savings-by-model`` (letters, digits, ``-`` and ``_`` kept).
        label: the CSV button's text (default ``CSV``); the Parquet one says ``Parquet``.
    """
    import streamlit as st

    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "table"
    c1, c2, _ = st.columns([1, 1, 5])
    c1.download_button(label, csv_bytes(df), file_name=f"{stem}.csv",
                       mime="text/csv", key=f"dl-{stem}-csv", icon=":material/download:")
    frame = df.copy()
    for col in frame.columns:
        if frame[col].dtype == object:
            frame[col] = frame[col].map(lambda v: v if v is None or isinstance(v, str) else str(v))
    c2.download_button("Parquet", parquet_bytes(frame), file_name=f"{stem}.parquet",
                       mime="application/vnd.apache.parquet", key=f"dl-{stem}-parquet",
                       icon=":material/download:")


def show_table(name: str, data, *, caption: str | None = None, empty: str | None = None,
               **kwargs):
    """Draw a table the one way every page does: :func:`table_frame` of ``data`` (human
    column names, text cells, ``—`` for missing values), ``Status`` columns as coloured text,
    every column visible at 1400 px (rule 4: widths from :func:`fit_widths` merged into
    ``column_config``), ``caption`` under it, then :func:`download_button` (file stem
    ``name``, also the buttons' key: unique per page) exporting the frame as shown.

    Args:
        name: the download file stem, e.g. ``requests-per-window``.
        data: a DataFrame (or anything ``pd.DataFrame`` takes), columns in display order.
        caption: text under the table (Markdown), or None.
        empty: when given and ``data`` has no rows, this caption is drawn instead of an empty
            table and its buttons (``"No window in this range."``).
        **kwargs: passed to ``st.dataframe`` (``hide_index`` defaults to True;
            ``column_config`` is kept, widths added only where it sets none).

    Returns:
        What ``st.dataframe`` returns (None when ``empty`` was drawn).
    """
    import streamlit as st

    raw = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
    if empty is not None and raw.empty:
        st.caption(empty)
        return None
    frame = table_frame(raw)
    kwargs.setdefault("hide_index", True)
    kwargs["column_config"] = _with_widths(frame, kwargs.get("column_config"))
    status = [c for c in STATUS_COLUMNS if c in frame.columns]
    shown = st.dataframe(frame.style.map(status_style, subset=status) if status else frame,
                         **kwargs)
    if caption:
        st.caption(caption)
    download_button(frame, name)
    return shown
