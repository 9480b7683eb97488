"""``prefixscope hitrate``: token-weighted prefix-cache hit rate per window."""

from __future__ import annotations

import math
from enum import Enum
from typing import Annotated, Any

import typer

from prefixscope.cli.options import AllRunsOption
from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, SafeConsole, out, print_json
from prefixscope.core.errors import UsageError
from prefixscope.core.times import format_time, parse_duration, parse_time

#: Grouping accepted by ``--by`` (``scope`` only with ``--source requests``).
BY_CHOICES = ("model", "instance", "model,instance", "scope")
SCOPE_NEEDS_REQUESTS = "scope needs per-request data: use --source requests"


class Source(str, Enum):
    """Where the hit rate comes from."""

    auto = "auto"
    counters = "counters"
    requests = "requests"


#: What the table title and the empty message name for each source.
SOURCE_TITLE = {
    "counters": "counters",
    "requests": "requests: usage logs, Σ cached / Σ prompt tokens",
}


def _by_tuple(by: str, source: Source) -> tuple[str, ...]:
    # ``scope`` (PUBLIC / TENANT / PRINCIPAL) exists only per request: it is passed through to
    # the requests-based query (store.queries.requests, where scope analytics live); vLLM's
    # counters carry no scope, so with --source counters it is refused.
    cols = tuple(c.strip() for c in by.split(",") if c.strip())
    if not cols or any(c not in ("model", "instance", "scope") for c in cols):
        raise UsageError(f"--by {by!r}: use one of {', '.join(BY_CHOICES)}")
    if "scope" in cols and source is Source.counters:
        raise UsageError(SCOPE_NEEDS_REQUESTS)
    return cols


def resolve_source(db: str, source: Source, by: tuple[str, ...],
                   run_ids: list[str] | None) -> Source:
    """``auto``: the counters when the selected runs have any counter sample, else the requests
    (usage logs: the common case behind a gateway); ``--by scope`` is per request only. The
    other sources are returned as given."""
    if source is not Source.auto:
        return source
    if "scope" in by:
        return Source.requests
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.requests import has_counters

    with store_db.reader(db) as con:
        return Source.counters if has_counters(con, run_ids) else Source.requests


