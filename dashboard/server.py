"""Starting the dashboard server: ``prefixscope dashboard`` runs ``streamlit run`` on the installed
``prefixscope/dashboard/app.py``.

The pages live in ``dashboard/views/`` (not ``pages/``), so Streamlit's legacy folder-based
multipage mode never engages and the router's ``st.navigation`` is the only page list from the
first request on.

The database path reaches the app twice, as ``$PREFIXSCOPE_DB`` and as ``-- --db PATH`` after
the script (``prefixscope.dashboard.data.db_path`` reads either), made absolute so the server's
working directory does not matter. The server is headless (no browser opened, no e-mail prompt),
sends no usage statistics and watches no files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_PATH = Path(__file__).resolve().parent / "app.py"


def streamlit_argv(db: str, *, port: int = 8501, host: str = "127.0.0.1") -> list[str]:
    """The command line that serves the dashboard for ``db`` on ``host:port``.

    Args:
        db: DuckDB file (made absolute).
        port: TCP port (1-65535).
        host: address to bind; the default serves this machine only.

    Returns:
        argv for :func:`os.execvpe` / :mod:`subprocess`, starting with this Python.
    """
    return [
        sys.executable, "-m", "streamlit", "run", str(APP_PATH),
        "--server.port", str(int(port)),
        "--server.address", host,
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--theme.base", "light",
        "--client.toolbarMode", "viewer",
        "--", "--db", os.path.abspath(db),
    ]


def streamlit_env(db: str, *, port: int | None = None, host: str = "127.0.0.1") -> dict[str, str]:
    """The environment for the server: the current one plus ``PREFIXSCOPE_DB`` (absolute) and,
    with ``port``, ``PREFIXSCOPE_SERVED_URL`` (the address it serves at; the email preview's
    link when no dashboard URL is configured, ``prefixscope.core.config.dashboard_url``)."""
    from prefixscope.core.config import SERVED_URL_ENV, served_url

    env = dict(os.environ)
    env["PREFIXSCOPE_DB"] = os.path.abspath(db)
    if port is not None:
        env[SERVED_URL_ENV] = served_url(host, port)
    env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    return env


def serve(db: str, *, port: int = 8501, host: str = "127.0.0.1") -> None:
    """Replace this process with the Streamlit server (returns only if exec fails).

    Replacing the process (rather than running a child) means Ctrl-C and a kill of this PID stop
    the server itself and leave no orphan.

    Raises:
        OSError: the Python interpreter could not be executed.
    """
    argv = streamlit_argv(db, port=port, host=host)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, streamlit_env(db, port=port, host=host))
