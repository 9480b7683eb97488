"""``prefixscope ingest decisions``: load gateway decision logs (JSONL)."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli_common import DB_DEFAULT, DbOption, JsonOption, err, out, print_json


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``ingest decisions``."""

    @groups["ingest"].command("decisions")
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
        Bad lines are quarantined with file, line and field; good lines are kept.

        Example: prefixscope ingest decisions logs/gateway-decisions.jsonl --db data/prefixscope.duckdb
        """
        from ingest.decisions import ingest_decisions_file, iter_decision_files
        from store import db as store_db

        summaries = []
        with store_db.writer(db) as con:
            for path in iter_decision_files(files):
                summaries.append(ingest_decisions_file(con, path, run_id=run_id))
        if as_json:
            print_json([s.as_dict() for s in summaries])
            return
        for s in summaries:
            out.print(f"{s.source}: {s.rows_read} records, {s.rows_added} added, "
                      f"{s.rows_duplicate} already present, {s.rows_quarantined} quarantined",
                      markup=False, highlight=False)
            if s.rows_quarantined:
                err.print(f"  see quarantined lines: prefixscope db info / the Data sources page",
                          markup=False, highlight=False)
