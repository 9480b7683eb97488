"""Data sources: what was ingested, from where, what was set aside, and legacy-name notes.

Reads the ingest bookkeeping (``ingest_sources``, ``quarantined_lines``, ``table_row_counts``)
through ``prefixscope.dashboard.data``. Not filtered by the sidebar: bookkeeping is per source, not per model.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.dashboard import data
from prefixscope.core.formatting import fmt_int, fmt_time, md_text
from prefixscope.dashboard.downloads import show_table



def split_location(location: object) -> tuple[str, str]:
    """(name, folder) of an ingest location, for two columns with the name first: a file path
    ``/tmp/x/hostile/nan.jsonl`` gives ``("nan.jsonl", "/tmp/x/hostile")`` (a long folder cut
    the one column at 1400 px, so every row read ``/tmp/newuser8.YXCj/hostile,``); a URL
    (``http://localhost:8000/metrics``) or a bare name is its own name, folder ``""``."""
    text = "" if location is None or (isinstance(location, float) and location != location) \
        else str(location)
    if "://" in text or "/" not in text.rstrip("/"):
        return text, ""
    folder, _, name = text.rstrip("/").rpartition("/")
    return name, folder or "/"


db = data.db_path()
st.title("Data sources")
st.caption(f"Everything ingested into {md_text(db, code=True)} (not filtered by the sidebar).")

with data.guard(db):
    sources = data.ingest_sources(db)
    if sources.empty:
        st.info("No data in this database yet — ingest with `prefixscope ingest metrics "
                "http://localhost:8000/metrics` or `prefixscope ingest requests usage.jsonl`.",
                icon=":material/info:")
        st.stop()

    notes = sources[sources["note"].notna() & (sources["note"].astype(str) != "")]
    legacy = notes[notes["note"].astype(str).str.contains("legacy", case=False)]
    if not legacy.empty:
        st.info("Legacy metric names: " + "; ".join(
            f"{md_text(loc, code=True)}: {md_text(note)}"
            for loc, note in zip(legacy["location"], legacy["note"]))
            + ". They feed the same hit-rate analysis.", icon=":material/history:")

    quarantine = data.quarantined_lines(db, limit=1000)
    c1, c2, c3 = st.columns(3)
    c1.metric("Sources", fmt_int(len(sources)), border=True)
    c2.metric("Rows added", fmt_int(sources["rows_added"].fillna(0).sum()), border=True)
    c3.metric("Quarantined lines", fmt_int(len(quarantine)), border=True,
              help="Input lines set aside with a reason (newest 1,000 listed).")

    st.subheader("Sources")
    where = [split_location(loc) for loc in sources["location"]]
    show_table("data-sources-1", pd.DataFrame({
        "Source": [name for name, _ in where],
        "Kind": sources["kind"],
        "Rows added": sources["rows_added"],
        "Lines read": sources["checkpoint_line"],
        "First ingest": sources["first_ingest_unix_s"].map(fmt_time),
        "Last ingest": sources["last_ingest_unix_s"].map(fmt_time),
        "Note": sources["note"],
        "Folder": [folder for _, folder in where],
    }), caption="One row per ingested source (its file name or URL first, the file's folder "
                "last): rows it added, lines read so far (the checkpoint a re-run resumes "
                "from), first and last ingest.")

    st.subheader("Quarantine")
    qwhere = [split_location(loc) for loc in quarantine["location"]]
    show_table("data-sources-2", pd.DataFrame({
        "Where": [f"{name}:{line}" for (name, _), line in zip(qwhere, quarantine["line"])],
        "Field": quarantine["field"],
        "Reason": quarantine["reason"],
        "When": quarantine["at_unix_s"].map(fmt_time),
        "Folder": [folder for _, folder in qwhere],
    }), caption="Newest 1,000 quarantined lines: where (file:line, the folder last), which "
                "field and why; never the value itself.", empty="No line was quarantined.")

    st.subheader("Tables")
    counts = data.table_row_counts(db)
    show_table("data-sources-3", pd.DataFrame({"Table": list(counts), "Rows": list(counts.values())}),
               height=35 * (len(counts) + 1) + 3,
               caption="Rows per table of the store (`prefixscope db info` prints the same).")
