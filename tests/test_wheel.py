"""The wheel runs outside the repository: built with ``pip wheel --no-deps`` from a copy of the
sources, installed in a fresh venv (no system site-packages, not the repository on the path),
then ``prefixscope demo`` and a chat replay of the bundled aider trace, read from the installed
package data, run from an empty temporary working directory.

Dependencies: installing them from the wheel's metadata took 2 min 1 s on the shared 2-CPU
machine (load 12), so the fresh venv gets the wheel with ``--no-deps`` and sees the dev venv's
third-party packages through a ``.pth`` line (a plain path: the dev venv's own ``.pth`` files,
among them the editable install of this checkout, are not processed). The test asserts that
``prefixscope`` itself is imported from the fresh venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: What the wheel is built from (pyproject.toml's package-dir folders, README for metadata).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "prefixscope", "store", "ingest",
           "replay", "alerts", "dashboard", "gateway", "data")
# *.so: the editable install's in-place build of the replay extension; the wheel compiles its own.
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.duckdb", "*.duckdb.wal", "demo", "*.so")


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, f"{cmd}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """A fresh venv holding the wheel: ``python``, ``prefixscope`` (console script), ``cwd``."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=_IGNORE)
        elif p.is_file():
            shutil.copy2(p, src / name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PREFIXSCOPE_DB", "PREFIXSCOPE_CONFIG", "PREFIXSCOPE_DATA_DIR",
                        "VIRTUAL_ENV")}
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, src], cwd=tmp,
         env=env, timeout=600)
    wheels = list(dist.glob("prefixscope-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp, env=env, timeout=300)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", "--no-deps", wheels[0]], cwd=tmp, env=env,
         timeout=600)
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=tmp, env=env, timeout=60).stdout.strip())
    (purelib / "zz_dev_venv_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n",
                                                   encoding="utf-8")
    cwd = tmp / "cwd"
    cwd.mkdir()
    return {"python": python, "prefixscope": venv / "bin" / "prefixscope", "cwd": cwd,
            "purelib": purelib, "env": env}


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    out = _run([installed["python"], "-c",
                "import prefixscope, prefixscope.store, prefixscope.data;"
                "from prefixscope.core.paths import data_dir, source_root;"
                "print(prefixscope.__file__); print(prefixscope.store.__file__);"
                "print(data_dir()); print(source_root())"],
               cwd=installed["cwd"], env=installed["env"], timeout=120).stdout.split("\n")
    purelib = str(installed["purelib"])
    assert out[0].startswith(purelib) and out[1].startswith(purelib), out
    assert out[2] == str(installed["purelib"] / "prefixscope" / "data")
    assert out[3] == "None"  # no source checkout around the installed package
    assert str(ROOT) not in "\n".join(out)


def test_the_wheel_carries_the_compiled_replay_loops(installed):
    # setup.py's optional extension is built into the wheel (make test installs gcc and
    # libssl-dev first) and loads from the installed package, not from the checkout.
    out = _run([installed["python"], "-c",
                "from prefixscope.replay.native import native_status, NATIVE;"
                "print(native_status()); print(NATIVE.__file__ if NATIVE else '')"],
               cwd=installed["cwd"], env=installed["env"], timeout=120).stdout.split("\n")
    assert out[0] == "native", out
    assert out[1].startswith(str(installed["purelib"])) and str(ROOT) not in out[1], out


def test_demo_runs_from_the_wheel(installed):
    db = installed["cwd"] / "demo.duckdb"
    res = _run([installed["prefixscope"], "demo", "--db", db], cwd=installed["cwd"],
               env=installed["env"], timeout=900)
    assert f"demo database ready: {db}" in res.stdout
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] > 0
        assert con.execute("SELECT count(*) FROM metric_samples").fetchone()[0] > 0
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] >= 5
    finally:
        con.close()


def test_chat_replay_of_the_bundled_trace_from_the_wheel(installed):
    trace = installed["purelib"] / "prefixscope" / "data" / "captures" / "aider" / "chat-requests.jsonl"
    assert trace.is_file()
    res = _run([installed["prefixscope"], "replay", "sim", trace, "--format", "chat", "--json"],
               cwd=installed["cwd"], env=installed["env"], timeout=600)
    doc = json.loads(res.stdout)
    assert doc["requests"] == 124 and doc["rejected_requests"] == 0
    assert doc["hit_rate"] == pytest.approx(102432 / 117892)  # the bundled tiny tokenizer's counts
    run_dir = installed["cwd"] / doc["out_dir"]
    assert (run_dir / "requests.jsonl").is_file() and (run_dir / "run.json").is_file()
