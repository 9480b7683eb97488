"""Issue 27 #6: every file error of every file ingester is one ``error:`` sentence with an exit
code of ``prefixscope/core/errors.py``, never a traceback: a path too long, a file name that is
not UTF-8, a folder above the file that is a file or cannot be searched, a full disk.

The ingesters are :data:`tests.hostile.targets.FILE_INGESTERS` and the paths
:func:`tests.hostile.payloads.path_attacks`: a new ingester or path attack is one line there.
Path cases run the CLI in this process; permission denied runs it as the user ``nobody``
(``setpriv``, when this suite runs as root; else the folder is made unsearchable), a full disk
in a private mount namespace on a 16 KiB tmpfs (``unshare -rm``: no root needed, nothing left
mounted)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.payloads import path_attacks
from tests.hostile.support import count, fresh_db, run_cli
from tests.hostile.targets import FILE_INGESTERS

#: The environment of a CLI subprocess: no PREFIXSCOPE_* settings of the machine.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXSCOPE_")}
PROG = str(Path(sys.executable).with_name("prefixscope"))

_KINDS = ("path-5000-chars", "path-5000-bytes-of-folders", "name-not-utf8", "parent-is-a-file")


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("command", sorted(FILE_INGESTERS))
def test_a_path_that_cannot_be_looked_up_is_a_sentence(command, kind, tmp_path):
    ing = FILE_INGESTERS[command]
    good = ing.write(tmp_path / "in")
    (path, reason), = [(p, r) for k, p, r in path_attacks(good, tmp_path) if k == kind]
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", command, path, "--db", db])  # fails on a traceback
    assert code == ing.unreadable_exit, err
    assert reason in err, err
    assert err.startswith("error: ")
    if kind == "name-not-utf8":  # the name is shown with its bytes escaped, never raw
        assert "n\\xff\\xfe" in err and "\udcff" not in err
    # the same path beside a good file: the good one is read, the bad one named
    if ing.unreadable_exit == 4 and command not in ("metrics",):
        code, _, err = run_cli(["ingest", command, path, str(good), "--db", db])
        assert code == 0 and reason in err, err


def _as_nobody(args: list[str]) -> list[str]:
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *args]


@pytest.fixture
def open_base():
    """A folder every user can search (pytest's own base is 0700 root): only ``locked`` in it
    is denied, so the denial the test sees is the one it made."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="prefixscope-perm-"))
    base.chmod(0o777)
    yield base
    for d in base.rglob("*"):
        if d.is_dir():
            d.chmod(0o755)
    shutil.rmtree(base)


@pytest.mark.parametrize("command", sorted(FILE_INGESTERS))
def test_a_folder_without_search_permission_is_a_sentence(command, open_base):
    ing = FILE_INGESTERS[command]
    locked = open_base / "locked"
    good = ing.write(locked / "inner")
    dbdir = open_base / "db"
    dbdir.mkdir(mode=0o777)
    dbdir.chmod(0o777)
    argv = [PROG, "ingest", command, str(good), "--db", str(dbdir / "t.duckdb")]
    if os.geteuid() == 0:  # root reads everything: run the CLI as nobody, the folder 0700 root
        assert shutil.which("setpriv"), "setpriv (util-linux) is needed to drop root"
        locked.chmod(0o700)
        argv = _as_nobody(argv)
    else:
        locked.chmod(0o000)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=open_base,
                       env={**ENV, "COLUMNS": "300"})
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == ing.unreadable_exit, p.stderr
    assert ("permission denied (the file, or a folder above it, cannot be read or searched by "
            "this user)") in p.stderr, p.stderr


@pytest.mark.parametrize("command", sorted(FILE_INGESTERS))
def test_a_full_disk_is_a_sentence_with_exit_8(command, tmp_path):
    ing = FILE_INGESTERS[command]
    good = ing.write(tmp_path / "in")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    assert shutil.which("unshare"), "unshare (util-linux) is needed for a private tmpfs"
    script = (f"mount -t tmpfs -o size=16k tmpfs {mnt} && "
              f"exec {PROG} ingest {command} {good} --db {mnt / 't.duckdb'}")
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                       timeout=120, env={**ENV, "COLUMNS": "300"})
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 8, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        f"error: cannot write the database {mnt / 't.duckdb'}: no space left on its device (or "
        "quota); what was committed before is kept and the transaction in progress was rolled "
        "back: free space and run the same command again (an ingest continues from its "
        "checkpoint)")


def test_a_full_disk_keeps_what_was_committed_and_the_next_run_continues(tmp_path):
    """Batches committed before the disk filled stay; the same ingest on a disk with room
    continues from the checkpoint and stores every line once."""
    import json

    lines = [json.dumps({"request_id": f"r-{i:07d}-" + "x" * 60, "created": 1764590000 + i,
                         "model": f"m-{i % 40}", "usage": {"prompt_tokens": 100 + i,
                                                            "completion_tokens": 5}})
             for i in range(120_000)]
    big = tmp_path / "big.jsonl"
    big.write_text("\n".join(lines) + "\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    saved = tmp_path / "saved"
    saved.mkdir()
    script = (f"mount -t tmpfs -o size=6m tmpfs {mnt} && "
              f"{PROG} ingest requests {big} --db {mnt / 't.duckdb'}; echo rc=$?; "
              f"cp {mnt}/t.duckdb* {saved}/")
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                       timeout=300, env={**ENV, "COLUMNS": "300"})
    assert "Traceback" not in p.stderr and "rc=8" in p.stdout, (p.stdout, p.stderr[-2000:])
    db = str(saved / "t.duckdb")
    kept = count(db, "SELECT count(*) FROM requests")
    assert kept == count(db, "SELECT coalesce(max(checkpoint_line), 0) FROM ingest_sources")
    code, out, err = run_cli(["ingest", "requests", str(big), "--db", db])
    assert code == 0, err
    assert count(db, "SELECT count(*) FROM requests") == 120_000
    assert f"{120_000 - kept:,} requests added" in out, (kept, out)
