"""``prefixscope ingest metrics | prometheus | query-range | kv-events``: counters, Prometheus
ranges (live or saved), KV events."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Annotated

import typer

from prefixscope.cli.common import (DB_DEFAULT, DbOption, JsonOption, err, out,
                                     print_json, print_quarantined)
from prefixscope.core.formatting import count_noun
from prefixscope.core.errors import NothingIngested, UsageError
from prefixscope.core.times import parse_duration, parse_time


@contextmanager
def _stop_on_sigterm():
    """An event set by SIGTERM (and the previous handler restored after)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def _report(outcomes, errors, *, as_json: bool, printer=None) -> None:
    """Print the failed sources on stderr, then each stored source's outcome (or the JSON list).

    ``printer(outcome, quiet=...)`` prints one outcome (default `_print_outcome`, counting
    samples; `_print_kv` counts event rows)."""
    printer = printer or _print_outcome
    for e in errors:
        err.print(f"error: {e}", markup=False, highlight=False)
    for o in outcomes:
        printer(o, quiet=as_json)
    if as_json:
        print_json([_outcome_json(o) for o in outcomes])


def _print_outcome(outcome, *, quiet: bool, noun: str = "sample") -> None:
    """One outcome's line (``SOURCE: N <noun>s added, ...`` and its note) unless ``quiet``,
    then its quarantined lines (printed in both modes)."""
    s = outcome.summary
    if not quiet:
        dup = f"{s.rows_duplicate:,} already stored"
        if s.rows_repeated_in_file:  # kv-events: replayed batches inside the file
            dup = (f"{s.rows_repeated_in_file:,} repeated within the file (replayed batches), "
                   f"{s.rows_duplicate - s.rows_repeated_in_file:,} already stored")
        out.print(f"{s.source}: {count_noun(s.rows_added, noun)} added, {dup}, "
                  f"{count_noun(s.rows_quarantined, 'line')} quarantined",
                  markup=False, highlight=False)
        if s.note:
            out.print(f"  note: {s.note}", markup=False, highlight=False)
    print_quarantined(outcome.problems, total=s.rows_quarantined)


def _print_kv(outcome, *, quiet: bool) -> None:
    """`_print_outcome` counting KV-event rows."""
    _print_outcome(outcome, quiet=quiet, noun="event row")


def _outcome_json(outcome) -> dict:
    d = outcome.summary.as_dict()
    d["quarantined"] = [
        {"location": q.location, "line": q.line, "field": q.field, "reason": q.reason}
        for q in outcome.problems]
    return d


