"""``prefixscope replay sim``, ``replay compare``, ``replay chat-trace`` and ``ingest replay-run``:
simulated replays of a trace through the exact cache model, in production output formats."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, err, out, print_json
from prefixscope.cli.options import (MAX_CAPACITY_BLOCKS, AlgoOption, BlockSizeOption,
                                     CapacityBlocksOption,
                                     ConcurrencyOption, FormatOption, HashIdBlockSizeOption,
                                     IngestOption, LayoutOption, LimitOption, MaxModelLenOption,
                                     OutputTokensOption, PricesOption, SeedOption, StrictOption,
                                     T0Option, TokenizerOption, TraceArg, sim_spec_from_options)
from prefixscope.core.errors import NothingIngested, UsageError


def _concurrency(concurrency: int | None, max_num_batched_tokens: int, step_time: float,
                 no_chunked_prefill: bool, long_prefill_token_threshold: int,
                 step_token_time: float = 0.0, step_decode_time: float = 0.0,
                 clock: str = "steps"):
    from prefixscope.replay.types import ConcurrencyConfig

    if clock not in ("steps", "observed"):
        raise UsageError("--clock must be steps or observed")
    if clock == "observed":
        return ConcurrencyConfig(max_num_seqs=concurrency or 256,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 observed_clock=True)
    if concurrency is None:
        return None
    return ConcurrencyConfig(max_num_seqs=concurrency,
                             max_num_batched_tokens=max_num_batched_tokens,
                             enable_chunked_prefill=not no_chunked_prefill,
                             step_time_s=step_time,
                             long_prefill_token_threshold=long_prefill_token_threshold,
                             step_token_s=step_token_time, step_decode_s=step_decode_time)


def _fmt_rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _fmt_pct(x: float | None) -> str:
    """A hit rate (fraction) as a percentage with one decimal: 0.8689 -> ``86.9%``."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _print_run(res: Any) -> None:
    s = res.summary
    cap = "unbounded" if s.num_gpu_blocks is None else f"{s.num_gpu_blocks:,} blocks"
    out.print(f"run {res.run_id} ({res.label}): {s.requests:,} requests "
              f"({s.rejected_requests:,} rejected, {len(res.problems):,} trace records skipped)",
              markup=False, highlight=False)
    out.print(f"  prompt {s.prompt_tokens:,} tokens, cached {s.cached_tokens:,} tokens, hit rate "
              f"{_fmt_rate(s.hit_rate)} (Σ cached / Σ prompt); block size {s.block_size}, "
              f"capacity {cap}, {s.mode}, hash {s.hash_algo}", markup=False, highlight=False)
    for rid, reason in s.rejected[:5]:
        out.print(f"  rejected {rid}: {reason}", markup=False, highlight=False)
    out.print(f"  files: {res.out_dir} (requests.jsonl, {len(res.metrics)} /metrics snapshots, "
              "run.json)", markup=False, highlight=False)


def _report_problems(problems: list, *, quiet: bool) -> None:
    if quiet:
        return
    for p in problems[:20]:
        err.print(f"skipped {p}", markup=False, highlight=False)
    if len(problems) > 20:
        err.print(f"... and {len(problems) - 20} more skipped records (run.json lists 100)",
                  markup=False, highlight=False)


def _check_nonempty(res: Any, trace: Path) -> None:
    if res.summary.requests == 0:
        first = f" (first: {res.problems[0]})" if res.problems else ""
        raise NothingIngested(f"{trace}: no usable requests; {len(res.problems)} records "
                              f"skipped{first}")


def _ingest(db: str, run_dirs: list[Path]) -> list[dict[str, Any]]:
    from prefixscope.ingest.runs import ingest_run_dir
    from prefixscope.store import db as store_db

    with store_db.writer(db) as con:
        return [ingest_run_dir(con, d).as_dict() for d in run_dirs]