def hit_rate_rows(db: str, *, by: tuple[str, ...], window_s: float, start_s: float | None,
                  end_s: float | None, models: list[str] | None, instances: list[str] | None,
                  source: Source,
                  run_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows for the ``hitrate`` command: one dict per window and group (oldest first).

    ``run_ids``: runs to include (``''`` = production traffic); None = every run.

    ``source`` ``auto`` is resolved first (:func:`resolve_source`).

    Keys: ``source`` (``counters`` or ``requests``), ``model``, ``instance`` (None when not grouped by it), ``scope`` (requests source,
    grouped by scope), ``window_start`` / ``window_end`` (ISO 8601 UTC), ``window_start_s`` /
    ``window_end_s`` (Unix seconds), ``hit_tokens``, ``query_tokens`` (tokens), ``hit_rate``
    (fraction or None), then per source: counters ``restarts``, ``legacy``,
    ``external_hit_tokens``; requests ``requests``, ``reported_requests``, ``coverage``.

    Raises:
        UsageError: ``--source requests`` when the per-request module is missing.
    """
    from prefixscope.store import db as store_db

    source = resolve_source(db, source, by, run_ids)
    with store_db.reader(db) as con:
        if source is Source.counters:
            from prefixscope.store.queries.metrics import hit_rate_by_window

            df = hit_rate_by_window(con, start_s=start_s, end_s=end_s, window_s=window_s, by=by,
                                    models=models, instances=instances, run_ids=run_ids)
        else:
            try:
                from prefixscope.store.queries.requests import request_hit_rate_by_window
            except ImportError as exc:
                raise UsageError("--source requests is not available: "
                                 "prefixscope.store.queries.requests.request_hit_rate_by_window is missing") from exc
            df = request_hit_rate_by_window(con, start_s=start_s, end_s=end_s, window_s=window_s,
                                            by=by, models=models, instances=instances,
                                            run_ids=run_ids)
    rows: list[dict[str, Any]] = []
    for rec in df.to_dict("records"):
        row: dict[str, Any] = {
            "source": source.value,
            "model": _label(rec.get("model")) if "model" in by else None,
            "instance": _label(rec.get("instance")) if "instance" in by else None,
        }
        if "scope" in by:
            row["scope"] = _label(rec.get("scope"))
        row.update({
            "window_start": format_time(rec["window_start_s"]),
            "window_end": format_time(rec["window_end_s"]),
            "window_start_s": float(rec["window_start_s"]),
            "window_end_s": float(rec["window_end_s"]),
        })
        if source is Source.counters:
            row.update({
                "hit_tokens": int(rec["hit_tokens"]), "query_tokens": int(rec["query_tokens"]),
                "hit_rate": _fraction(rec["hit_rate"]), "restarts": int(rec["restarts"]),
                "legacy": bool(rec["legacy"]),
                "external_hit_tokens": int(rec["external_hit_tokens"]),
            })
        else:
            row.update({
                "hit_tokens": _int(rec.get("cached_tokens")),
                "query_tokens": _int(rec.get("reported_prompt_tokens")),
                "hit_rate": _fraction(rec.get("hit_rate")),
                "requests": _int(rec.get("requests")),
                "reported_requests": _int(rec.get("reported_requests")),
                "coverage": _fraction(rec.get("coverage")),
            })
        rows.append(row)
    return rows


def _label(x: Any) -> Any:
    # pandas turns a NULL label into NaN, which is not JSON: None ("-" in the table).
    return None if isinstance(x, float) and math.isnan(x) else x


def _fraction(x: Any) -> float | None:
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _int(x: Any) -> int | None:
    f = _fraction(x)
    return None if f is None else int(round(f))


def hitrate_cmd(
    by: Annotated[str, typer.Option(
        "--by", help="Group by model, instance, or model,instance (scope: with --source requests).")] = "model",
    window: Annotated[str, typer.Option("--window", help="Window length: 5m, 1h, 1d (any duration).")] = "1h",
    start: Annotated[str | None, typer.Option("--start", help="From (ISO 8601, Unix seconds, -1d).")] = None,
    end: Annotated[str | None, typer.Option("--end", help="Until, exclusive (ISO 8601, Unix seconds, now).")] = None,
    model: Annotated[list[str] | None, typer.Option("--model", help="Only this model (repeatable).")] = None,
    instance: Annotated[list[str] | None, typer.Option("--instance", help="Only this instance (repeatable).")] = None,
    source: Annotated[Source, typer.Option(
        "--source", help="auto (counters when stored, else usage logs), counters (vLLM /metrics "
        "increases) or requests (usage logs).")] = Source.auto,
    run: Annotated[list[str] | None, typer.Option(
        "--run", help="Only this replay run (run id; repeatable) instead of production traffic.")] = None,
    all_runs: AllRunsOption = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Token-weighted hit rate per window: Σ hit increases / Σ query increases.

    Counters: increases of vllm:prefix_cache_hits_total and _queries_total (a drop is a
    restart, counted from the new value; no extrapolation). Requests: Σ cached_tokens /
    Σ prompt_tokens over requests that reported cached tokens. auto (default): counters when
    the selected runs have any, else requests; the table title names the source.

    Example: prefixscope hitrate --by model --window 1h --json
    """
    from prefixscope.cli.options import check_runs

    check_runs(db, None if all_runs else run)
    cols = _by_tuple(by, source)
    start_s = parse_time(start) if start is not None else None
    end_s = parse_time(end) if end is not None else None
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise UsageError(f"--end ({end}) must be after --start ({start})")
    rows = hit_rate_rows(db, by=cols, window_s=parse_duration(window), start_s=start_s,
                         end_s=end_s, models=model or None, instances=instance or None,
                         source=source,
                         run_ids=None if all_runs else (list(run) if run else [""]))
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no hit-rate data in this range (ingest metrics or requests first)")
        return
    _print_table(rows, cols, Source(rows[0]["source"]))
    from prefixscope.core.report import uncounted_note_of
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.requests import counters_and_requests

    with store_db.reader(db) as con:
        note = uncounted_note_of(counters_and_requests(
            con, start_s=start_s, end_s=end_s, models=model or None,
            instances=instance or None,
            run_ids=None if all_runs else (list(run) if run else [""])))
    if note:
        out.print(f"note: {note}", markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add the ``hitrate`` command."""
    groups["app"].command("hitrate")(hitrate_cmd)

#: Narrowest a label (model, instance, scope) or notes column gets before it folds; below the
#: table's minimum the whole table is printed wider than the terminal instead.
LABEL_MIN_WIDTH = 8


def _print_table(rows: list[dict[str, Any]], cols: tuple[str, ...], source: Source) -> None:
    """Print the rows as a table that fits the terminal without ever cutting a number.

    The window start and the three figures get columns exactly as wide as their widest cell:
    never wrapped, never ellipsised (two-line headers keep them narrow; the window start drops
    ``:SSZ`` when every window starts on a whole minute). The labels (model, instance, scope)
    fold onto more lines when the terminal is narrow. Notes (restarts, legacy names, external
    hits, coverage) are a column when it fits, else lines under the table. When even the
    labels' minimum does not fit, the table is printed at the width it needs and the terminal
    wraps its lines.
    """
    from rich.table import Table

    whole_minutes = all(float(r["window_start_s"]) % 60 == 0 for r in rows)
    body = []
    for r in rows:
        rate = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
        notes = []
        if source is Source.counters:
            if r["restarts"]:
                notes.append(f"{r['restarts']} restart(s)")
            if r["legacy"]:
                notes.append("legacy names")
            if r["external_hit_tokens"]:
                notes.append(f"+{r['external_hit_tokens']:,} external hits")
        elif r.get("coverage") is not None and r["coverage"] < 1:
            notes.append(f"coverage {r['coverage']:.0%}")
        window = (r["window_start"][:16].replace("T", " ") if whole_minutes
                  else r["window_start"])
        body.append((window, [str(r.get(c) if r.get(c) is not None else "-") for c in cols],
                     [f"{r['hit_tokens'] or 0:,}", f"{r['query_tokens'] or 0:,}", rate],
                     ", ".join(notes)))

    def widest(header: str, cells: list[str]) -> int:
        return max([len(c) for c in cells] + [len(line) for line in header.split("\n")])

    window_header = "window start\n(UTC)"
    figure_headers = ("hit\ntokens", "query\ntokens", "hit\nrate")
    fixed = [widest(window_header, [b[0] for b in body])] + [
        widest(h, [b[2][j] for b in body]) for j, h in enumerate(figure_headers)]
    label_min = [min(widest(c, [b[1][k] for b in body]), LABEL_MIN_WIDTH)
                 for k, c in enumerate(cols)]
    # Every column takes 2 padding cells and 1 border, plus the closing border.
    needed = sum(fixed) + sum(label_min) + 3 * (len(fixed) + len(cols)) + 1
    notes_min = min(widest("notes", [b[3] for b in body]), LABEL_MIN_WIDTH)
    has_notes = any(b[3] for b in body)
    notes_column = has_notes and needed + 3 + notes_min <= out.width

    table = Table(title=f"prefix-cache hit rate ({SOURCE_TITLE[source.value]})")
    table.add_column(window_header, no_wrap=True, width=fixed[0])
    for c, width in zip(cols, label_min):
        table.add_column(c, overflow="fold", min_width=width)
    for header, width in zip(figure_headers, fixed[1:]):
        table.add_column(header, justify="right", no_wrap=True, width=width)
    if notes_column:
        table.add_column("notes", overflow="fold", min_width=notes_min)
    for window, labels, figures, notes in body:
        table.add_row(window, *labels, *figures, *([notes] if notes_column else []))
    if needed > out.width:
        # Console.print caps width= at the console's own width: a console of the needed width
        # on the same stream prints the whole table (the terminal wraps the long lines).
        SafeConsole(file=out.file, width=needed, color_system=out.color_system,
                force_terminal=out.is_terminal, soft_wrap=True).print(table, crop=False)
    else:
        out.print(table)
    if has_notes and not notes_column:
        out.print("notes:", markup=False, highlight=False)
        for window, labels, _, notes in body:
            if notes:
                out.print(f"  {window} {' '.join(labels)}: {notes}", markup=False,
                          highlight=False)
