"""Benchmark: retention and the Parquet archive (issue 17 item 4, ``docs/retention.md``).

Builds a generated deployment (``tests/scale_support.build_deployment``: 30 days, 10
instances, 4 models; ``--requests`` requests, 15 s scrapes when ``--scrape-s 15``), copies it,
and in one run:

1. archives the first 15 days (requests, metric samples, gateway decisions) of two copies in
   the same run: the baseline (a write lock, COPY, full read-back and DELETE per table and
   day: :func:`archive.archive_day`, the path before this change) and the path of
   ``prefixscope archive`` (one COPY per table and chunk of days of at most
   ``archive.CHUNK_ROWS`` rows, footer row counts, one DELETE: :func:`archive.archive_range`,
   the connection kept open between chunks as nobody waits), reporting rows per second, the
   ratio, the longest write-lock hold of each, and the archive's bytes per row;
2. times each query below with the range "all" (best of ``--repeat``, read-only connection) on
   the original (everything in DuckDB) and on the archived copy (half of it in Parquet),
   printing the ratio archived / original. Rollup-backed queries should stay near 1x (they do
   not read the archive beyond the part minute/bucket at the range's start); per-request
   distributions read the Parquet of the archived days.

    .venv/bin/python benchmarks/archive_scale.py [--requests 1000000] [--scrape-s 60]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefixscope.core.times import parse_time  # noqa: E402
from prefixscope.store import db as store_db  # noqa: E402
from prefixscope.store.queries import archive as arc  # noqa: E402
from prefixscope.store.queries import metrics as mq  # noqa: E402
from prefixscope.store.queries import requests as rq  # noqa: E402
from prefixscope.store.queries import scopes as scq  # noqa: E402
from tests.scale_support import END_S, build_deployment  # noqa: E402

QUERIES = {
    "request_counts (rollup)": lambda c, s: rq.request_counts(c, start_s=s),
    "request_hit_rate_by_window 1h (rollup)": lambda c, s: rq.request_hit_rate_by_window(
        c, start_s=s, window_s=3600, by=("model",)),
    "hit_rate_by_window 1h, counters (rollup)": lambda c, s: mq.hit_rate_by_window(
        c, start_s=s, window_s=3600, by=("model", "instance")),
    "hit_rate_totals, counters (rollup)": lambda c, s: mq.hit_rate_totals(c, start_s=s),
    "request_hit_rate_bands 1h (raw)": lambda c, s: rq.request_hit_rate_bands(
        c, start_s=s, window_s=3600, by=("model",)),
    "request_latency_quantiles (rollup)": lambda c, s: rq.request_latency_quantiles(c, start_s=s),
    "newest_requests page 1 (raw)": lambda c, s: rq.newest_requests(c, start_s=s, limit=500),
    "scope totals by scope (scope rollup)": lambda c, s: scq.hit_rate_by_scope_totals(
        c, start_s=s, by=("scope",)),
    "scope window 1h, one instance (raw join)": lambda c, s: scq.hit_rate_by_scope_window(
        c, start_s=s, window_s=3600, instances=["vllm-00:8000"]),
    "invariant_counts (scope rollup)": lambda c, s: scq.invariant_counts(c, start_s=s),
}


def _per_day(path: Path, root: str, before_s: float) -> tuple[float, float]:
    """The baseline: one writer, COPY, read-back and DELETE per table and day. Returns
    (wall s, longest lock hold s)."""
    t0 = time.perf_counter()
    with store_db.writer(path) as con:
        plan = arc.plan_days(con, before_s)
    longest = 0.0
    for item in plan:
        t = time.perf_counter()
        with store_db.writer(path) as con:
            arc.archive_day(con, item.table, parse_time(item.day), root)
        longest = max(longest, time.perf_counter() - t)
    return time.perf_counter() - t0, longest


def _chunked(path: Path, root: str, before_s: float) -> tuple[float, float, int]:
    """``prefixscope archive``'s path: one COPY, footer count check and DELETE per chunk.
    Returns (wall s, longest chunk s, chunks)."""
    t0 = time.perf_counter()
    with store_db.writer(path) as con:
        plan = arc.plan_days(con, before_s)
    chunks = arc.plan_chunks(plan)
    longest = 0.0
    con = store_db.BatchConnection(path)
    try:
        for table, lo, hi, _ in chunks:
            t = time.perf_counter()
            arc.archive_range(con.connection(), table, lo, hi, root)
            store_db.release_between_batches(con, only_if_waited=True)
            longest = max(longest, time.perf_counter() - t)
    finally:
        con.close()
    return time.perf_counter() - t0, longest, len(chunks)


def _best(path: Path, fn, start_s, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        with store_db.reader(path) as con:
            t = time.perf_counter()
            fn(con, start_s)
            best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--scrape-s", type=float, default=60.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="prefixscope-archive-bench-"))
    try:
        orig = tmp / "orig.duckdb"
        t = time.perf_counter()
        counts = build_deployment(orig, requests=args.requests, scrape_s=args.scrape_s)
        print(f"built {counts} in {time.perf_counter() - t:.1f} s")
        base, arch = tmp / "per-day.duckdb", tmp / "archived.duckdb"
        shutil.copy(orig, base)
        shutil.copy(orig, arch)
        before_s = END_S - 15 * 86400
        print(f"load before: {os.getloadavg()}")
        wall_b, hold_b = _per_day(base, str(tmp / "ark-per-day"), before_s)
        wall, hold, nchunks = _chunked(arch, str(tmp / "ark"), before_s)
        with store_db.reader(arch) as con:
            rows = con.execute("SELECT sum(rows) FROM archive_parts").fetchone()[0]
            per = dict(con.execute("SELECT tbl, sum(rows) FROM archive_parts GROUP BY tbl"
                                   ).fetchall())
            nfiles = con.execute("SELECT sum(len(files)) FROM archive_parts").fetchone()[0]
        with store_db.reader(base) as con:
            rows_b = con.execute("SELECT sum(rows) FROM archive_parts").fetchone()[0]
            units = con.execute("SELECT count(*) FROM archive_parts").fetchone()[0]
        assert rows == rows_b, (rows, rows_b)
        size = sum(p.stat().st_size for p in (tmp / "ark").rglob("*.parquet"))
        print(f"archived {rows:,} rows {per}")
        print(f"per day (baseline): {units} units in {wall_b:.1f} s ({rows / wall_b:,.0f} rows/s), "
              f"longest lock hold {hold_b:.1f} s")
        print(f"chunked: {nchunks} chunks in {wall:.1f} s ({rows / wall:,.0f} rows/s), longest "
              f"chunk {hold:.1f} s; {wall_b / wall:.2f}x the baseline")
        print(f"archive: {nfiles} files, {size / 1e6:.1f} MB ({size / rows:.0f} bytes/row)")
        print(f"load after archiving: {os.getloadavg()}")
        start_s = END_S - 30 * 86400 + 30.0  # "all", starting inside a minute and a bucket
        print(f"{'query':<44} {'in DuckDB':>10} {'archived':>10} {'ratio':>7}")
        for name, fn in QUERIES.items():
            a = _best(orig, fn, start_s, args.repeat)
            b = _best(arch, fn, start_s, args.repeat)
            print(f"{name:<44} {a * 1000:>8.0f}ms {b * 1000:>8.0f}ms {b / a:>6.2f}x")
        print(f"load: {os.getloadavg()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
