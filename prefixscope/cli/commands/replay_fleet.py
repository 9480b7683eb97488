"""``prefixscope replay fleet`` and ``prefixscope replay capacity``: a trace through N replicas
under routing policies, with the miss ledger; a sweep of cache sizes with LRU and Belady's MIN."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from pathlib import Path

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, err, out, print_json
from prefixscope.cli.options import (AlgoOption, BlockSizeOption, CapacityBlocksOption,
                                     FormatOption, HashIdBlockSizeOption, IngestOption,
                                     LayoutOption,
                                     LimitOption, MaxModelLenOption, OutputTokensOption,
                                     SeedOption, StrictOption, TokenizerOption, TraceArg,
                                     sim_spec_from_options)
from prefixscope.core.errors import NothingIngested

#: Rows of the side-by-side table: (label, ledger class).
_CLASS_ROWS = (("engine granularity", "granularity"), ("routing", "routing"),
               ("capacity", "capacity"), ("isolation", "isolation"),
               ("prompt change", "prompt_change"), ("cold", "cold"))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _report_problems(problems: list, *, quiet: bool) -> None:
    if quiet:
        return
    for p in problems[:20]:
        err.print(f"skipped {p}", markup=False, highlight=False)
    if len(problems) > 20:
        err.print(f"... and {len(problems) - 20} more skipped records", markup=False,
                  highlight=False)


def print_fleet(doc: dict[str, Any]) -> None:
    """The side-by-side table of ``replay fleet`` (one column per policy)."""
    pols = doc["policies"]
    cap = "unbounded capacity" if doc["capacity_blocks"] is None else f"{doc['capacity_blocks']:,} blocks"
    first = pols[0]
    out.print(f"{doc['trace']}: {first['requests']:,} requests ({first['rejected_requests']:,} "
              f"rejected, {doc['skipped_records']:,} trace records skipped); "
              f"{doc['instances']} instances of {cap} each, block size {doc['block_size']}, "
              f"sequential replay", markup=False, highlight=False)
    widths = [max(10, len(p["router"]) + 2) for p in pols]
    rows: list[tuple[str, list[str]]] = [
        ("hit rate", [_pct(p["hit_rate"]) for p in pols]),
        ("cached tokens", [f"{p['cached_tokens']:,}" for p in pols]),
        ("missed tokens", [f"{p['missed_tokens']:,}" for p in pols]),
    ]
    for label, cls in _CLASS_ROWS:
        rows.append((f"  {label}", [
            f"{_pct(p['ledger'][cls] / p['prompt_tokens'] if p['prompt_tokens'] else None)}"
            for p in pols]))
    rows += [
        ("routing / missed", [_pct(p["routing_share_of_missed"]) for p in pols]),
        ("requests max/mean", [_ratio(p["requests_max_over_mean"]) for p in pols]),
        ("prompt max/mean", [_ratio(p["prompt_tokens_max_over_mean"]) for p in pols]),
    ]
    out.print(f"{'':<20}" + "".join(f"{p['router']:>{w}}" for p, w in zip(pols, widths)),
              markup=False, highlight=False)
    for label, vals in rows:
        out.print(f"{label:<20}" + "".join(f"{v:>{w}}" for v, w in zip(vals, widths)),
                  markup=False, highlight=False)
    out.print("ledger rows: share of prompt tokens; routing / missed: routing's share of the "
              "missed tokens; max/mean: the busiest instance over the mean (1.00 = even)",
              markup=False, highlight=False)


def fleet_cmd(
    trace: TraceArg,
    instances: Annotated[int, typer.Option(
        "--instances", min=1, max=1024, help="Replicas in the fleet (each its own cache).")] = 4,
    router: Annotated[str | None, typer.Option(
        "--router", help="Policies, comma-separated: round-robin, random, session, hash-prefix, "
                         "longest-prefix, longest-prefix-bounded, recorded (default: all; "
                         "recorded when the trace names instances).")] = None,
    fmt: FormatOption = "auto",
    block_size: BlockSizeOption = 16,
    capacity_blocks: CapacityBlocksOption = None,
    algo: AlgoOption = "sha256",
    hash_id_block_size: HashIdBlockSizeOption = 512,
    output_tokens: OutputTokensOption = "trace",
    max_model_len: MaxModelLenOption = None,
    tokenizer: TokenizerOption = None,
    layout: LayoutOption = None,
    limit: LimitOption = None,
    seed: SeedOption = None,
    strict: StrictOption = False,
    router_seed: Annotated[int, typer.Option(
        "--router-seed", help="Seed of the random policy.")] = 0,
    hash_blocks: Annotated[int, typer.Option(
        "--hash-blocks", min=1, help="hash-prefix: blocks of the prefix hashed (K).")] = 4,
    load_factor: Annotated[float, typer.Option(
        "--load-factor", min=1.0,
        help="longest-prefix-bounded: an instance is a candidate while its load (with this "
             "request) is at most this multiple of the mean, rounded up.")] = 1.25,
    load_window: Annotated[float, typer.Option(
        "--load-window", min=0.001,
        help="longest-prefix-bounded: load = requests routed in this many seconds of "
             "trace time.")] = 60.0,
    ingest: IngestOption = False,
    db: DbOption = DB_DEFAULT,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="With --ingest: directory for ledger.json (default "
                      "out/replay/fleet-<trace>-<time>Z-<hex>).")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="With --ingest: the model the stored ledger names for every request "
                        "(default: each request's own).")] = None,
    label: Annotated[str | None, typer.Option(
        "--label", help="With --ingest: the run's label (default: trace, fleet and "
                        "policies).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Replay a trace through N replicas under routing policies, side by side, with the ledger.

    Each replica is an exact model of one vLLM engine's prefix cache (--capacity-blocks each);
    requests replay sequentially in trace order. For each policy: hit rate, every prompt
    token's class (hit, engine granularity, routing, capacity, isolation, prompt change,
    cold; docs/metrics.md), routing's share of the missed tokens, and load balance.
    --ingest stores each policy's ledger per model, instance and day (counts only, no text)
    as one run: the Miss ledger page shows the policies side by side.

    Examples:

      prefixscope replay fleet data/traces/mooncake/conversation_trace.jsonl.gz --format mooncake --block-size 512 --algo fast --capacity-blocks 2000 --instances 4

      prefixscope replay fleet trace.jsonl --format token-ids --router round-robin,longest-prefix-bounded --json

      prefixscope replay fleet data/captures/aider/chat-requests.jsonl --instances 3 --router round-robin,longest-prefix --ingest
    """
    from prefixscope.core.errors import UsageError
    from prefixscope.replay.fleet import RouterParams
    from prefixscope.replay.fleet_run import run_fleet

    if not ingest and (out_dir is not None or model is not None or label is not None):
        raise UsageError("--out, --model and --label name what --ingest stores: add --ingest")
    spec = sim_spec_from_options(
        trace, fmt=fmt, block_size=block_size, capacity_blocks=capacity_blocks, algo=algo,
        hash_id_block_size=hash_id_block_size, output_tokens=output_tokens,
        max_model_len=max_model_len, tokenizer=tokenizer, limit=limit, seed=seed, strict=strict,
        layout_path=str(layout) if layout else None)
    report = run_fleet(spec, instances=instances, routers=router,
                       params=RouterParams(seed=router_seed, hash_blocks=hash_blocks,
                                           load_factor=load_factor, load_window_s=load_window),
                       group=ingest)
    _report_problems(report.problems, quiet=as_json)
    if not report.results or report.results[0].requests == 0:
        first = f" (first: {report.problems[0]})" if report.problems else ""
        raise NothingIngested(f"{trace}: no usable requests; {len(report.problems)} records "
                              f"skipped{first}")
    doc = report.as_dict()
    if ingest:
        doc["ingested"] = ingest_fleet(report, db=db, out_dir=out_dir, model=model, label=label)
    if as_json:
        print_json(doc)
        return
    print_fleet(doc)
    if ingest:
        i = doc["ingested"]
        out.print(f"stored in {db}: run {i['run_id']}, {i['ledger_rows_added']} ledger rows "
                  "(Miss ledger page)", markup=False, highlight=False)


