"""``prefixscope report``: the report line per model and overall (subcommands such as
``report daily`` live in their own modules)."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.options import AllRunsOption
from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, out, print_json


REPORT_HELP = """Print, per model and overall, how many prompt tokens came from the prefix cache.

One line per model and an overall line, e.g.
"608,000 of 644,000 prompt tokens from cache (94.4%): OK", or below the threshold
"0 of 644,000 prompt tokens from cache (0.0%): ALERT: check the top of the prompt".
The percentage has one decimal, rounded, as on the dashboard. Without --start/--end the range is the 24 hours
ending at the newest data point. Subcommands: 'report daily'.

Examples:

  prefixscope report

  prefixscope report --start 2026-11-28 --end 2026-11-29 --source requests --json
"""


def report_cmd(
    ctx: typer.Context,
    start: Annotated[str | None, typer.Option(
        "--start", help="Range start (ISO 8601, Unix seconds, -1h). Default: 24 h before --end.")] = None,
    end: Annotated[str | None, typer.Option(
        "--end", help="Range end, exclusive (default: just after the newest data point).")] = None,
    source: Annotated[str, typer.Option(
        "--source", help="auto (counters when there are samples in range, else requests; a "
                         "model without counters in range from its requests), counters or "
                         "requests.")] = "auto",
    threshold: Annotated[float | None, typer.Option(
        "--threshold", min=0.0, max=1.0, help="ALERT below this hit rate (fraction). Default: "
        "[alerts] hit_rate_threshold of the config file, else 0.5.")] = None,
    run: Annotated[str | None, typer.Option(
        "--run", help="Report this replay run (run id) instead of production traffic.")] = None,
    all_runs: AllRunsOption = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """The report line; see REPORT_HELP."""
    if ctx.invoked_subcommand is not None:
        return  # e.g. 'report daily': its own options, its own command
    from prefixscope.core.errors import UsageError
    from prefixscope.core.times import format_time, parse_time
    from prefixscope.store import db as store_db
    from prefixscope.core.report import uncounted_note_of
    from prefixscope.store.queries.requests import counters_and_requests, report

    if threshold is None:
        from prefixscope.core.config import load_settings

        threshold = load_settings().alerts.hit_rate_threshold
    start_s = parse_time(start) if start is not None else None
    end_s = parse_time(end) if end is not None else None
    if start_s is not None and end_s is not None and start_s >= end_s:
        raise UsageError("--start must be before --end")
    from prefixscope.cli.options import check_runs

    check_runs(db, None if all_runs or run is None else [run])
    run_ids = None if all_runs else ((run,) if run is not None else ("",))
    with store_db.reader(db) as con:
        result = report(con, start_s=start_s, end_s=end_s, threshold=threshold,
                        source=source, run_ids=run_ids)
        note = uncounted_note_of(counters_and_requests(
            con, start_s=result.start_s, end_s=result.end_s, run_ids=run_ids))
    span = (f"{format_time(result.start_s) if result.start_s is not None else 'the beginning'}"
            f" to {format_time(result.end_s) if result.end_s is not None else 'now'}")
    if as_json:
        print_json({
            "source": result.source, "start_unix_s": result.start_s,
            "end_unix_s": result.end_s,
            "start": None if result.start_s is None else format_time(result.start_s),
            "end": None if result.end_s is None else format_time(result.end_s),
            "threshold": threshold,
            "lines": [{"model": ln.model, "cached_tokens": ln.cached_tokens,
                       "prompt_tokens": ln.prompt_tokens, "hit_rate": ln.hit_rate,
                       "status": ln.status, "text": ln.text, "requests": ln.requests,
                       "reported_requests": ln.reported_requests, "legacy": ln.legacy,
                       "source": ln.source}
                      for ln in result.lines], "note": note})
        return
    what = ("vLLM counters (prefix_cache_hits / prefix_cache_queries)"
            if result.source == "counters" else
            "request usage logs (cached_tokens / prompt_tokens of requests reporting them)")
    out.print(f"source: {what}, {span}", markup=False, highlight=False)
    if not result.lines:
        out.print("no prompt tokens in this range: NO DATA", markup=False, highlight=False)
        return
    width = max(len(ln.model or "overall") for ln in result.lines)
    for ln in result.lines:
        name = ln.model if ln.model is not None else "overall"
        out.print(f"{name:<{width}}  {ln.text}", markup=False, highlight=False)
        if ln.requests is not None and ln.reported_requests != ln.requests:
            out.print(f"{'':<{width}}  (cached_tokens reported by {ln.reported_requests:,} "
                      f"of {ln.requests:,} requests; the others are not counted)",
                      markup=False, highlight=False)
        if result.source == "counters" and ln.source == "requests":
            out.print(f"{'':<{width}}  (from the usage log: no vLLM counters for this model in "
                      "the range)", markup=False, highlight=False)
        elif ln.source == "mixed":
            out.print(f"{'':<{width}}  (counters for some models, the usage log for the others)",
                      markup=False, highlight=False)
        if ln.legacy:
            out.print(f"{'':<{width}}  (legacy metric names vllm:gpu_prefix_cache_*)",
                      markup=False, highlight=False)
    if note:
        out.print(f"note: {note}", markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Make ``prefixscope report`` (no subcommand) print the report lines."""
    groups["report"].callback(invoke_without_command=True, help=REPORT_HELP)(report_cmd)
