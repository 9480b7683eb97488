"""Under ``CI=true`` nothing in the suite can pass silently (issue 11, item 10): a skipped test,
a module skipped at collection, and a deselected test each fail the run. Runs a real pytest in
a subprocess on a small suite that uses this repository's ``tests/conftest.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def _suite(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "tests"
    d.mkdir()
    (d / "__init__.py").write_text("")
    shutil.copyfile(CONFTEST, d / "conftest.py")
    (d / "test_mod.py").write_text(body)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  vllm: x\n  may_skip: x\n")
    return tmp_path


def _pytest(root: Path, *args: str, ci: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "CI": "true" if ci else "false"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)


SKIP_IN_TEST = "import pytest\ndef test_x():\n    pytest.skip('engine absent')\n"
SKIP_MODULE = ("import pytest\npytest.skip('engine absent', allow_module_level=True)\n"
               "def test_x():\n    pass\n")
MARKED = "import pytest\n@pytest.mark.vllm\ndef test_x():\n    pass\ndef test_y():\n    pass\n"


@pytest.mark.parametrize("body, args, says", [
    (SKIP_IN_TEST, (), "skipped under CI=true, which must run every test: Skipped: engine absent"),
    (SKIP_MODULE, (), "module skipped under CI=true, which must run every test"),
    (MARKED, ("-m", "not vllm"), "1 tests deselected under CI=true"),
])
def test_ci_fails_what_would_vanish(tmp_path, body, args, says):
    root = _suite(tmp_path, body)
    ci = _pytest(root, *args)
    assert ci.returncode != 0 and says in ci.stdout + ci.stderr
    local = _pytest(root, *args, ci=False)  # outside CI a skip stays a skip
    # (pytest's exit code 5 when the only module was skipped at collection: no test ran)
    assert local.returncode in (0, 5) and "failed" not in local.stdout, local.stdout
