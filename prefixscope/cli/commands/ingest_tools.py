"""``prefixscope ingest litellm | langfuse``: per-request usage other tools already keep (LiteLLM
proxy spend logs, Langfuse observation exports)."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.commands.ingest_otlp import HmacKeyOption, ingest_and_report, optional_hmac_key
from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption

FilesArg = Annotated[list[str], typer.Argument(
    help="JSON lines, one JSON document (an array or {\"data\": [...]}) or CSV with a header.")]
RunIdOption = Annotated[str | None, typer.Option(
    "--run-id", help="Run id of the stored rows (default '': production traffic).")]
InstanceOption = Annotated[str | None, typer.Option(
    "--instance", help="Instance for records that name none.")]


def litellm_cmd(
    files: FilesArg,
    run_id: RunIdOption = None,
    instance: InstanceOption = None,
    hmac_key_file: HmacKeyOption = None,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store LiteLLM proxy spend logs (LiteLLM_SpendLogs rows) as requests.

    Reads the rows as JSON lines (row_to_json, /spend/logs) or the Postgres table's columns as
    CSV (psql \\copy ... CSV HEADER): prompt and completion tokens, cache reads and writes from
    metadata.usage_object (cache_read_input_tokens, cache_creation_input_tokens,
    prompt_tokens_details), model, custom_llm_provider, api_base and times. Team, key and end
    user become HMAC namespace digests (scope TENANT or PRINCIPAL), never stored raw;
    LiteLLM's cache_hit is its response cache, never a prefix hit (docs/ingest.md#litellm).

    Example: prefixscope ingest litellm spendlogs.jsonl --hmac-key-file /etc/prefixscope/hmac.key
    """
    from functools import partial

    from prefixscope.ingest.litellm import KIND, spendlog_to_row
    from prefixscope.ingest.record_files import ingest_record_file

    to_row = partial(spendlog_to_row, hmac_key=optional_hmac_key(hmac_key_file),
                     run_id=run_id or "", instance=instance)
    ingest_and_report(db, files, lambda con, f: ingest_record_file(
        con, f, kind=KIND, to_row=to_row,
        skipped_what="blank lines, or failed requests: status failure, no usage"), as_json)


def langfuse_cmd(
    files: FilesArg,
    run_id: RunIdOption = None,
    instance: InstanceOption = None,
    hmac_key_file: HmacKeyOption = None,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store Langfuse observation exports (generations with usageDetails) as requests.

    Reads the observations API response or UI export (JSON, JSON lines, CSV): prompt tokens are
    the sum of the usageDetails keys containing "input" (Langfuse's buckets are exclusive),
    cache reads and writes from the input_cached_tokens / cache_read / cache_creation keys,
    output from the keys containing "output". Spans and generations without usage are skipped;
    userId becomes an HMAC namespace digest (docs/ingest.md#langfuse).

    Example: prefixscope ingest langfuse observations.json
    """
    from functools import partial

    from prefixscope.ingest.langfuse import KIND, observation_to_row
    from prefixscope.ingest.record_files import ingest_record_file

    to_row = partial(observation_to_row, hmac_key=optional_hmac_key(hmac_key_file),
                     run_id=run_id or "", instance=instance)
    ingest_and_report(db, files, lambda con, f: ingest_record_file(
        con, f, kind=KIND, to_row=to_row,
        skipped_what="blank lines, or spans and generations without usage"), as_json)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``ingest litellm`` and ``ingest langfuse``."""
    groups["ingest"].command("litellm")(litellm_cmd)
    groups["ingest"].command("langfuse")(langfuse_cmd)
