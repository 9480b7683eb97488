"""Download buttons for the dashboard's tables: the table as shown, as CSV or Parquet.

Every page calls :func:`download_button` under an ``st.dataframe``. The frame is the page's
already-aggregated table (at most a page of rows: per model, per window, per bucket), so
nothing per request leaves the store that the page did not already show; whole tables are
exported with ``prefixscope export`` (DuckDB ``COPY``).
"""

from __future__ import annotations

import io
import re

import pandas as pd


def csv_bytes(df: pd.DataFrame) -> bytes:
    """The frame as UTF-8 CSV with a header row, without the index."""
    return df.to_csv(index=False).encode("utf-8")


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


def show_table(name: str, data, **kwargs):
    """``st.dataframe(data, **kwargs)`` with :func:`download_button` under it (file stem
    ``name``, also the buttons' key: unique per page); returns what ``st.dataframe`` returns."""
    import streamlit as st

    shown = st.dataframe(data, **kwargs)
    frame = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
    download_button(frame, name)
    return shown