def _price(model: str, prices_file: str | None, db: str | None = None):
    """The :class:`prefixscope.replay.compare.Price` of ``model``, or None when nothing prices it.

    With ``--prices FILE``: that file only. Else the price table the dashboard prices with, the
    database's ``prices`` table (``store.queries.savings.price_table``: the loaded price file
    including its shadow prices), then the ``[pricing] prices_file`` file.
    """
    from decimal import Decimal

    from prefixscope.ingest.prices import read_price_file
    from prefixscope.core.config import load_settings
    from prefixscope.core.errors import SourceUnavailable
    from prefixscope.replay.compare import Price

    if prices_file is None and db is not None and Path(db).exists():
        from prefixscope.store import db as store_db
        from prefixscope.store.queries.savings import price_table

        with store_db.reader(db) as con:
            table = price_table(con)
        for r in table[table["model"] == model].itertuples():
            def dec(v):
                return Decimal(str(v))
            return Price(model=r.priced_as or r.model, currency=r.currency,
                         input_per_mtok=dec(r.input_per_mtok),
                         cached_input_per_mtok=dec(r.cached_input_per_mtok),
                         cache_write_per_mtok=dec(r.cache_write_per_mtok),
                         output_per_mtok=dec(r.output_per_mtok), shadow=bool(r.shadow),
                         price_source=str(r.price_source or ""))
    path = prices_file or load_settings().pricing.prices_file
    try:
        rows = read_price_file(path)
    except SourceUnavailable:
        if prices_file:
            raise
        return None
    for r in rows:
        if r.model == model:
            return Price(model=r.priced_as, currency=r.currency, input_per_mtok=r.input_per_mtok,
                         cached_input_per_mtok=r.cached_input_per_mtok,
                         cache_write_per_mtok=r.cache_write_per_mtok,
                         output_per_mtok=r.output_per_mtok, shadow=r.shadow,
                         price_source=r.price_source)
    return None