def ingest_fleet(report: Any, *, db: str, out_dir: Path | None = None,
                 model: str | None = None, label: str | None = None,
                 run_id: str | None = None) -> dict[str, Any]:
    """Store a grouped :class:`~prefixscope.replay.fleet_run.FleetReport` (``run_fleet(...,
    group=True)``): ``ledger.json`` in the run directory (``out_dir``, default
    ``out/replay/<run id>``), then ``prefixscope.ingest.ledger`` into ``db`` as one run of kind
    ``replay-fleet``.

    Returns:
        ``{"db", "run_id", "ledger_rows_added", "ledger_file"}`` (the ``--json`` ``ingested``).

    Raises:
        the store's errors (``StoreLocked``...), ``ConfigError`` for a bad file.
    """
    from prefixscope.ingest.ledger import ingest_ledger_file
    from prefixscope.replay.run_ids import default_run_dir, new_run_id
    from prefixscope.store import db as store_db

    stem = Path(str(report.spec.trace)).name.split(".")[0]
    rid = run_id or new_run_id("fleet", stem)
    outd = out_dir or default_run_dir(rid)
    names = ", ".join(r.router for r in report.results)
    label = label or f"{stem} fleet: {report.instances} instances, {names}"
    path = report.write_ledger(outd / "ledger.json", run_id=rid, label=label, model=model)
    with store_db.writer(db) as con:
        added = ingest_ledger_file(con, path)
    return {"db": db, "run_id": rid, "ledger_rows_added": added, "ledger_file": str(path)}


