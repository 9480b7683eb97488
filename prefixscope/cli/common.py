"""Options and output helpers shared by every CLI command (see ``prefixscope.cli``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Console

from prefixscope.core.bounds import escape_control, escape_line
from prefixscope.core.config import DEFAULT_DB_PATH
from prefixscope.core.formatting import count_noun

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="PREFIXSCOPE_DB",
        help="DuckDB file (env PREFIXSCOPE_DB).",
        show_default=True,
    ),
]
DB_DEFAULT = DEFAULT_DB_PATH

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]

class SafeConsole(Console):
    """A rich Console that never passes control characters of the data to the terminal: text
    arguments and the cells, title and caption of a Table are shown with ANSI escapes, BEL, CR
    and the like as ``\\x1b``-style escapes (:func:`prefixscope.core.bounds.escape_control`;
    in a cell also newlines and tabs, :func:`~prefixscope.core.bounds.escape_line`);
    rich's own styling is unaffected."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's name
        super().print(*(safe_renderable(o) for o in objects), **kwargs)


def safe_renderable(obj: Any) -> Any:
    """``obj`` with the control characters of its text escaped (strings and Tables; other
    renderables are returned as they are)."""
    from rich.table import Table

    if isinstance(obj, str):
        return escape_control(obj)
    if isinstance(obj, Table):
        for column in obj.columns:
            column.header = safe_renderable(column.header)
            # a cell is one line: a newline or tab of the data must not split the row
            column._cells = [escape_line(c) if isinstance(c, str) else safe_renderable(c)
                             for c in column._cells]
        obj.title = safe_renderable(obj.title) if obj.title is not None else None
        obj.caption = safe_renderable(obj.caption) if obj.caption is not None else None
    return obj


out = SafeConsole(soft_wrap=True)
err = SafeConsole(stderr=True, soft_wrap=True)


def print_json(value: Any) -> None:
    """Print ``value`` as JSON on stdout (no colour, one document), for ``--json``."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


#: At most this many quarantined lines are printed (all are in the quarantine table).
MAX_PROBLEMS_SHOWN = 20


def print_request_files(res, *, as_json: bool) -> None:
    """Print what a request ingester did with several files
    (:class:`prefixscope.ingest.files.FilesResult`), as ``ingest requests``, ``otlp``,
    ``litellm`` and ``langfuse`` do: each error (``error: ...``, stderr), then ``--json``
    (``files``, ``errors``, ``quarantined``: the first lines quarantined, up to 100 per file,
    ``quarantined_total``: how many were) or one line per file and the first
    :data:`MAX_PROBLEMS_SHOWN` quarantined lines (stderr)."""
    from prefixscope.ingest.files import quarantined_dicts

    problems = quarantined_dicts(res.problems)
    total = max(len(problems), sum(o.summary.rows_quarantined for o in res.outcomes))
    for e in res.errors:
        err.print(f"error: {e}", markup=False, highlight=False)
    if as_json:
        print_json({"files": [o.summary.as_dict() for o in res.outcomes], "errors": res.errors,
                    "quarantined": problems, "quarantined_total": total})
        return
    for o in res.outcomes:
        s = o.summary
        out.print(f"{s.source}: {count_noun(s.rows_added, 'request')} added, "
                  f"{s.rows_duplicate:,} already stored, "
                  f"{count_noun(s.rows_quarantined, 'line')} quarantined",
                  markup=False, highlight=False)
        if s.note:
            out.print(f"  note: {s.note}", markup=False, highlight=False)
    print_quarantined(problems, total=total)


def print_quarantined(problems: Sequence[Any], *, total: int | None = None) -> None:
    """Print the first :data:`MAX_PROBLEMS_SHOWN` quarantined lines on stderr, each as
    ``quarantined file:line: field: reason`` (:func:`prefixscope.core.errors.problem_text`),
    then how many more there are (every one is in the quarantine table). ``problems``:
    quarantine dicts (``location``, ``line``, ``field``, ``reason``, as
    ``prefixscope.ingest.files.quarantined_dicts`` gives them) or objects with those
    attributes (``prefixscope.ingest.bookkeeping.Quarantined``). ``total``: how many lines were
    quarantined, when ``problems`` holds only the first of them (the ingesters return up to
    100 per file); default ``len(problems)``."""
    from prefixscope.core.errors import problem_text

    for q in problems[:MAX_PROBLEMS_SHOWN]:
        get = q.get if isinstance(q, dict) else lambda k, q=q: getattr(q, k, None)
        line = get("line")
        err.print("quarantined " + problem_text(get("location"), None if line is None
                                                else int(line), get("reason"), get("field")),
                  markup=False, highlight=False)
    total = len(problems) if total is None else max(int(total), len(problems))
    if total > MAX_PROBLEMS_SHOWN:
        err.print(f"... and {total - min(len(problems), MAX_PROBLEMS_SHOWN):,} more quarantined "
                  "lines: the quarantine table has every one (the dashboard's Data sources page "
                  "lists them)", markup=False, highlight=False)
