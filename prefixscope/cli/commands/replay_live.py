"""``prefixscope replay live`` and ``prefixscope ingest live-run``: replay a trace on a real
server (vLLM or any OpenAI-compatible one) and store what it reported."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, err, out, print_json
from prefixscope.cli.options import FormatOption, LimitOption, TokenizerOption, TraceArg
from prefixscope.core.errors import NothingIngested, UsageError


def _print_summary(s) -> None:
    hr = "n/a" if s.hit_rate is None else f"{s.hit_rate:.4f}"
    out.print(f"run {s.run_id}: {s.requests} requests answered, {s.failed} failed; "
              f"prompt {s.prompt_tokens:,} tokens, cached {s.cached_tokens:,} tokens, "
              f"hit rate {hr} (Σ cached / Σ prompt)", markup=False, highlight=False)
    q = s.deltas.get("vllm:prefix_cache_queries_total")
    h = s.deltas.get("vllm:prefix_cache_hits_total")
    if q is not None and h is not None:
        note = "" if s.settled else " (counters had not caught up when scraped)"
        out.print(f"  /metrics deltas: queries {q:,.0f}, hits {h:,.0f}{note}",
                  markup=False, highlight=False)
    if s.ttft_ms_p50 is not None:
        out.print(f"  TTFT p50 {s.ttft_ms_p50:.1f} ms, p90 {s.ttft_ms_p90:.1f} ms; latency p50 "
                  f"{s.latency_ms_p50:.1f} ms, p90 {s.latency_ms_p90:.1f} ms",
                  markup=False, highlight=False)
    out.print(f"  files: {s.out_dir}", markup=False, highlight=False)


def live_cmd(
    trace: TraceArg,
    base_url: Annotated[str, typer.Option(
        "--base-url", help="Server root, e.g. http://127.0.0.1:8000 (not .../v1).")],
    fmt: FormatOption = "auto",
    endpoint: Annotated[str, typer.Option(
        "--endpoint", help="completions (token-id prompts, exact) or chat (detokenized text).")] = "completions",
    model: Annotated[str | None, typer.Option(
        "--model", help="Model name to send (default: the server's first model).")] = None,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", min=1, help="Closed loop: requests in flight (default 1 = sequential).")] = None,
    rate_from_trace: Annotated[bool, typer.Option(
        "--rate-from-trace", help="Open loop: send at the trace's arrival times / --speedup.")] = False,
    speedup: Annotated[float, typer.Option(
        "--speedup", min=0.0001, help="With --rate-from-trace: time compression factor.")] = 1.0,
    salt_per_tenant: Annotated[bool, typer.Option(
        "--salt-per-tenant", help="Send cache_salt = the request's tenant digest.")] = False,
    output_tokens: Annotated[str, typer.Option(
        "--output-tokens", help="trace (fixed lengths from the trace) or 0 (one token).")] = "trace",
    no_fixed_output: Annotated[bool, typer.Option(
        "--no-fixed-output", help="Let the model stop at EOS (no ignore_eos/min_tokens).")] = False,
    no_stream: Annotated[bool, typer.Option("--no-stream", help="Do not stream (no TTFT).")] = False,
    hash_id_block_size: Annotated[int, typer.Option(
        "--hash-id-block-size", help="Tokens per hash id (mooncake: 512; Bailian: 16).")] = 512,
    block_size: Annotated[int, typer.Option(
        "--block-size", help="The server's KV block size (tokens).")] = 32,
    vocab_size: Annotated[int, typer.Option(
        "--vocab-size", help="Hash-id traces: token ids are drawn below this.")] = 4096,
    tokenizer: TokenizerOption = None,
    limit: LimitOption = None,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Retries on 429/5xx.")] = 5,
    timeout: Annotated[float, typer.Option("--timeout", help="Per-request timeout, seconds.")] = 300.0,
    api_key_env: Annotated[str | None, typer.Option(
        "--api-key-env", help="Name of an environment variable holding the API key.")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Run directory (default out/replay/<run id>).")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (default live-<label>-<time>-<hex>).")] = None,
    label: Annotated[str | None, typer.Option("--label", help="Free-text label of the run.")] = None,
    instance: Annotated[str | None, typer.Option(
        "--instance", help="Instance name for the rows (default host:port of --base-url).")] = None,
    no_metrics: Annotated[bool, typer.Option(
        "--no-metrics", help="Do not scrape /metrics before and after.")] = False,
    record_tokens: Annotated[bool, typer.Option(
        "--record-tokens", help="Also write trace.jsonl (the exact traffic as token ids).")] = False,
    ingest: Annotated[bool, typer.Option(
        "--ingest", help="Store the run in the database (requests, scrapes, counter deltas).")] = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Replay a trace against a live OpenAI-compatible server (vLLM) and record the usage.

    Sends token-id prompts to /v1/completions (exact), streams with
    stream_options.include_usage to measure TTFT, fixes output lengths (ignore_eos,
    min_tokens = max_tokens) and records the output ids (return_token_ids). Scrapes
    /metrics before and after to get run-scoped counter deltas. Writes requests.jsonl
    (the ingest format), failed.jsonl, metrics_before.prom, metrics_after.prom, run.json.

    Examples:

      prefixscope replay live data/live-replay-sample/trace.jsonl --base-url http://127.0.0.1:8011 --concurrency 4 --ingest

      prefixscope replay live conversation_trace.jsonl --format mooncake --base-url http://gpu1:8000 --rate-from-trace --speedup 10 --limit 500
    """
    from prefixscope.replay.live import LiveConfig
    from prefixscope.replay.live_run import run_live
    from prefixscope.replay.traces import read_trace

    if rate_from_trace is False and speedup != 1.0:
        raise UsageError("--speedup needs --rate-from-trace")
    if output_tokens not in ("trace", "0"):
        raise UsageError("--output-tokens must be 'trace' or '0'")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise UsageError(f"--api-key-env {api_key_env}: the variable is not set")
    cfg = LiveConfig(
        base_url=base_url, endpoint=endpoint, model=model,
        concurrency=concurrency or (64 if rate_from_trace else 1),
        rate_from_trace=rate_from_trace, speedup=speedup, salt_per_tenant=salt_per_tenant,
        fixed_output=not no_fixed_output, stream=not no_stream, max_retries=retries,
        timeout_s=timeout, api_key=api_key, block_size=block_size,
        synth_token_max=vocab_size,
    )
    read = read_trace(trace, format=fmt, hash_id_block_size=hash_id_block_size,
                      block_size=block_size, tokenizer_dir=tokenizer,
                      output_tokens=output_tokens, vocab_size=vocab_size, limit=limit)
    requests = list(read.requests)
    for p in read.problems[:20]:
        err.print(f"skipped {p}", markup=False, highlight=False)
    if not requests:
        raise NothingIngested(f"{trace}: no usable requests; {len(read.problems)} records "
                              "skipped")
    from prefixscope.replay.run_ids import default_run_dir, new_run_id

    run_id = run_id or new_run_id("live", label)
    target = out_dir or default_run_dir(run_id)
    params = {"trace": str(trace), "format": read.format, "label": label,
              "requests_in_trace": len(requests), "skipped": len(read.problems)}
    progress_cb, progress_ctx = _progress(len(requests), quiet=as_json)
    with progress_ctx:
        summary, _ = run_live(requests, cfg, target, run_id=run_id, instance=instance,
                              scrape=not no_metrics, on_result=progress_cb,
                              extra_params=params, record_tokens=record_tokens)
    ingested = None
    if ingest:
        from prefixscope.ingest.live_run import ingest_live_run
        from prefixscope.store import db as store_db

        with store_db.writer(db) as con:
            ingested = ingest_live_run(con, target)
    if as_json:
        doc = summary.as_dict()
        if ingested is not None:
            doc["ingested"] = {"db": db, "requests_added": ingested.requests.rows_added,
                               "metric_samples_added": sum(m.rows_added for m in ingested.metrics),
                               "counter_rows": ingested.counter_rows}
        print_json(doc)
        return
    _print_summary(summary)
    if ingested is not None:
        out.print(f"  stored in {db}: {ingested.requests.rows_added} requests, "
                  f"{sum(m.rows_added for m in ingested.metrics)} metric samples, "
                  f"{ingested.counter_rows} counter deltas", markup=False, highlight=False)


