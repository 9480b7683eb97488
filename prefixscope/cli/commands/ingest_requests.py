"""``prefixscope ingest requests | prices``: per-request usage logs and the price table."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.common import (DB_DEFAULT, DbOption, JsonOption, out, print_json,
                                     print_request_files)
from prefixscope.core.formatting import count_noun, price_label
from prefixscope.core.errors import NothingIngested



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
    from prefixscope.ingest.files import ingest_files
    from prefixscope.ingest.usage import ingest_usage_file_detailed

    res = ingest_files(db, files, lambda con, f: ingest_usage_file_detailed(
        con, f, run_id=run_id, instance=instance, default_model=model))
    print_request_files(res, as_json=as_json)
    summaries, errors = [o.summary for o in res.outcomes], res.errors
    read = sum(s.rows_read for s in summaries)
    nothing_new = all(s.rows_quarantined == 0 for s in summaries) and summaries
    if read == 0 and not nothing_new:
        why = (f"{len(errors)} file(s) could not be read (see above)" if errors else
               "every line was quarantined (see the reasons above, or "
               "'prefixscope db info' and the quarantine table)")
        raise NothingIngested(f"no request could be read: {why}")


def prices_cmd(
    file: Annotated[str | None, typer.Argument(
        help="Price table, TOML (docs/pricing.md): shadow prices and overrides.")] = None,
    genai_prices: Annotated[bool, typer.Option(
        "--genai-prices", help="Also price every stored model the TOML does not list through "
        "the genai-prices package (tiers by prompt size, price changes over time, cache read "
        "and write prices; its version is shown with every cost).")] = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Load a price table (per million tokens) into the database, replacing the old one.

    Self-hosted models carry a shadow price with its source label (a list price of a
    comparable model, or a GPU-time estimate: gpu_hour_price and prefill_tokens_per_s). With
    --genai-prices, hosted models without a TOML entry are priced from the genai-prices
    package. The replacement is atomic: the dashboard sees the old table or the new one.

    Examples:

      prefixscope ingest prices data/prices.toml --genai-prices

      prefixscope ingest prices --genai-prices --json
    """
    from prefixscope.core.errors import UsageError
    from prefixscope.ingest.prices import load_prices
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.savings import price_table

    if file is None and not genai_prices:
        raise UsageError("give a price file (TOML), --genai-prices, or both")
    n, refreshed = None, None
    with store_db.writer(db) as con:
        if file is not None:
            n = load_prices(con, file)
        if genai_prices:
            from prefixscope.ingest.genai_prices import refresh_genai_prices

            refreshed = refresh_genai_prices(con)
        table = price_table(con)
    if as_json:
        doc = {"file": file, "models": n, "rows": len(table),
               "prices": table.drop(columns=["price_file"]).to_dict("records")}
        if refreshed is not None:
            doc["genai_prices"] = {
                "version": refreshed.version, "rows": refreshed.rows,
                "priced": [{"model": m, "provider": p} for m, p in refreshed.priced],
                "unknown": [{"model": m, "provider": p} for m, p in refreshed.unknown]}
        print_json(doc)
        return
    if file is not None:
        out.print(f"{file}: {count_noun(n, 'model')} priced "
                  f"({count_noun(len(table), 'name')} with aliases)",
                  markup=False, highlight=False)
        for r in table.itertuples(index=False):
            out.print(f"  {r.model:<32} {r.currency} in {r.input_per_mtok:g} / cached "
                      f"{r.cached_input_per_mtok:g} / write {r.cache_write_per_mtok:g} / out "
                      f"{r.output_per_mtok:g} per 1M ({price_label(r.shadow, r.price_source)})",
                      markup=False, highlight=False)
    if refreshed is not None:
        out.print(f"{refreshed.version}: {count_noun(len(refreshed.priced), 'stored model')} "
                  f"priced ({count_noun(refreshed.rows, 'price row')}: tiers and periods)",
                  markup=False, highlight=False)
        if refreshed.unknown:
            names = ", ".join(m if not p else f"{m} ({p})" for m, p in refreshed.unknown)
            out.print(f"  not in {refreshed.version}: {names} (give them a TOML price)",
                      markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``ingest requests`` and ``ingest prices``."""
    groups["ingest"].command("requests")(requests_cmd)
    groups["ingest"].command("prices")(prices_cmd)
