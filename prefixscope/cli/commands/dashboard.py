"""``prefixscope dashboard``: serve the Streamlit dashboard on a database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, err, out
from prefixscope.core.errors import UsageError


def dashboard_cmd(
    db: DbOption = DB_DEFAULT,
    port: Annotated[int, typer.Option("--port", help="TCP port to serve on.")] = 8501,
    host: Annotated[str, typer.Option("--host", help="Address to bind (default: this machine only).")] = "127.0.0.1",
    print_command: Annotated[bool, typer.Option("--print-command", help="Print the streamlit command line instead of running it.")] = False,
) -> None:
    """Serve the dashboard (Streamlit, headless) on the database, until stopped with Ctrl-C.

    Pages: Overview, Requests, Savings, Data sources (see docs/dashboard.md). The dashboard only
    reads; ingest into the same database while it runs.

    Example: prefixscope dashboard --db data/prefixscope.duckdb --port 8501
    """
    from prefixscope.dashboard.server import serve, streamlit_argv

    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: use a TCP port between 1 and 65535")
    if print_command:
        out.print(" ".join(streamlit_argv(db, port=port, host=host)), markup=False, highlight=False)
        return
    busy = _port_in_use(host, port)
    if busy:
        raise UsageError(f"--port {port}: {busy} on {host} (another dashboard?); pick another "
                         "port with --port")
    if not Path(db).exists():
        err.print(f"note: no database at {db} yet; the dashboard will say how to create one "
                  "(make demo, or prefixscope ingest ...)", markup=False, highlight=False)
    out.print(f"prefixscope dashboard on http://{host}:{port} reading {db} (Ctrl-C to stop)",
              markup=False, highlight=False)
    serve(db, port=port, host=host)


def _port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be served (``the port is in use``), or None when a listening
    socket can be bound there (with ``SO_REUSEADDR``, as Tornado binds it); None too when the
    host does not resolve (Streamlit then says why)."""
    import errno
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            return "the port is in use" if exc.errno == errno.EADDRINUSE else None
    return None


def register(groups: dict[str, typer.Typer]) -> None:
    """Add the ``dashboard`` command."""
    groups["app"].command("dashboard")(dashboard_cmd)
