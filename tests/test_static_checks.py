"""The tools that read the code run in `make test` (issue 30 item 2): ruff with the rule set in
pyproject.toml, mypy over the package at its stated strictness, and import-linter's layer
contract. Each check also runs once on a planted error of its kind, so a check that silently
stopped looking (a config that excludes everything, a tree the tool cannot follow) fails here.

How each runs from the repository root is in docs/architecture.md ("Checked by tools").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
#: The design's top-level package folders, seen by the tools through prefixscope/<folder> links.
FOLDERS = ("store", "ingest", "replay", "alerts", "dashboard", "gateway")


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_the_package_folders_are_linked_under_prefixscope_for_tools():
    """mypy, import-linter and an editor's go-to-definition follow ``prefixscope.store`` to
    ``prefixscope/store``: a relative link to the top-level folder that holds it."""
    for folder in FOLDERS:
        link = ROOT / "prefixscope" / folder
        assert link.is_symlink() and os.readlink(link) == f"../{folder}", folder
        assert (link / "__init__.py").is_file()


def test_ruff_passes():
    res = _run([str(BIN / "ruff"), "check", "."], cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_fails_on_a_planted_error(tmp_path):
    bad = tmp_path / "planted.py"
    bad.write_text("import os\n\n\ndef f(x=[]):\n    return x\n")
    res = _run([str(BIN / "ruff"), "check", "--config", str(ROOT / "pyproject.toml"),
                "--no-cache", str(bad)], cwd=tmp_path)
    assert res.returncode == 1
    assert "F401" in res.stdout and "B006" in res.stdout


def test_mypy_passes():
    res = _run([str(BIN / "mypy"), "-p", "prefixscope"], cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"Success: no issues found in \d{3} source files", res.stdout), res.stdout


def test_mypy_fails_on_a_planted_error(tmp_path):
    bad = tmp_path / "planted.py"
    bad.write_text("from prefixscope.core.formatting import fmt_pct\n\n"
                   "x: int = fmt_pct(0.5)\n")
    res = _run([str(BIN / "mypy"), "--config-file", str(ROOT / "pyproject.toml"),
                "--cache-dir", str(tmp_path / "cache"), str(bad)], cwd=ROOT)
    assert res.returncode == 1, res.stdout
    assert 'Incompatible types in assignment (expression has type "str", variable has type ' \
           '"int")' in res.stdout


def test_mypy_ratchet_lists_only_modules_that_still_have_errors(tmp_path):
    """The modules excused from mypy (``ignore_errors``) are those that had errors when the
    check came in: an excused module without an error left must come off the list."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    excused = {m for o in config["tool"]["mypy"]["overrides"] if o.get("ignore_errors")
               for m in o["module"]}
    bare = tmp_path / "mypy.ini"
    bare.write_text("[mypy]\npython_version = 3.11\nignore_missing_imports = True\n")
    res = _run([str(BIN / "mypy"), "--config-file", str(bare), "--cache-dir",
                str(tmp_path / "cache"), "-p", "prefixscope"], cwd=ROOT)
    failing = {re.sub(r"\.__init__$", "", p[:-3].replace("/", "."))
               for p in re.findall(r"^(prefixscope/\S+?\.py):\d+: error", res.stdout, re.M)}
    assert failing, res.stdout[-2000:]
    assert excused - failing == set(), "no mypy error left: take these off the list"
    assert failing - excused == set()


def test_import_linter_keeps_the_layers():
    res = _run([str(BIN / "lint-imports")], cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 kept, 0 broken" in res.stdout
    assert re.search(r"Analyzed (\d{3}) files", res.stdout)


def test_import_linter_fails_on_a_planted_back_arrow(tmp_path):
    """A copy of the tree where the store imports the CLI (an arrow back up): broken."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for folder in ("prefixscope", *FOLDERS):
        shutil.copytree(ROOT / folder, tmp_path / folder, symlinks=True, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / "store" / "sqlhelpers.py"
    target.write_text(target.read_text(encoding="utf-8") + "\nimport prefixscope.cli  # planted\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = _run([str(BIN / "lint-imports"), "--no-cache"], cwd=tmp_path, env=env)
    assert res.returncode == 1, res.stdout
    assert "BROKEN" in res.stdout and "prefixscope.store.sqlhelpers -> prefixscope.cli" in res.stdout
