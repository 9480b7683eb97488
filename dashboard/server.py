"""Starting the dashboard server: ``prefixscope dashboard`` runs ``streamlit run dashboard/app.py``.

The server is started through this module (``python -m dashboard.server run ...``) rather than
``python -m streamlit run ...`` for one reason: Streamlit treats a ``pages/`` folder beside the
main script as a legacy (v1) multipage app until the first ``st.navigation`` call of the
process, so a first request straight to ``/requests`` would run that page without the router
(no sidebar filters, a wrong page list) and keep the whole server in that mode.
:func:`launch` turns the legacy mode off before the server starts (Streamlit 1.40 to 1.67:
``PagesManager.uses_pages_directory``; the router's own ``st.navigation`` call does the same
on every run).

The database path reaches the app twice, as ``$PREFIXSCOPE_DB`` and as ``-- --db PATH`` after
the script (``dashboard.data.db_path`` reads either), made absolute so the server's working
directory does not matter. The server is headless (no browser opened, no e-mail prompt), sends no
usage statistics and watches no files.
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
        sys.executable, "-m", "dashboard.server", "run", str(APP_PATH),
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


def streamlit_env(db: str) -> dict[str, str]:
    """The environment for the server: the current one plus ``PREFIXSCOPE_DB`` (absolute)."""
    env = dict(os.environ)
    env["PREFIXSCOPE_DB"] = os.path.abspath(db)
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
    os.execvpe(argv[0], argv, streamlit_env(db))


def launch(argv: list[str]) -> None:
    """Run Streamlit's command line (``argv`` = ``['run', APP, ...]``) with the legacy
    ``pages/``-folder mode off (see the module docstring)."""
    try:
        from streamlit.runtime.pages_manager import PagesManager

        PagesManager.uses_pages_directory = False
    except ImportError:  # a Streamlit without the legacy mode: nothing to turn off
        pass
    from streamlit.web import cli

    sys.argv = ["streamlit", *argv]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    launch(sys.argv[1:])
