"""``prefixscope ingest decisions``: load gateway decision logs (JSONL)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from prefixscope.cli.common import (DB_DEFAULT, DbOption, JsonOption, count_noun, err, out,
                                     print_json)
from prefixscope.core.errors import NothingIngested, problem_text

#: At most this many quarantined lines are printed (all are in the quarantine table).
_MAX_PROBLEMS_SHOWN = 20


def _nothing_new_note(source: str) -> str:
    """Why a readable file gave no record: empty, or read up to its end before (a tail)."""
    try:
        empty = Path(source).stat().st_size == 0
    except OSError:
        empty = False
    return "empty file" if empty else "no new lines since the last ingest"


def decisions_cmd(
    files: Annotated[list[str], typer.Argument(
        help="Decision-log JSONL files (or folders of *.jsonl).")],
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

    Example: prefixscope ingest decisions logs/gateway-decisions.jsonl --db data/prefixscope.duckdb
    """
    from prefixscope.ingest.bookkeeping import clean_location
    from prefixscope.ingest.decisions import ingest_decisions_file, iter_decision_files
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.ingest import quarantined_lines

    paths, unreadable = [], 0
    for given in files:
        found = list(iter_decision_files([given]))
        if Path(given).is_dir() and not found:
            why = "a folder without *.jsonl files"
        elif not Path(given).exists():
            why = "no such file"
        else:
            paths.extend(found)
            continue
        unreadable += 1
        err.print(f"error: {given}: {why}", markup=False, highlight=False)
    if not paths:
        raise NothingIngested(f"no decision could be read: {unreadable} source(s) could not "
                              "be read (see above)")
    summaries, problems, per_source = [], [], []
    failed = 0
    with store_db.writer(db) as con:
        for path in paths:
            started_s = time.time()
            try:
                s = ingest_decisions_file(con, path, run_id=run_id)
            except NothingIngested as exc:
                # Every new line of this file was quarantined (stored with file:line): say
                # so and go on with the other files; exit 4 only if no file gave a record.
                failed += 1
                err.print(f"error: {exc}", markup=False, highlight=False)
                continue
            summaries.append(s)
            mine: list[dict] = []
            if s.rows_quarantined:
                q = quarantined_lines(con, limit=10_000)
                q = q[(q["location"] == clean_location(path)) & (q["at_unix_s"] >= started_s)]
                mine = [{"location": path, "line": int(r["line"]),
                         "field": r["field"] if isinstance(r["field"], str) else None,
                         "reason": r["reason"]}
                        for r in q.sort_values("line").to_dict("records")]
            per_source.append(mine)
            problems.extend(mine)
    if not summaries:
        raise NothingIngested(f"no decision could be read: every line of the {failed:,} "
                              "file(s) was quarantined (see above)")
    if as_json:  # one summary per source, with its quarantined lines (docs/ingest.md)
        print_json([{**s.as_dict(), "quarantined": mine}
                    for s, mine in zip(summaries, per_source, strict=True)])
        return
    for s in summaries:
        out.print(f"{s.source}: {count_noun(s.rows_read, 'record')}, {s.rows_added:,} added, "
                  f"{s.rows_duplicate:,} already present, {s.rows_quarantined:,} quarantined",
                  markup=False, highlight=False)
        note = s.note or (_nothing_new_note(s.source) if s.rows_read == 0
                          and not s.rows_quarantined else None)
        if note:
            out.print(f"  note: {note}", markup=False, highlight=False)
    for q in problems[:_MAX_PROBLEMS_SHOWN]:
        field = q["field"]
        err.print("quarantined " + problem_text(q["location"], int(q["line"]), q["reason"],
                                                field), markup=False, highlight=False)
    if len(problems) > _MAX_PROBLEMS_SHOWN:
        err.print(f"... and {len(problems) - _MAX_PROBLEMS_SHOWN:,} more: the Data sources page "
                  "of the dashboard lists every quarantined line", markup=False,
                  highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``ingest decisions``."""
    groups["ingest"].command("decisions")(decisions_cmd)
