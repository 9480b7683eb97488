"""Benchmark: retention and the Parquet archive (issue 17 item 4, ``docs/retention.md``).

Builds a generated deployment (``tests/scale_support.build_deployment``: 30 days, 10
instances, 4 models; ``--requests`` requests, 15 s scrapes when ``--scrape-s 15``), copies it,
and in one run:

1. times ``prefixscope archive --before <day 16>`` on the copy (the first 15 days, both
   tables; the per-day write lock is held by the same process), reporting rows per second and
   the archive's bytes per row;
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefixscope.store import db as store_db  # noqa: E402
from prefixscope.store.queries import metrics as mq  # noqa: E402
from prefixscope.store.queries import requests as rq  # noqa: E402
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
}


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
        arch = tmp / "archived.duckdb"
        shutil.copy(orig, arch)
        before = time.strftime("%Y-%m-%d", time.gmtime(END_S - 15 * 86400))
        t = time.perf_counter()
        out = subprocess.run([str(Path(sys.executable).parent / "prefixscope"), "archive", "--db",
                              str(arch), "--to", str(tmp / "ark"), "--before", before],
                             capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t
        if out.returncode:
            sys.exit(out.stderr)
        print(out.stdout.strip())
        with store_db.reader(arch) as con:
            rows = con.execute("SELECT sum(rows) FROM archive_parts").fetchone()[0]
            nfiles = con.execute("SELECT sum(len(files)) FROM archive_parts").fetchone()[0]
        size = sum(p.stat().st_size for p in (tmp / "ark").rglob("*.parquet"))
        print(f"archive: {rows:,} rows in {wall:.1f} s ({rows / wall:,.0f} rows/s), "
              f"{nfiles} files, {size / 1e6:.1f} MB ({size / rows:.0f} bytes/row)")
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
