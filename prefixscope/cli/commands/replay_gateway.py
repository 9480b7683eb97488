"""``prefixscope replay gateway``: replay a multi-tenant trace through the cache gateway model."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, out, print_json


def gateway_cmd(
    trace: Annotated[str, typer.Argument(
        help="prefixscope-multitenant/v1 trace (JSONL), e.g. data/multitenant/trace.jsonl.")],
    out_dir: Annotated[str, typer.Option(
        "--out", help="Folder for decisions.jsonl, requests.jsonl, metrics/, summary.json.")]
        = "out/gateway",
    run_id: Annotated[str, typer.Option("--run-id", help="Run id of the replay.")]
        = "gateway-replay",
    hmac_key_file: Annotated[str | None, typer.Option(
        "--hmac-key-file", help="Server-side HMAC key (default: PREFIXSCOPE_HMAC_KEY_FILE "
        "or [identity] hmac_key_file). Never inside the repository.")] = None,
    num_gpu_blocks: Annotated[int | None, typer.Option(
        "--num-gpu-blocks", help="Override the trace's cache size (blocks, incl. the null "
        "block).")] = None,
    inventory: Annotated[str | None, typer.Option(
        "--inventory", help="Approved public inventory file (default: [identity] "
        "public_inventory_file, else the trace header's).")] = None,
    instance: Annotated[str, typer.Option("--instance", help="Instance name of the engine.")]
        = "gateway-replay",
    no_ingest: Annotated[bool, typer.Option(
        "--no-ingest", help="Write the files only; do not load them into --db.")] = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Replay a multi-tenant trace (tenants, principals, version events) through the gateway
    model and the exact cache simulator, write the decision log, usage JSONL and /metrics
    expositions, and load them through the normal ingest path.

    Salts are applied per namespace, so private prefixes never match across tenants; every
    candidate hit is checked against the full identity (docs/scopes.md).

    Example: prefixscope replay gateway data/multitenant/trace.jsonl --hmac-key-file /etc/prefixscope/hmac.key --run-id mt-1
    """
    from prefixscope.core.config import load_settings
    from prefixscope.cli.demo_scopes import run_gateway_replay
    from prefixscope.core.identity import load_hmac_key

    identity = load_settings().identity
    key = load_hmac_key(hmac_key_file, config_path=identity.hmac_key_file)
    report = run_gateway_replay(trace, db_path=None if no_ingest else db, out_dir=out_dir,
                                key=key, run_id=run_id, instance=instance,
                                num_gpu_blocks=num_gpu_blocks,
                                inventory_path=inventory or identity.public_inventory_file)
    if as_json:
        print_json(report.as_dict())
        return
    out.print(f"{run_id}: {report}", markup=False, highlight=False)
    note = report.uncounted_note()
    if note:
        out.print(f"  {note}", markup=False, highlight=False)
    out.print(f"files in {report.out_dir}; loaded: {report.rows_added or 'nothing (--no-ingest)'}",
              markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``replay gateway``."""
    groups["replay"].command("gateway")(gateway_cmd)
