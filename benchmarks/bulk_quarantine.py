"""Lock hold of a bad file (issue 12): bulk quarantine/decision inserts against the row-at-a-time
``executemany`` they replaced, measured in the same run on the same machine.

Prints, for N rows: seconds of ``executemany`` (the baseline), seconds of
``store.sqlhelpers.insert_rows_bulk``, and their ratio; then the wall time of
``prefixscope ingest decisions`` on 10,000 good lines and on 30,000 lines that are all wrong
(every one quarantined), each committed per 4 MiB.

Run: .venv/bin/python benchmarks/bulk_quarantine.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prefixscope.store import db as store_db
from prefixscope.store.queries.ingest import QUARANTINE_COLUMNS
from prefixscope.store.sqlhelpers import insert_rows_bulk

N = 10_000


def rows(tag: str) -> list[tuple]:
    return [(f"decisions:/{tag}", f"/{tag}", i + 1, "request_id", "Expected `str`", "run",
             time.time()) for i in range(N)]


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    db = str(tmp / "b.duckdb")
    with store_db.writer(db) as con:
        cols = ", ".join(QUARANTINE_COLUMNS)
        t = time.perf_counter()
        con.executemany(f"INSERT INTO quarantine ({cols}) VALUES (?, ?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (source_id, line) DO NOTHING", [list(r) for r in rows("a")])
        base = time.perf_counter() - t
        t = time.perf_counter()
        insert_rows_bulk(con, "quarantine", QUARANTINE_COLUMNS, rows("b"),
                         conflict="ON CONFLICT (source_id, line) DO NOTHING")
        bulk = time.perf_counter() - t
    print(f"quarantine rows: {N:,}; executemany {base:.2f} s; bulk {bulk:.3f} s; "
          f"ratio bulk/executemany {bulk / base:.4f}")
    dec = {"ts_unix_s": 1764590000.0, "scope": "PUBLIC", "namespace_digest": "0123456789abcdef",
           "decision": "miss", "candidate_cached_tokens": 0, "accepted_cached_tokens": 0}
    good = tmp / "good.jsonl"
    good.write_text("".join(json.dumps({**dec, "request_id": f"r{i}"}) + "\n" for i in range(N)))
    wrong = tmp / "wrong.jsonl"
    wrong.write_text("".join(json.dumps({**dec, "request_id": f"w{i}", "decision": "maybe"})
                             + "\n" for i in range(3 * N)))
    exe = str(Path(sys.executable).parent / "prefixscope")
    for f in (good, wrong):
        t = time.perf_counter()
        p = subprocess.run([exe, "ingest", "decisions", str(f), "--db", str(tmp / "i.duckdb")],
                           capture_output=True, text=True, env={**os.environ})
        print(f"ingest decisions {f.name} ({sum(1 for _ in open(f)):,} lines): "
              f"{time.perf_counter() - t:.1f} s, exit {p.returncode}")


if __name__ == "__main__":
    main()