def parse_capacities(text: str) -> list[int]:
    """``--capacities``: comma-separated ``num_gpu_blocks`` values (null block included),
    each from 2 to ``MAX_CAPACITY_BLOCKS``.

    Raises:
        UsageError: an empty list, a value that is not an integer or out of range.
    """
    from prefixscope.cli.options import MAX_CAPACITY_BLOCKS
    from prefixscope.core.errors import UsageError

    sizes = []
    for part in (t.strip() for t in text.split(",")):
        if not part:
            continue
        try:
            n = int(part.replace("_", ""))
        except ValueError:
            raise UsageError(f"--capacities: {part!r} is not a number of blocks") from None
        if not 2 <= n <= MAX_CAPACITY_BLOCKS:
            raise UsageError(f"--capacities: {n} is outside 2..{MAX_CAPACITY_BLOCKS:,} blocks "
                             "(num_gpu_blocks, null block included)")
        sizes.append(n)
    if not sizes:
        raise UsageError("--capacities: give at least one size, e.g. 2000,4000,8000")
    return sizes


def capacity_cmd(
    trace: TraceArg,
    capacities: Annotated[str, typer.Option(
        "--capacities", help="Cache sizes to sweep, comma-separated num_gpu_blocks (null block "
                             "included), e.g. 1000,2000,4000,8000.")],
    fmt: FormatOption = "auto",
    block_size: BlockSizeOption = 16,
    algo: AlgoOption = "sha256",
    hash_id_block_size: HashIdBlockSizeOption = 512,
    output_tokens: OutputTokensOption = "trace",
    max_model_len: MaxModelLenOption = None,
    tokenizer: TokenizerOption = None,
    layout: LayoutOption = None,
    limit: LimitOption = None,
    seed: SeedOption = None,
    strict: StrictOption = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", min=1, help="Processes running sizes at once (default: the CPUs).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Sweep cache sizes: vLLM's LRU hit rate and Belady's optimal (MIN) beside it, one row each.

    The trace is hashed once; each size replays its block keys through the exact model (the
    hits 'replay sim --capacity-blocks N' gives) and through MIN (evict the block whose next use
    is farthest), sizes in parallel processes. A large MIN - LRU gap says better eviction or a
    CPU offload tier would pay; a small one at a low hit rate says add memory or fix routing.

    Example: prefixscope replay capacity data/traces/mooncake/conversation_trace.jsonl.gz --format mooncake --block-size 512 --algo fast --capacities 500,1000,2000,4000,8000,16000
    """
    from prefixscope.replay.fleet_run import run_capacity

    sizes = parse_capacities(capacities)
    spec = sim_spec_from_options(
        trace, fmt=fmt, block_size=block_size, capacity_blocks=None, algo=algo,
        hash_id_block_size=hash_id_block_size, output_tokens=output_tokens,
        max_model_len=max_model_len, tokenizer=tokenizer, limit=limit, seed=seed, strict=strict,
        layout_path=str(layout) if layout else None)
    report = run_capacity(spec, sizes, jobs=jobs)
    _report_problems(report["problems"], quiet=as_json)
    if report["requests"] == 0:
        raise NothingIngested(f"{trace}: no usable requests; {len(report['problems'])} records "
                              "skipped")
    doc = {k: v for k, v in report.items() if k != "problems"}
    if as_json:
        print_json(doc)
        return
    out.print(f"{trace}: {doc['requests']:,} requests, block size {block_size}, sequential "
              f"replay; {doc['skipped_records']:,} trace records skipped", markup=False,
              highlight=False)
    out.print(f"{'num_gpu_blocks':>16}{'tokens':>14}{'LRU (vLLM)':>12}{'MIN':>9}"
              f"{'MIN - LRU':>11}{'rejected':>10}", markup=False, highlight=False)
    for r in doc["rows"]:
        gap = None if r["prompt_tokens"] == 0 else r["min_minus_lru_tokens"] / r["prompt_tokens"]
        out.print(f"{r['num_gpu_blocks']:>16,}{(r['num_gpu_blocks'] - 1) * block_size:>14,}"
                  f"{_pct(r['lru_hit_rate']):>12}{_pct(r['min_hit_rate']):>9}"
                  f"{'n/a' if gap is None else f'{100 * gap:+.1f} pp':>11}"
                  f"{r['rejected']:>10,}", markup=False, highlight=False)
    out.print("hit rates: cached / prompt tokens of the requests each size can hold; tokens: "
              "usable KV capacity (num_gpu_blocks - 1) x block size", markup=False,
              highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``replay fleet`` and ``replay capacity``."""
    groups["replay"].command("fleet")(fleet_cmd)
    groups["replay"].command("capacity")(capacity_cmd)