def sim_cmd(
    trace: TraceArg,
    fmt: FormatOption = "auto",
    block_size: BlockSizeOption = 16,
    capacity_blocks: CapacityBlocksOption = None,
    algo: AlgoOption = "sha256",
    hash_id_block_size: HashIdBlockSizeOption = 512,
    output_tokens: OutputTokensOption = "trace",
    concurrency: ConcurrencyOption = None,
    max_num_batched_tokens: Annotated[int, typer.Option(
        "--max-num-batched-tokens", min=1, help="With --concurrency: token budget per step.")] = 8192,
    step_time: Annotated[float, typer.Option(
        "--step-time", min=0.0, help="With --concurrency: seconds per engine step.")] = 0.02,
    step_token_time: Annotated[float, typer.Option(
        "--step-token-time", min=0.0,
        help="With --concurrency: seconds added per prefill token in a step "
             "(replay fit-steps).")] = 0.0,
    step_decode_time: Annotated[float, typer.Option(
        "--step-decode-time", min=0.0,
        help="With --concurrency: seconds added per decoding request in a step "
             "(replay fit-steps).")] = 0.0,
    no_chunked_prefill: Annotated[bool, typer.Option(
        "--no-chunked-prefill", help="With --concurrency: no chunked prefill.")] = False,
    long_prefill_token_threshold: Annotated[int, typer.Option(
        "--long-prefill-token-threshold", min=0,
        help="With --concurrency: cap on a prefill chunk, tokens (0 = none).")] = 0,
    clock: Annotated[str, typer.Option(
        "--clock",
        help="steps (the step model, with --concurrency) or observed: replay on the trace's "
             "recorded timeline (arrival and finished_s of every request, e.g. a replay "
             "live trace.jsonl).")] = "steps",
    max_model_len: MaxModelLenOption = None,
    tokenizer: TokenizerOption = None,
    layout: LayoutOption = None,
    limit: LimitOption = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model name in the outputs (default replay-sim).")] = None,
    label: Annotated[str | None, typer.Option("--label", help="Short name of the run.")] = None,
    seed: SeedOption = None,
    strict: StrictOption = False,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Run directory (default out/replay/<run id>).")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (default sim-<label>-<time>Z-<hex>).")] = None,
    t0: T0Option = None,
    snapshot_every: Annotated[float, typer.Option(
        "--snapshot-every", min=1.0, help="Simulated seconds between /metrics snapshots.")] = 60.0,
    ingest: IngestOption = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Replay a trace through the exact model of vLLM's prefix cache.

    Writes requests.jsonl (the format 'prefixscope ingest requests' reads), vLLM /metrics
    snapshots over the trace's time span and run.json into the run directory; --ingest
    stores them through the normal ingest path. A malformed trace record is named
    (file:line) and skipped; a request the cache can never hold is reported as rejected.

    Examples:

      prefixscope replay sim data/traces/mooncake/conversation_trace.jsonl.gz --format mooncake --block-size 512 --capacity-blocks 20000 --algo fast --json

      prefixscope replay sim data/captures/aider/chat-requests.jsonl --format chat --layout data/layouts/date-at-end.yaml --ingest

      prefixscope replay sim out/live/run-1/trace.jsonl --format token-ids --block-size 32 --capacity-blocks 96 --clock observed
    """
    from prefixscope.core.times import parse_time
    from prefixscope.replay.runner import run_sim

    spec = sim_spec_from_options(
        trace, fmt=fmt, block_size=block_size, capacity_blocks=capacity_blocks, algo=algo,
        hash_id_block_size=hash_id_block_size, output_tokens=output_tokens,
        max_model_len=max_model_len, tokenizer=tokenizer, limit=limit, seed=seed, strict=strict,
        concurrency=_concurrency(concurrency, max_num_batched_tokens, step_time,
                                 no_chunked_prefill, long_prefill_token_threshold,
                                 step_token_time, step_decode_time, clock),
        layout_path=str(layout) if layout else None, label=label, model=model)
    res = run_sim(spec, out_dir, run_id=run_id,
                  t0_unix_s=parse_time(t0) if t0 else None, snapshot_every_s=snapshot_every)
    _report_problems(res.problems, quiet=as_json)
    _check_nonempty(res, trace)
    ingested = _ingest(db, [res.out_dir])[0] if ingest else None
    if as_json:
        doc = res.summary_dict()
        if ingested is not None:
            doc["ingested"] = {"db": db, **ingested}
        print_json(doc)
        return
    _print_run(res)
    if ingested is not None:
        out.print(f"  stored in {db}: {ingested['requests_added']:,} requests, "
                  f"{ingested['metric_samples_added']:,} metric samples", markup=False,
                  highlight=False)


def compare_cmd(
    trace: TraceArg,
    layout_a: Annotated[Path | None, typer.Option(
        "--layout-a", help="Layout of run A (default: requests as recorded).")] = None,
    layout_b: Annotated[Path | None, typer.Option(
        "--layout-b", help="Layout of run B (default: as recorded).")] = None,
    capacity_blocks: Annotated[int | None, typer.Option(
        "--capacity-blocks", min=2, max=MAX_CAPACITY_BLOCKS,
        help="num_gpu_blocks of run A (default unbounded).")] = None,
    capacity_blocks_b: Annotated[int | None, typer.Option(
        "--capacity-blocks-b", min=2, max=MAX_CAPACITY_BLOCKS,
        help="num_gpu_blocks of run B (default: as A).")] = None,
    fmt: FormatOption = "auto",
    block_size: BlockSizeOption = 16,
    algo: AlgoOption = "sha256",
    hash_id_block_size: HashIdBlockSizeOption = 512,
    output_tokens: OutputTokensOption = "trace",
    concurrency: ConcurrencyOption = None,
    tokenizer: TokenizerOption = None,
    limit: LimitOption = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model name (also the price-table entry used for cost).")] = None,
    prices: PricesOption = None,
    price_as: Annotated[str | None, typer.Option(
        "--price-as", help="Cost both runs at this price-table entry (default: --model).")] = None,
    label: Annotated[str | None, typer.Option("--label", help="Prefix of both runs' labels.")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Directory for both runs (a/ and b/; default out/replay/<id>).")] = None,
    t0: T0Option = None,
    ingest: IngestOption = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Run a trace twice (layout A vs B, or capacity A vs B) and report the difference.

    Prints hit rate, cached tokens and cost (at the model's price, shadow prices labelled)
    of A and B and B - A. Both runs are placed on the same time span.

    Examples:

      prefixscope replay compare data/captures/aider/chat-requests.jsonl --format chat --layout-b data/layouts/date-in-first-user.yaml --price-as tiny-llama-random

      prefixscope replay compare conversation_trace.jsonl --format mooncake --block-size 512 --algo fast --capacity-blocks 2000 --capacity-blocks-b 20000 --json
    """
    from prefixscope.core.times import parse_time
    from prefixscope.replay.runner import run_compare

    res = run_compare(
        trace=str(trace), layout_a=str(layout_a) if layout_a else None,
        layout_b=str(layout_b) if layout_b else None, capacity_blocks=capacity_blocks,
        capacity_blocks_b=capacity_blocks_b, format=fmt, block_size=block_size, algo=algo,
        hash_id_block_size=hash_id_block_size, output_tokens=output_tokens,
        concurrency=_concurrency(concurrency, 8192, 0.02, False, 0),
        tokenizer_dir=str(tokenizer) if tokenizer else None, limit=limit, model=model,
        label=label, out_dir=out_dir, t0_unix_s=parse_time(t0) if t0 else None)
    for side in (res.a, res.b):
        _report_problems(side.problems, quiet=as_json)
        _check_nonempty(side, trace)
    price = _price(price_as or res.a.model, prices, db)
    from prefixscope.replay.compare import compare_runs

    doc = compare_runs(res.a.summary, res.b.summary, price=price,
                       a_extra={"run_id": res.a.run_id, "label": res.a.label,
                                "layout": res.a.layout},
                       b_extra={"run_id": res.b.run_id, "label": res.b.label,
                                "layout": res.b.layout})
    if ingest:
        doc["ingested"] = {"db": db, "runs": _ingest(db, [res.a.out_dir, res.b.out_dir])}
    doc["out_dir"] = str(res.out_dir)
    if as_json:
        print_json(doc)
        return
    _print_compare(doc, price_as or res.a.model)


