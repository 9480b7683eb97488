"""The ``prefixscope`` command: a thin layer over the library.

Each command parses arguments, calls one library function, prints, and lets
:class:`~prefixscope.core.errors.PrefixscopeError` become a one-line message and an exit code
(see :func:`run`). Commands are module-level functions in ``prefixscope/cli/commands/``, one
module per subject (importable and callable without the CLI runner); each module's
``register(groups)`` adds its functions to the Typer groups. Options used by several commands
are declared once in :mod:`prefixscope.cli.options`.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

import typer

from prefixscope import __version__
from prefixscope.cli.common import err
from prefixscope.core.errors import PrefixscopeError

app = typer.Typer(
    name="prefixscope",
    help=(
        "Observability, hit-rate analytics and replay for LLM prompt prefix caching (vLLM).\n\n"
        "Examples:\n\n"
        "  prefixscope ingest metrics http://localhost:8000/metrics --every 15\n\n"
        "  prefixscope ingest requests logs/usage.jsonl\n\n"
        "  prefixscope hitrate --by model --window 1h --json\n\n"
        "  prefixscope report\n\n"
        "  prefixscope dashboard"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
ingest_app = typer.Typer(help="Load sources into the DuckDB store (safe to run twice).",
                         no_args_is_help=True)
replay_app = typer.Typer(help="Replay captured traffic through the exact cache model or a live vLLM.",
                         no_args_is_help=True)
report_app = typer.Typer(help="Hit-rate reports (the report line; the daily report).")
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(ingest_app, name="ingest")
app.add_typer(replay_app, name="replay")
app.add_typer(report_app, name="report")
app.add_typer(db_app, name="db")

GROUPS = {"app": app, "ingest": ingest_app, "replay": replay_app, "report": report_app, "db": db_app}


@app.callback(invoke_without_command=True)
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
    if version:
        typer.echo(f"prefixscope {__version__}")
        raise typer.Exit(0)


def _register_all() -> None:
    import importlib
    import pkgutil

    import prefixscope.cli.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"prefixscope.cli.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(GROUPS)


_register_all()


def _db_default_map() -> dict | None:
    """Click's ``default_map`` giving every command's ``--db`` the ``[store] db`` of the
    settings file (``$PREFIXSCOPE_CONFIG`` or ``./prefixscope.toml``).

    Click's order is the documented one: ``--db`` on the command line, then
    ``$PREFIXSCOPE_DB``, then this default map, then ``data/prefixscope.duckdb``. A settings
    file that cannot be read (missing, not TOML, a bad value) raises
    :class:`~prefixscope.core.errors.ConfigError` naming the file and the key, for every
    command alike (:func:`run` prints it and exits 2), instead of silently falling back to the
    default database.
    """

    from prefixscope.core.config import DEFAULT_DB_PATH, load_settings

    db = load_settings().store.db
    if db == DEFAULT_DB_PATH:
        return None

    def walk(cmd) -> dict:
        node: dict = {}
        if any(p.name == "db" for p in cmd.params):
            node["db"] = db
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
            for name, sub in cmd.commands.items():
                child = walk(sub)
                if child:
                    node[name] = child
        return node

    return walk(click_command()) or None


def _settings_default_map(args: Sequence[str]) -> dict | None:
    """:func:`_db_default_map`, except for help (``--help``, ``-h``, no arguments) and for a
    command given its own ``--config FILE`` (it loads that file with the same
    :func:`prefixscope.core.config.load_settings`): those run whatever the settings file holds.
    Raises ConfigError for a settings file that cannot be used."""
    from prefixscope.core.errors import ConfigError

    lenient = (not args or "--help" in args or "-h" in args
               or any(a == "--config" or a.startswith("--config=") for a in args))
    try:
        return _db_default_map()
    except ConfigError:
        if lenient:
            return None
        raise


_COMMAND: list = []


def click_command():
    """The click command tree of :data:`app`, built once per process: typer builds it anew at
    every ``app(...)`` call (0.3 to 0.5 s for the ~150 commands), which every in-process run
    (tests, the demo) paid twice."""
    if not _COMMAND:
        import typer.main

        _COMMAND.append(typer.main.get_command(app))
    return _COMMAND[0]


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    Expected errors print ``error: <message>`` on stderr and return their class's exit code;
    usage errors (unknown option, bad value) print Click's usage message and return 2. Never
    raises for those.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    interrupted = _SigintWatch()
    try:
        import typer.main

        if sys.excepthook != typer.main.except_hook:  # what app(...) does before it runs
            sys.excepthook = typer.main.except_hook
        click_command()(args=args, prog_name="prefixscope", standalone_mode=True,
                        default_map=_settings_default_map(args))
    except KeyboardInterrupt:
        return _interrupted()
    except SystemExit as exc:
        if interrupted():
            return _interrupted()
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        err.print(str(code), markup=False, highlight=False)
        return 1
    except PrefixscopeError as exc:
        if interrupted():
            return _interrupted()
        err.print(f"error: {exc}", markup=False, highlight=False)
        return exc.exit_code
    except Exception:
        # Ctrl-C inside a DuckDB query surfaces as duckdb.InterruptException or, from an Arrow
        # scan, a RuntimeError("Query interrupted"): the interruption, not a bug.
        if interrupted():
            return _interrupted()
        raise
    finally:
        interrupted.restore()
    return 0


class _SigintWatch:
    """Remembers whether SIGINT arrived while a command ran; the handler in place before
    (Python's default raises KeyboardInterrupt) still runs. Restored by :meth:`restore`."""

    def __init__(self) -> None:
        self.seen = False
        self.previous = None
        try:
            self.previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: nothing to watch
            self.previous = None

    def _handle(self, signum, frame) -> None:
        self.seen = True
        if callable(self.previous):
            self.previous(signum, frame)
        else:
            raise KeyboardInterrupt

    def __call__(self) -> bool:
        return self.seen

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


def _interrupted() -> int:
    err.print("interrupted (Ctrl-C): what was committed before is kept (a write in progress, "
              "if there was one, is rolled back); an ingest run again continues from its "
              "checkpoint", markup=False, highlight=False)
    return 130


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())


if __name__ == "__main__":  # python -m prefixscope.cli.root ... (benchmarks/lock_contention.py)
    main()
