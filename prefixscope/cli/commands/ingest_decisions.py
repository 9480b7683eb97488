"""``prefixscope ingest decisions``: load gateway decision logs (JSONL)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefixscope.cli.common import (DB_DEFAULT, DbOption, JsonOption, err, out,
                                     print_json, print_quarantined)
from prefixscope.core.formatting import count_noun
from prefixscope.core.errors import NothingIngested


#: The files of a folder that ``ingest decisions`` reads: the gateway's decision log and its
#: rotations (``gateway/logs.py``: ``decisions.jsonl``, ``decisions.1.jsonl``, ...).
DECISION_FILES = "decisions*.jsonl"


def _nothing_new_note(source: str) -> str:
    """Why a readable file gave no record: empty, or read up to its end before (a tail)."""
    try:
        empty = Path(source).stat().st_size == 0
    except OSError:
        empty = False
    return "empty file" if empty else "no new lines since the last ingest"


def decisions_cmd(
    files: Annotated[list[str], typer.Argument(
        help="Decision-log JSONL files, or the gateway's log folder (its decisions*.jsonl "
        "files: decisions.jsonl and its rotations; the usage files there are not read).")],
    db: DbOption = DB_DEFAULT,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Run id for lines without one (default '': production).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Load gateway decision logs into gateway_decisions / gateway_events (safe to run twice).

    One JSON object per line: a decision (time, request id, scope, namespace digest,
    decision, reasons, candidate and accepted cached tokens, short digests) or a version
    event; format in docs/scopes.md. Decisions join usage rows on (run_id, request_id).
    Bad lines are quarantined with file, line and field (printed, and listed on the Data
    sources page); good lines are kept. Exit code 4 when nothing could be read.

    A final line without newline is read when it is complete JSON, else left for the next
    run (a writer may still be writing it), as `ingest requests` does.

    Examples:

      prefixscope ingest decisions logs/gateway/decisions.jsonl --db data/prefixscope.duckdb

      prefixscope ingest decisions logs/gateway/   (decisions.jsonl, decisions.1.jsonl, ...)
    """
    from prefixscope.ingest.decisions import (all_quarantined_message,
                                              ingest_decisions_file_detailed)
    from prefixscope.ingest.files import ingest_files, quarantined_dicts

    res = ingest_files(db, files, lambda con, f: ingest_decisions_file_detailed(
        con, f, run_id=run_id, raise_when_nothing=False),
        folders=True, folder_glob=DECISION_FILES)
    for e in res.errors:
        err.print(f"error: {e}", markup=False, highlight=False)
    if not res.outcomes:
        raise NothingIngested(f"no decision could be read: {len(res.errors)} source(s) could "
                              "not be read (see above)")
    # a file whose new lines were all quarantined fails, after its lines are printed
    all_bad = [o for o in res.outcomes if o.summary.rows_quarantined and not o.summary.rows_read]
    summaries = [o.summary for o in res.outcomes]
    per_source = [quarantined_dicts(o.problems) for o in res.outcomes]
    problems = [q for mine in per_source for q in mine]
    if as_json:  # one summary per source, with its quarantined lines (docs/ingest.md)
        print_json([{**s.as_dict(), "quarantined": mine}
                    for s, mine in zip(summaries, per_source, strict=True)])
        print_quarantined(problems, total=sum(s.rows_quarantined for s in summaries))
        _fail_when_all_bad(all_bad, len(res.outcomes), all_quarantined_message)
        return
    for s in summaries:
        out.print(f"{s.source}: {count_noun(s.rows_read, 'record')}, {s.rows_added:,} added, "
                  f"{s.rows_duplicate:,} already present, {s.rows_quarantined:,} quarantined",
                  markup=False, highlight=False)
        note = s.note or (_nothing_new_note(s.source) if s.rows_read == 0
                          and not s.rows_quarantined else None)
        if note:
            out.print(f"  note: {note}", markup=False, highlight=False)
    print_quarantined(problems, total=sum(s.rows_quarantined for s in summaries))
    _fail_when_all_bad(all_bad, len(res.outcomes), all_quarantined_message)


def _fail_when_all_bad(all_bad, outcomes: int, message) -> None:
    """``error: <file>: all N lines quarantined; the first: ...`` per such file (stderr); exit
    4 when every file read was such a file."""
    for o in all_bad:
        err.print(f"error: {message(o.summary, o.problems)}", markup=False, highlight=False)
    if all_bad and len(all_bad) == outcomes:
        raise NothingIngested(f"no decision could be read: every line of the {len(all_bad):,} "
                              "file(s) was quarantined (see above)")


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``ingest decisions``."""
    groups["ingest"].command("decisions")(decisions_cmd)