def chat_trace_cmd(
    source: Annotated[Path, typer.Argument(help="aider chat history (.md) or SWE-agent trajectory (.traj).")],
    out_file: Annotated[Path, typer.Option("--out", help="Chat trace JSONL to write.")],
    kind: Annotated[str, typer.Option(
        "--from", help="aider or swe-agent (default: from the file name).")] = "auto",
    chats_per_day: Annotated[int | None, typer.Option(
        "--chats-per-day", min=1, help="aider: first N chats of each day only.")] = None,
    max_turns: Annotated[int | None, typer.Option(
        "--max-turns", min=1, help="aider: first N inputs of each chat only.")] = None,
    max_message_chars: Annotated[int | None, typer.Option(
        "--max-message-chars", min=1, help="aider: cut messages to this many characters.")] = None,
) -> None:
    """Build a chat-request trace (replay sim --format chat) from captured conversations.

    aider: one request per user input, with a system prompt carrying aider's volatile
    "- Current date:" line (see docs/replay.md#traces). SWE-agent: one request per model
    call of a trajectory.

    Example: prefixscope replay chat-trace .aider.chat.history.md --out out/aider-requests.jsonl --chats-per-day 4
    """
    from prefixscope.replay.chat_captures import (
        aider_chat_requests,
        swe_agent_chat_requests,
        write_chat_trace,
    )

    k = kind
    if k == "auto":
        k = "swe-agent" if source.suffix == ".traj" else "aider"
    if k == "aider":
        lines = aider_chat_requests(source, chats_per_day=chats_per_day, max_turns=max_turns,
                                    max_message_chars=max_message_chars)
    elif k == "swe-agent":
        lines = swe_agent_chat_requests(source)
    else:
        raise UsageError("--from must be aider or swe-agent")
    n = write_chat_trace(lines, out_file)
    if n == 0:
        raise NothingIngested(f"{source}: no requests found")
    out.print(f"wrote {n} chat requests to {out_file}", markup=False, highlight=False)