def metrics_cmd(
    sources: Annotated[list[str], typer.Argument(
        help="/metrics URLs (http://host:port/metrics) or saved exposition files.")],
    instance: Annotated[str | None, typer.Option(
        "--instance", help="Instance name (default: host:port of the URL; for saved files the "
        "name of their folder, so saved scrapes of one server are one series).")] = None,
    at: Annotated[str | None, typer.Option(
        "--at", help="Scrape time for files (ISO 8601, Unix seconds, -1h); default the file's mtime.")] = None,
    every: Annotated[str | None, typer.Option(
        "--every", help="Scrape again every N seconds (e.g. 15 or 15s) until Ctrl-C / SIGTERM.")] = None,
    max_scrapes: Annotated[int | None, typer.Option(
        "--max-scrapes", min=1, help="With --every: stop after this many rounds.")] = None,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store vLLM prefix-cache counters from /metrics URLs or saved exposition files.

    Keeps prefix_cache queries/hits (and external), prompt_tokens*, request_success,
    kv_cache_usage_perc, num_preemptions, TTFT and prefill-computed histograms and
    cache_config_info. Malformed lines are quarantined (file:line), good ones kept;
    re-ingesting the same scrape adds nothing.

    Examples:

      prefixscope ingest metrics http://localhost:8000/metrics --every 15

      prefixscope ingest metrics saved.txt --instance vllm-a --at 2026-11-28T10:00:00Z
    """
    from prefixscope.ingest.exposition import (file_instance, ingest_sources, is_url,
                                               nothing_error, scrape_loop)

    at_unix_s = parse_time(at) if at is not None else None
    if every is None:
        if max_scrapes is not None:
            raise UsageError("--max-scrapes needs --every")
        if instance is None and not as_json:  # files that can be read (the others: an error)
            for name in dict.fromkeys(file_instance(s) for s in sources
                                      if not is_url(s) and os.path.isfile(s)):
                out.print(f"instance {name}: the folder of the saved files (one series per "
                          "server; --instance names it)", markup=False, highlight=False)
        outcomes, errors = ingest_sources(
            db, sources, instance=instance, at_unix_s=at_unix_s, raise_when_nothing=False,
            on_warning=lambda m: err.print(f"warning: {m}", markup=False, highlight=False))
        _report(outcomes, errors, as_json=as_json)  # the reasons first, even when all are bad
        if not any(o.summary.rows_read > 0 for o in outcomes):
            raise nothing_error(outcomes, errors)
        return
    if at is not None:
        raise UsageError("--at stamps saved files; it cannot be used with --every")
    every_s = parse_duration(every)
    with _stop_on_sigterm() as stop:
        result = scrape_loop(
            db, sources, every_s=every_s, instance=instance, max_scrapes=max_scrapes,
            stop=stop, on_scrape=lambda o: _print_outcome(o, quiet=as_json),
            on_error=lambda m: err.print(f"error: {m}", markup=False, highlight=False))
    if as_json:
        print_json([_outcome_json(o) for o in result.outcomes])  # the last 1,000 scrapes
    if result.rows_read == 0:
        raise nothing_error(list(result.outcomes), list(result.errors))


def prometheus_cmd(
    url: Annotated[str, typer.Argument(
        help="Base URL of a Prometheus-compatible query API (Prometheus, Thanos, Mimir, VictoriaMetrics).")],
    start: Annotated[str, typer.Option("--start", help="Range start (ISO 8601, Unix seconds, -1h).")],
    end: Annotated[str, typer.Option("--end", help="Range end (ISO 8601, Unix seconds, now).")] = "now",
    step: Annotated[str | None, typer.Option(
        "--step", help="Sample the range every STEP (query_range, e.g. 15s) instead of pulling raw samples.")] = None,
    instance_label: Annotated[str, typer.Option(
        "--instance-label", help="Label that names the vLLM instance.")] = "instance",
    chunk: Annotated[str, typer.Option(
        "--chunk", help="Raw mode: length of each range query (e.g. 1h).")] = "1h",
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Pull vLLM counters for a time range from a Prometheus-compatible API into the store.

    Raw samples by default (range-vector queries: exact scrape times and values), or values
    every --step through query_range. Labels are kept minus job; the instance comes from
    --instance-label.

    Example: prefixscope ingest prometheus http://localhost:9090 --start -6h --end now
    """
    from prefixscope.ingest.prometheus_api import ingest_prometheus_range, range_nothing_error

    start_s, end_s = parse_time(start), parse_time(end)
    if end_s <= start_s:
        raise UsageError(f"--end ({end}) must be after --start ({start})")
    outcome = ingest_prometheus_range(
        db, url, start_s=start_s, end_s=end_s, raise_when_nothing=False,
        step_s=parse_duration(step) if step is not None else None,
        instance_label=instance_label, chunk_s=parse_duration(chunk))
    _print_outcome(outcome, quiet=as_json)  # the reasons first, even when all are bad
    if as_json:
        print_json([_outcome_json(outcome)])
    if outcome.summary.rows_read == 0:
        raise range_nothing_error(outcome, start_s=start_s, end_s=end_s)


def query_range_cmd(
    files: Annotated[list[str], typer.Argument(
        help="Saved Prometheus /api/v1/query_range answers (JSON), e.g. curl "
             "'http://prom:9090/api/v1/query_range?query=...&start=...&end=...&step=15s' > FILE.")],
    step: Annotated[str | None, typer.Option(
        "--step", help="The step the answers were queried with (e.g. 15s): places restart "
        "zeros on the step grid. Leave out for raw samples (a range-vector /api/v1/query).")] = None,
    instance_label: Annotated[str, typer.Option(
        "--instance-label", help="Label that names the vLLM instance (series without it take "
        "the file name stem).")] = "instance",
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store vLLM counters from saved Prometheus query_range answers (no server needed).

    The recorded-file form of `ingest prometheus`: the same series and labels rules, one
    transaction per file; series with refused labels are quarantined (file:line), good ones
    kept; ingesting the same file again adds nothing.

    Example: prefixscope ingest query-range prom-export.json --step 15s
    """
    from prefixscope.ingest.prometheus_api import ingest_query_range_files

    from prefixscope.ingest.exposition import nothing_error

    outcomes, errors = ingest_query_range_files(
        db, files, instance_label=instance_label, raise_when_nothing=False,
        step_s=parse_duration(step) if step is not None else None)
    _report(outcomes, errors, as_json=as_json)  # the reasons first, even when all are bad
    if not any(o.summary.rows_read > 0 for o in outcomes):
        raise nothing_error(outcomes, errors)


def kv_events_cmd(
    files: Annotated[list[str] | None, typer.Argument(
        help="Decoded KV-event captures (JSONL, one ZMQ message per line).")] = None,
    zmq: Annotated[str | None, typer.Option(
        "--zmq", help="Subscribe live to a vLLM KV-events publisher, e.g. tcp://host:5557.")] = None,
    replay_endpoint: Annotated[str | None, typer.Option(
        "--replay-endpoint", help="vLLM's replay socket (e.g. tcp://host:5558): fetch buffered and missed batches.")] = None,
    bind: Annotated[bool, typer.Option(
        "--bind", help="Bind the subscriber socket (when vLLM's endpoint has no '*', vLLM connects).")] = False,
    topic: Annotated[str, typer.Option("--topic", help="ZMQ topic prefix to subscribe to.")] = "",
    instance: Annotated[str | None, typer.Option(
        "--instance", help="Instance name (default: endpoint host:port, or the file name stem).")] = None,
    max_seconds: Annotated[float | None, typer.Option(
        "--max-seconds", help="With --zmq: stop after this many seconds.")] = None,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store vLLM KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared).

    From decoded JSONL captures, or live from the ZMQ publisher (msgpack) until Ctrl-C,
    SIGTERM or --max-seconds. Replayed batches are stored once.

    Examples:

      prefixscope ingest kv-events data/vllm-cpu-0.32/kv_events.jsonl --instance vllm-a

      prefixscope ingest kv-events --zmq tcp://127.0.0.1:5557 --bind --replay-endpoint tcp://127.0.0.1:5558
    """
    from prefixscope.ingest import kv_events

    if not files and zmq is None:
        raise UsageError("give KV-event files or --zmq ENDPOINT")
    if files and zmq is not None:
        raise UsageError("give either files or --zmq, not both")
    if zmq is None:
        outcomes, errors = kv_events.ingest_kv_event_files(db, files or [], instance=instance,
                                                           raise_when_nothing=False)
        _report(outcomes, errors, as_json=as_json, printer=_print_kv)  # the reasons first
        nothing = kv_events.nothing_read_error(outcomes, errors)
        if nothing is not None:
            raise nothing
        return
    with _stop_on_sigterm() as stop:
        outcome = kv_events.subscribe(
            db, zmq, replay_endpoint=replay_endpoint, bind=bind, topic=topic,
            instance=instance, max_seconds=max_seconds, stop=stop,
            on_notice=lambda m: err.print(m, markup=False, highlight=False))
    _print_kv(outcome, quiet=as_json)
    if as_json:
        print_json([_outcome_json(outcome)])
    if outcome.summary.rows_read == 0 and not outcome.problems:
        raise NothingIngested(f"nothing could be read: {outcome.summary.note}")


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``ingest metrics``, ``ingest prometheus``, ``ingest query-range`` and
    ``ingest kv-events``."""
    groups["ingest"].command("metrics")(metrics_cmd)
    groups["ingest"].command("prometheus")(prometheus_cmd)
    groups["ingest"].command("query-range")(query_range_cmd)
    groups["ingest"].command("kv-events")(kv_events_cmd)

