"""Dashboard reruns with a warm cache: how long a page re-runs (greys) when nothing new is due.

With **Live** on the dashboard re-runs every ``[dashboard] cache_ttl_s``; any widget click
re-runs too. A rerun inside one cache period should read every query from the cache. Each page
is run in Streamlit's AppTest on ``--db`` (the real router, in this process): one cold run (cache
cleared), then ``--reruns`` more runs inside the same cache period (the period frozen by
``prefixscope.dashboard.data.clock``, the wall clock moving on as usual); printed per page:
cold seconds, warm median seconds and warm / cold.

    .venv/bin/python benchmarks/dashboard_rerun.py --db data/prefixscope.duckdb \\
        --pages views/overview.py views/savings.py --range 24h
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True)
    p.add_argument("--pages", nargs="+", default=["views/overview.py"])
    p.add_argument("--range", default="24h", help="the sidebar's time range (quick pick)")
    p.add_argument("--reruns", type=int, default=3)
    a = p.parse_args(argv)
    os.environ["PREFIXSCOPE_DB"] = a.db
    from streamlit.testing.v1 import AppTest

    from prefixscope.dashboard import data

    frozen = time.time()
    data.clock = lambda: frozen  # one cache period for the whole run
    app = str(ROOT / "dashboard" / "app.py")
    print(f"db={a.db} range={a.range} load={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}")
    for page in a.pages:
        data.clear_cache()
        at = AppTest.from_file(app, default_timeout=300)
        at.run()
        at.radio(key="filter_range").set_value(a.range)
        at.switch_page(str(ROOT / "dashboard" / page))
        data.clear_cache()  # the first run drew the default page: cold again
        t0 = time.perf_counter()
        at.run()
        cold = time.perf_counter() - t0
        assert not at.exception, [e.value for e in at.exception]
        warm = []
        for _ in range(a.reruns):
            time.sleep(1.1)  # the wall clock moves on, as between two live ticks
            t0 = time.perf_counter()
            at.run()
            warm.append(time.perf_counter() - t0)
            assert not at.exception, [e.value for e in at.exception]
        w = statistics.median(warm)
        print(f"{page}: cold {cold:.2f} s, warm median {w:.2f} s ({len(warm)} reruns), "
              f"warm/cold {w / cold:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