def ingest_live_run_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by replay live.")],
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store a live replay run directory (requests, both scrapes, counter deltas).

    Safe to run twice.

    Example: prefixscope ingest live-run out/replay/live-20261129T101500Z-3fa2c1
    """
    from prefixscope.ingest.live_run import ingest_live_run
    from prefixscope.store import db as store_db

    with store_db.writer(db) as con:
        res = ingest_live_run(con, run_dir)
    doc = {"run_id": res.run_id, "requests": res.requests.as_dict(),
           "metrics": [m.as_dict() for m in res.metrics], "counter_rows": res.counter_rows}
    if as_json:
        print_json(doc)
        return
    out.print(f"run {res.run_id}: {res.requests.rows_added} requests added "
              f"({res.requests.rows_duplicate} already stored, "
              f"{res.requests.rows_quarantined} quarantined), "
              f"{sum(m.rows_added for m in res.metrics)} metric samples, "
              f"{res.counter_rows} counter deltas", markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``replay live`` and ``ingest live-run``."""
    groups["replay"].command("live")(live_cmd)
    groups["ingest"].command("live-run")(ingest_live_run_cmd)


def _progress(total: int, *, quiet: bool):
    """(callback, context manager) for a rich progress bar on stderr (no-op when quiet)."""
    import contextlib

    if quiet or not err.is_terminal:
        return None, contextlib.nullcontext()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress("replay", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=True)
    task = progress.add_task("replay", total=total)

    def cb(_result) -> None:
        progress.advance(task)

    return cb, progress
