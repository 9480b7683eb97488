"""SIGKILL of ``ingest requests`` while its forked parser processes run: the parsers die with
it (``PR_SET_PDEATHSIG``), nothing committed is lost or doubled, and a rerun completes.

The ingest runs in a child process on a 24 MB usage log with the parallel thresholds lowered
(so that a small file is parsed by 2 forked processes in 256 KiB regions); the test kills only
the main process, by its pid, once its parser processes exist, then checks every child it had
is gone within 10 s. Repeated 4 times (the bug left orphans in 3 of 6 kills)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefixscope.store import db as store_db

N_LINES = 60_000

_DRIVER = r"""
import sys
import prefixscope.ingest.usage as usage
import prefixscope.ingest.usage_read as usage_read
usage.PARALLEL_MIN_BYTES = 1
usage_read.REGION_BYTES = 256 << 10
usage.INSERT_ROWS = 2_000
from prefixscope.cli import main
sys.argv = ["prefixscope", "ingest", "requests", sys.argv[1], "--db", sys.argv[2]]
main()
"""


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("kill") / "usage.jsonl"
    pad = "p" * 300
    with open(f, "w") as fh:
        for i in range(N_LINES):
            fh.write(json.dumps({"request_id": f"k-{i}", "created": 1764590000 + i, "model": "m",
                                 "note": pad, "usage": {"prompt_tokens": 100 + i % 7,
                                                        "completion_tokens": 3}}) + "\n")
    return f


@pytest.mark.parametrize("attempt", range(4))
def test_sigkill_of_the_ingest_kills_its_parser_processes(attempt, big_log, tmp_path):
    db = str(tmp_path / "k.duckdb")
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(big_log), db],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        kids: list[int] = []
        while time.monotonic() < deadline and len(kids) < 2 and proc.poll() is None:
            kids = _children(proc.pid)
            time.sleep(0.02)
        assert len(kids) >= 2, f"no parser processes seen (exit {proc.poll()})"
        time.sleep(0.05 * attempt)  # kill at different points of the parse
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        gone_by = time.monotonic() + 10
        while time.monotonic() < gone_by and any(_alive(k) for k in kids):
            time.sleep(0.05)
        orphans = [k for k in kids if _alive(k)]
        for k in orphans:  # the test started them: end them by pid before failing
            os.kill(k, signal.SIGKILL)
        assert orphans == [], f"parser processes {orphans} outlived the killed ingest"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    # crash safety: whatever was committed is whole, and a rerun completes without doubles
    again = subprocess.run([sys.executable, "-c", _DRIVER, str(big_log), db],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    with store_db.reader(db) as con:
        n, distinct = con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests"
                                  ).fetchone()
    assert n == distinct == N_LINES
