"""Option declarations shared by several commands (as sqlite-utils' ``output_options``).

Each is an ``Annotated`` type: a command declares ``block_size: BlockSizeOption = 16`` and gets
the same flag, help and validation as every other command that replays a trace. The default
stays at the use site, so a command can choose its own. ``--db`` and ``--json`` are in
:mod:`prefixscope.cli.common`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from prefixscope.replay.runner import SimRunSpec

#: Trace formats ``replay sim``, ``replay compare`` and ``replay live`` read (replay/traces.py).
FORMAT_HELP = "Trace format: auto, mooncake, kv-cache-tester, token-ids, chat."

TraceArg = Annotated[Path, typer.Argument(help="Trace file (or a kv-cache-tester directory).")]
FormatOption = Annotated[str, typer.Option("--format", help=FORMAT_HELP)]
TokenizerOption = Annotated[Path | None, typer.Option(
    "--tokenizer", help="Tokenizer dir for chat traces (default data/tiny-tokenizer).")]
LimitOption = Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N requests.")]

# The exact cache model's parameters (replay sim and replay compare).
BlockSizeOption = Annotated[int, typer.Option(
    "--block-size", min=1, help="Engine KV block size, tokens (vLLM default 16).")]
AlgoOption = Annotated[str, typer.Option(
    "--algo", help="sha256 (vLLM default), sha256_cbor, xxhash, xxhash_cbor, or fast "
                   "(same hits, no vLLM hash values).")]
HashIdBlockSizeOption = Annotated[int, typer.Option(
    "--hash-id-block-size", min=1, help="Tokens per hash id (Mooncake 512, Bailian 16).")]
OutputTokensOption = Annotated[str, typer.Option(
    "--output-tokens", help="trace (simulate output lengths) or 0.")]
ConcurrencyOption = Annotated[int | None, typer.Option(
    "--concurrency", min=1,
    help="Step-based scheduler with this max_num_seqs (default: sequential, exact).")]
#: Largest --capacity-blocks: the pool allocates its per-block lists up front (a few hundred MB
#: here); 4 M blocks of 16 tokens is 64 M tokens of KV cache, more than one vLLM engine holds.
MAX_CAPACITY_BLOCKS = 4_000_000
CapacityBlocksOption = Annotated[int | None, typer.Option(
    "--capacity-blocks", min=2, max=MAX_CAPACITY_BLOCKS,
    help="vLLM num_gpu_blocks, null block included (default: unbounded).")]
MaxModelLenOption = Annotated[int | None, typer.Option(
    "--max-model-len", min=1, help="Reject prompts reaching this many tokens.")]
LayoutOption = Annotated[Path | None, typer.Option(
    "--layout", help="Prompt layout file (YAML/TOML) for chat traces.")]
SeedOption = Annotated[str | None, typer.Option(
    "--seed", help="Plays PYTHONHASHSEED for the vLLM hash algorithms.")]
StrictOption = Annotated[bool, typer.Option(
    "--strict", help="Stop at the first malformed trace record.")]
PricesOption = Annotated[str | None, typer.Option(
    "--prices", help="Price table TOML (default: [pricing] prices_file).")]
T0Option = Annotated[str | None, typer.Option(
    "--t0", help="Time of trace time 0 (ISO, Unix s, -1h...; default: run ends now).")]
IngestOption = Annotated[bool, typer.Option(
    "--ingest", help="Store the run(s) in the database through the normal ingest path.")]

# Which traffic a query reads (hitrate and report).
AllRunsOption = Annotated[bool, typer.Option(
    "--all-runs", help="Production traffic and every replay run together.")]


def sim_spec_from_options(trace: Path | str, *, fmt: str, block_size: int,
                          capacity_blocks: int | None, algo: str, hash_id_block_size: int,
                          output_tokens: str, max_model_len: int | None, tokenizer: Path | None,
                          limit: int | None, seed: str | None, strict: bool,
                          **more: Any) -> SimRunSpec:
    """The :class:`prefixscope.replay.runner.SimRunSpec` of the trace options shared by
    ``replay sim`` and ``diagnose`` (the flags above, by their parameter names); ``more``: the
    command's own fields (``concurrency``, ``layout_path``, ``label``, ``model``)."""
    from prefixscope.replay.runner import SimRunSpec

    return SimRunSpec(trace=str(trace), format=fmt, block_size=block_size,
                      capacity_blocks=capacity_blocks, algo=algo,
                      hash_id_block_size=hash_id_block_size, output_tokens=output_tokens,
                      max_model_len=max_model_len,
                      tokenizer_dir=str(tokenizer) if tokenizer else None, limit=limit,
                      hash_seed=seed, strict=strict, **more)


def check_runs(db: str, run_ids: Any) -> None:
    """Raise UsageError (exit 2) when a ``--run`` id is not in the database: ``unknown run
    'ID'; known runs: A, B, ... (the dashboard's run picker lists them)``, instead of an empty
    result that reads as "no data". ``run_ids``: the ``--run`` values (None or empty: nothing
    to check). No database file: nothing to check (the command says so itself)."""
    if not run_ids or not Path(db).exists():
        return
    from prefixscope.core.errors import UsageError
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.replay import run_list, unknown_run_ids

    with store_db.reader(db) as con:
        unknown = unknown_run_ids(con, list(run_ids))
        if not unknown:
            return
        known = [str(r) for r in run_list(con)["run_id"]]
    shown = ", ".join(known[:10]) + (f" and {len(known) - 10:,} more" if len(known) > 10 else "")
    names = ", ".join(f"'{r}'" for r in unknown)
    raise UsageError(
        f"unknown run{'s' if len(unknown) > 1 else ''} {names}; "
        + (f"known runs: {shown} (newest first; the dashboard's run picker lists them)"
           if known else "the database has no replay runs (only production traffic: leave "
                         "out --run)"))
