"""``prefixscope --version`` answers before the command modules are imported (issue 30 item 6;
the timing is benchmarks/cli_start.py's, not a test's): no duckdb, pandas, pydantic or typer
is loaded, and the package's names ``main``, ``run`` and ``app`` stay what they were."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
sys.argv = ["prefixscope", "--version"]
from prefixscope.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("duckdb", "pandas", "pydantic", "typer", "prefixscope.cli.root")
               if m in sys.modules)
print(code, heavy, file=sys.stderr)
"""


def test_version_is_answered_without_importing_the_commands():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.stdout == "prefixscope 0.1.0\n"
    assert res.stderr.strip() == "0 []"


def test_main_run_and_app_keep_their_meaning_after_the_commands_load():
    import prefixscope.cli as cli

    app, run = cli.app, cli.run
    assert callable(run) and app.info.name == "prefixscope"
    assert cli.main.__module__ == "prefixscope.cli" and callable(cli.main)


def test_the_console_script_prints_the_version(tmp_path):
    exe = __import__("pathlib").Path(sys.executable).parent / "prefixscope"
    res = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120,
                         check=False, cwd=tmp_path)
    assert (res.returncode, res.stdout) == (0, "prefixscope 0.1.0\n")
