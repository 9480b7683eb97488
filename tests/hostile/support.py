"""Running the real CLI on hostile inputs: in-process with a wall-clock alarm (most cases), or
in a subprocess with a timeout (inputs that could block the whole interpreter: FIFOs, devices).

Every run returns ``(exit code, stdout, stderr)``; :func:`run_cli` fails the test on a
traceback (an exception escaping :func:`prefixscope.cli.run`) or on overrunning its time.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from prefixscope.store import db as store_db

#: Seconds any one hostile case may take (the machine is shared and loaded).
CASE_TIMEOUT_S = 60.0

_TEMPLATE: dict[str, Path] = {}


def fresh_db(tmp_path: Path) -> str:
    """A migrated DuckDB file for one case (copied from a template migrated once per session)."""
    if "db" not in _TEMPLATE:
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="hostile-template-"))
        p = d / "template.duckdb"
        with store_db.writer(str(p)):
            pass
        _TEMPLATE["db"] = p
    target = tmp_path / "case.duckdb"
    shutil.copyfile(_TEMPLATE["db"], target)
    return str(target)


class _Overran(Exception):
    pass


def run_cli(args: list[str], *, timeout_s: float = CASE_TIMEOUT_S) -> tuple[int, str, str]:
    """Run ``prefixscope <args>`` in this process; return (code, stdout, stderr).

    Raises AssertionError when the command raises (a traceback) or runs past ``timeout_s``.
    """
    from prefixscope.cli import run

    def _alarm(signum, frame):
        raise _Overran()

    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run([str(a) for a in args])
    except _Overran:
        raise AssertionError(f"prefixscope {' '.join(map(str, args))[:300]} ran past "
                             f"{timeout_s:.0f} s") from None
    except BaseException as exc:  # a traceback: the bug this suite hunts
        import traceback

        raise AssertionError("traceback from prefixscope:\n" + "".join(
            traceback.format_exception(exc))[-4000:]) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    text_err = err.getvalue()
    assert "Traceback (most recent call last)" not in text_err, text_err[-4000:]
    return code, out.getvalue(), text_err


def run_cli_subprocess(args: list[str], *, timeout_s: float = CASE_TIMEOUT_S,
                       memory_bytes: int = 2 << 30) -> tuple[int, str, str]:
    """As :func:`run_cli`, in a child process (address space capped at ``memory_bytes``)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    try:
        p = subprocess.run([sys.executable, "-c", "from prefixscope.cli import main; main()", *map(str, args)],
                           capture_output=True, text=True, timeout=timeout_s,
                           preexec_fn=limit, env={**os.environ, "COLUMNS": "200"})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"prefixscope {' '.join(map(str, args))[:300]} ran past "
                             f"{timeout_s:.0f} s") from None
    assert "Traceback (most recent call last)" not in p.stderr, p.stderr[-4000:]
    assert "MemoryError" not in p.stderr, p.stderr[-4000:]
    return p.returncode, p.stdout, p.stderr


@dataclass(frozen=True)
class Case:
    """One hostile input: the lines of a file and what must come of it.

    Attributes:
        id: pytest id.
        lines: the file's lines as bytes (without newlines; joined with ``\\n``).
        bad: ``{line number: (field or None, reason)}`` that must be quarantined exactly so.
        good: good rows the file must still give (the ingester's unit: rows, samples...).
        head: bytes put before the first line (e.g. a BOM).
    """

    id: str
    lines: tuple[bytes, ...]
    bad: dict[int, tuple[str | None, str]] = field(default_factory=dict)
    good: int = 0
    head: bytes = b""

    def write(self, path: Path) -> Path:
        path.write_bytes(self.head + b"\n".join(self.lines) + b"\n")
        return path


def expected_line(location: str, line: int, fld: str | None, reason: str) -> str:
    """The one wording of a quarantined line (``prefixscope.core.errors.problem_text``)."""
    where = f"{location}:{line}"
    return f"{where}: {fld}: {reason}" if fld else f"{where}: {reason}"


def quarantine_rows(db: str) -> list[tuple]:
    """(line, field, reason) of every stored quarantine entry, line order."""
    with store_db.reader(db) as con:
        return con.execute("SELECT line, field, reason FROM quarantine ORDER BY line").fetchall()


def count(db: str, sql: str) -> int:
    with store_db.reader(db) as con:
        return con.execute(sql).fetchone()[0]


class MemoryStore:
    """One migrated in-memory DuckDB behind many in-process CLI runs (the hostile matrices).

    While :meth:`serving`, :func:`prefixscope.store.db.batch_writer` (the writer of every file
    ingester's CLI path, ``ingest/files.py``) yields this connection instead of opening the
    ``--db`` file: the command, its parsing, quarantine, printing and exit code are the real
    ones; only the opening, checkpoint and closing of a database file are left out (a few
    whole-CLI runs on real files per command keep those: ``test_jsonl_records.py``).
    :meth:`reset` empties what a case wrote.
    """

    def __init__(self) -> None:
        self.con = store_db.memory()

    @contextlib.contextmanager
    def serving(self):
        from unittest import mock

        @contextlib.contextmanager
        def batch_writer(path, **_kw):
            yield self.con

        with mock.patch.object(store_db, "batch_writer", batch_writer):
            yield self

    def count(self, sql: str) -> int:
        return self.con.execute(sql).fetchone()[0]

    def quarantine_rows(self) -> list[tuple]:
        """(line, field, reason) of every stored quarantine entry, line order."""
        return self.con.execute(
            "SELECT line, field, reason FROM quarantine ORDER BY line").fetchall()

    def reset(self) -> None:
        """Empty every table a case wrote (the schema stays migrated)."""
        for (name,) in self.con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND NOT "
                "internal AND table_name <> 'schema_migrations' AND estimated_size > 0"
                ).fetchall():
            self.con.execute(f'DELETE FROM "{name}"')

    def close(self) -> None:
        self.con.close()
