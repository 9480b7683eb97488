"""Rotated JSONL logs written with fsync batching (the usage log and the decision log).

:class:`JsonlLog` appends one JSON object per line. Lines are queued in memory and a writer
thread writes, flushes and fsyncs them every ``fsync_interval_s`` (one fsync per batch, not per
line); :meth:`JsonlLog.close` writes and fsyncs whatever is queued, so a graceful shutdown loses
nothing. When the active file (``usage.jsonl``) would pass ``rotate_bytes`` it is renamed to
``usage.1.jsonl`` (older ones shift to ``.2``, ...; ``keep`` are kept) and a new active file is
started. A line is never split across files. The tailers read the active file and ``*.1.jsonl``
(``docker-compose.yml``): ingest checkpoints detect the replaced file and read it from the
start, and the primary keys drop what was already stored, so a rotation between two tailer
rounds loses nothing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import msgspec

_encode = msgspec.json.Encoder().encode


class JsonlLog:
    """One rotated JSONL file (module docstring).

    Args:
        path: the active file, e.g. ``logs/gateway/usage.jsonl`` (its folder is created).
        rotate_bytes: rotate before a write would make the active file larger than this.
        keep: rotated files kept (``NAME.1.jsonl`` .. ``NAME.<keep>.jsonl``).
        fsync_interval_s: the writer thread's batch period (seconds).
    """

    def __init__(self, path: str | os.PathLike[str], *, rotate_bytes: int = 64 << 20,
                 keep: int = 10, fsync_interval_s: float = 0.2) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rotate_bytes = rotate_bytes
        self.keep = keep
        self.interval = fsync_interval_s
        self._queue: list[bytes] = []
        self._cv = threading.Condition()
        self._closed = False
        self._fh = open(self.path, "ab")  # noqa: SIM115 (closed in close())
        self._size = self._fh.tell()
        self.rotated_path(1).touch(exist_ok=True)  # a tailer can always name NAME.1.jsonl
        self.lines_written = 0
        self.lines_queued = 0
        self.rotations = 0
        self._thread = threading.Thread(target=self._run, name=f"jsonl-{self.path.name}",
                                        daemon=True)
        self._thread.start()

    def rotated_path(self, n: int) -> Path:
        """``NAME.<n>.jsonl`` beside the active file."""
        return self.path.with_name(f"{self.path.stem}.{n}{self.path.suffix}")

    def write(self, record: dict[str, Any]) -> None:
        """Queue one record (thread-safe, no I/O on the caller's thread)."""
        line = _encode(record) + b"\n"  # compact, UTF-8 (not ASCII-escaped)
        with self._cv:
            if self._closed:
                raise RuntimeError(f"{self.path}: log closed")
            self._queue.append(line)
            self.lines_queued += 1

    def _rotate(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        first = self.rotated_path(1)
        if first.exists() and first.stat().st_size == 0:
            first.unlink()  # the placeholder made at start: nothing to keep
        for n in range(self.keep, 0, -1):
            src = self.path if n == 1 else self.rotated_path(n - 1)
            if src.exists():
                os.replace(src, self.rotated_path(n))
        self._fh = open(self.path, "ab")  # noqa: SIM115
        self._size = 0
        self.rotations += 1

    def _drain(self) -> None:
        with self._cv:
            batch, self._queue = self._queue, []
        if not batch:
            return
        data = b"".join(batch)
        if self._size + len(data) <= self.rotate_bytes:  # the common case: one write
            self._fh.write(data)
            self._size += len(data)
        else:
            for line in batch:
                if self._size and self._size + len(line) > self.rotate_bytes:
                    self._rotate()
                self._fh.write(line)
                self._size += len(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.lines_written += len(batch)

    def _run(self) -> None:
        while True:
            with self._cv:
                if self._closed:
                    break
                self._cv.wait(self.interval)
            self._drain()
        self._drain()

    def flush(self) -> None:
        """Write and fsync everything queued now (on the caller's thread)."""
        with self._cv:
            target = self.lines_queued
            self._cv.notify()
        while self.lines_written < target and self._thread.is_alive():
            threading.Event().wait(0.005)

    def close(self) -> None:
        """Stop the writer thread after it wrote and fsynced every queued line."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify()
        self._thread.join()
        self._fh.close()