def fit_steps_cmd(
    requests_file: Annotated[Path, typer.Argument(
        help="requests.jsonl of a 'replay live' run (send time, TTFT, latency, usage).")],
    as_json: JsonOption = False,
) -> None:
    """Fit the step model's step time to a live run: step = a + b * prefill tokens + c * decodes.

    Least squares over every request's decode time (first token to end: out - 1 engine steps)
    against the prefills and decodes that ran beside it (docs/fidelity.md). Prints the three
    coefficients and the 'replay sim' options that use them.

    Example: prefixscope replay fit-steps out/live/run-1/requests.jsonl --json
    """
    from prefixscope.replay.step_fit import fit_step_time, timings_from_usage_jsonl

    if not requests_file.is_file():
        raise UsageError(f"{requests_file}: no such file")
    fit = fit_step_time(timings_from_usage_jsonl(requests_file))
    if as_json:
        print_json({**fit.as_dict(), "sim_flags": fit.sim_flags()})
        return
    out.print(f"step = {fit.step_time_s:.6g} s + {fit.step_token_s:.6g} s x prefill tokens + "
              f"{fit.step_decode_s:.6g} s x decodes ({fit.equations:,} of {fit.requests:,} "
              f"requests; rms residual {fit.rms_residual_s:.3f} s of a mean decode "
              f"{fit.mean_decode_s:.3f} s)", markup=False, highlight=False)
    out.print(f"replay sim options: {fit.sim_flags()}", markup=False, highlight=False)


def ingest_replay_run_cmd(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories written by replay sim.")],
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store simulated replay runs (requests, /metrics snapshots, runs row). Safe to run twice.

    Example: prefixscope ingest replay-run out/replay/sim-conversation-20261129T101500Z-3fa2c1
    """
    docs = _ingest(db, list(run_dirs))
    if as_json:
        print_json(docs)
        return
    for d in docs:
        out.print(f"run {d['run_id']}: {d['requests_added']:,} requests added, "
                  f"{d['metric_samples_added']:,} metric samples from "
                  f"{d['metric_snapshots']} snapshots", markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``replay sim``, ``replay compare``, ``replay chat-trace`` and ``ingest replay-run``."""
    groups["replay"].command("sim")(sim_cmd)
    groups["replay"].command("compare")(compare_cmd)
    groups["replay"].command("chat-trace")(chat_trace_cmd)
    groups["replay"].command("fit-steps")(fit_steps_cmd)
    groups["ingest"].command("replay-run")(ingest_replay_run_cmd)


def _print_compare(doc: dict[str, Any], price_model: str | None = None) -> None:
    a, b, d = doc["a"], doc["b"], doc["delta"]
    price = doc.get("price")
    rows = [("hit rate", _fmt_pct(a["hit_rate"]), _fmt_pct(b["hit_rate"]),
             "n/a" if d["hit_rate"] is None else f"{100 * d['hit_rate']:+.1f} pp"),
            ("prompt tokens", f"{a['prompt_tokens']:,}", f"{b['prompt_tokens']:,}",
             f"{d['prompt_tokens']:+,}"),
            ("cached tokens", f"{a['cached_tokens']:,}", f"{b['cached_tokens']:,}",
             f"{d['cached_tokens']:+,}")]
    if price is not None:
        cur = price["currency"]
        for key, name in (("cost_with_cache", "cost with cache"), ("saved", "saved by cache")):
            rows.append((f"{name} ({cur})", f"{a[key]:,.4f}", f"{b[key]:,.4f}", f"{d[key]:+,.4f}"))
    out.print(f"A: {a['label']}\nB: {b['label']}", markup=False, highlight=False)
    out.print(f"{'':<24}{'A':>16}{'B':>16}{'B - A':>16}", markup=False, highlight=False)
    for name, va, vb, vd in rows:
        out.print(f"{name:<24}{va:>16}{vb:>16}{vd:>16}", markup=False, highlight=False)
    if price is None:
        out.print(f"cost: no price for {price_model or 'this model'} in the "
                  "database's price table nor in the price file (give --price-as MODEL, or "
                  "--prices FILE)", markup=False, highlight=False)
    else:
        kind = "shadow price" if price["shadow"] else "price"
        out.print(f"cost at the {kind} of {price['model']} ({price['price_source']})",
                  markup=False, highlight=False)
    out.print(f"files: {doc['out_dir']}", markup=False, highlight=False)
