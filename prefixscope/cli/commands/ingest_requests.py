"""``prefixscope ingest requests | prices``: per-request usage logs and the price table."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.common import (DB_DEFAULT, DbOption, JsonOption, count_noun, err, out,
                                     print_json)
from prefixscope.core.errors import NothingIngested

_MAX_PROBLEMS_SHOWN = 20


def requests_cmd(
    files: Annotated[list[str], typer.Argument(
        help="JSONL files: one response, final stream chunk or usage-log record per line.")],
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Run id for lines without one (default '': production traffic).")] = None,
    instance: Annotated[str | None, typer.Option(
        "--instance", help="Instance name for lines without one.")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model name for lines whose record and response name none.")] = None,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store per-request usage (prompt, cached, cache-write and output tokens).

    Reads OpenAI-compatible responses (vLLM completions, chat, the final usage chunk of
    a stream, /v1/responses), vLLM's /v1/messages and Anthropic, Bedrock Converse, Gemini,
    DeepSeek, OpenRouter and Groq usage, or prefixscope usage-log records holding one
    (docs/ingest.md). Prompt tokens are stored inclusive of cache reads and writes;
    cached_tokens missing stays NULL (not 0). Files are read from their last checkpoint;
    re-ingesting adds nothing. Bad lines are quarantined (file:line:field:reason); the
    exit code is non-zero only when nothing could be read.

    Examples:

      prefixscope ingest requests logs/usage.jsonl --instance vllm-a

      prefixscope ingest requests run/requests.jsonl --run-id replay-1 --json
    """
    from prefixscope.ingest.files import ingest_files, quarantined_dicts
    from prefixscope.ingest.usage import ingest_usage_file_detailed

    res = ingest_files(db, files, lambda con, f: ingest_usage_file_detailed(
        con, f, run_id=run_id, instance=instance, default_model=model))
    summaries, errors = [o.summary for o in res.outcomes], res.errors
    problems = quarantined_dicts(res.problems)
    for e in errors:
        err.print(f"error: {e}", markup=False, highlight=False)
    if as_json:
        print_json({"files": [s.as_dict() for s in summaries], "errors": errors,
                    "quarantined": problems})
    else:
        for s in summaries:
            out.print(f"{s.source}: {count_noun(s.rows_added, 'request')} added, "
                      f"{s.rows_duplicate:,} already stored, "
                      f"{count_noun(s.rows_quarantined, 'line')} quarantined",
                      markup=False, highlight=False)
            if s.note:
                out.print(f"  note: {s.note}", markup=False, highlight=False)
        for q in problems[:_MAX_PROBLEMS_SHOWN]:
            what = f"{q['field']}: {q['reason']}" if q.get("field") else q["reason"]
            err.print(f"quarantined {q['location']}:{q['line']}: {what}",
                      markup=False, highlight=False)
    read = sum(s.rows_read for s in summaries)
    nothing_new = all(s.rows_quarantined == 0 for s in summaries) and summaries
    if read == 0 and not nothing_new:
        why = (f"{len(errors)} file(s) could not be read (see above)" if errors else
               "every line was quarantined (see the reasons above, or "
               "'prefixscope db info' and the quarantine table)")
        raise NothingIngested(f"no request could be read: {why}")


def prices_cmd(
    file: Annotated[str, typer.Argument(help="Price table, TOML (docs/pricing.md).")],
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Load a price table (per million tokens) into the database, replacing the old one.

    Self-hosted models carry a shadow price with its source label. The replacement is
    atomic: the dashboard sees the old table or the new one.

    Example: prefixscope ingest prices data/prices.toml
    """
    from prefixscope.ingest.prices import load_prices
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.savings import price_table

    with store_db.writer(db) as con:
        n = load_prices(con, file)
        table = price_table(con)
    if as_json:
        print_json({"file": file, "models": n, "rows": len(table),
                    "prices": table.drop(columns=["price_file"]).to_dict("records")})
        return
    out.print(f"{file}: {n} models priced ({len(table)} names with aliases)",
              markup=False, highlight=False)
    for r in table.itertuples(index=False):
        kind = "shadow" if r.shadow else "list"
        out.print(f"  {r.model:<32} {r.currency} in {r.input_per_mtok:g} / cached "
                  f"{r.cached_input_per_mtok:g} / write {r.cache_write_per_mtok:g} / out "
                  f"{r.output_per_mtok:g} per 1M ({kind}: {r.price_source})",
                  markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``ingest requests`` and ``ingest prices``."""
    groups["ingest"].command("requests")(requests_cmd)
    groups["ingest"].command("prices")(prices_cmd)
