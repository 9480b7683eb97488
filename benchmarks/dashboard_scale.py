"""Benchmark: the dashboard on a month of a real deployment (issue 17).

Builds two generated deployments through the real schema with DuckDB SQL
(``tests/scale_support.build_deployment``; 30 days, 10 instances, 4 models):

- ``small``: 1,000 requests, hourly counter samples (36,000 samples);
- ``big``: 10,000,000 requests, 15 s scrapes (8.64 M samples);

both with a gateway decision for every 5th request (production run).

Then, in one run:

1. every panel query of the dashboard (the ``prefixscope.store.queries`` calls the pages make,
   with the range "all" and the default filters), best of ``--repeat`` on a read-only
   connection, at both sizes, and a bare DuckDB scan of ``requests`` at the big size
   (``SELECT count(*), sum(prompt_tokens), sum(cached_tokens), sum(ttft_ms) FROM requests``);
   ratio = query at big / bare scan (target <= 20x);
2. every page rendered in headless Chromium (``/usr/bin/chromium``) by a real
   ``prefixscope dashboard`` server: each page visited once to warm the server, then (after
   the cache TTL of 1 s, set through a config file, has run out, so every query runs again) the
   time from navigation until Streamlit has finished running; ratio = big / small (target
   <= 3x). The dashboard's RSS (its whole process group, sampled every 0.2 s) at its peak
   (target <= 1 GB).

Databases go to a temporary folder under /tmp, deleted at the end (``--keep`` keeps them;
``--workdir DIR`` builds them in DIR, or re-uses the ``small.duckdb`` / ``big.duckdb`` already
there, and keeps them). ``--pages Scopes,Rejections`` times only those pages (by title).

    .venv/bin/python benchmarks/dashboard_scale.py [--requests 10000000] [--repeat 3]
        [--no-browser] [--keep] [--workdir DIR] [--pages TITLE,...]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def panel_queries():
    """``(page, name, fn(con))`` of every panel query, as the pages call them (range "all",
    production run, default windows: 1 h; savings 1 d)."""
    from prefixscope.store.queries import ingest as qi
    from prefixscope.store.queries import metrics as qm
    from prefixscope.store.queries import replay as qrp
    from prefixscope.store.queries import requests as qr
    from prefixscope.store.queries import savings as qs
    from prefixscope.store.queries import scopes as qg

    run = {"run_ids": [""]}
    rng = {"start_s": None, "end_s": None}
    return [
        ("sidebar", "metric_filter_values", lambda c: qm.metric_filter_values(c)),
        ("sidebar", "request_filter_values", lambda c: qr.request_filter_values(c)),
        ("overview", "hit_rate_by_window(model, instance)",
         lambda c: qm.hit_rate_by_window(c, window_s=3600, by=("model", "instance"), **rng, **run)),
        ("overview", "hit_rate_by_window(model)",
         lambda c: qm.hit_rate_by_window(c, window_s=3600, by=("model",), **rng, **run)),
        ("overview", "hit_rate_totals", lambda c: qm.hit_rate_totals(c, by=("model",), **rng, **run)),
        ("overview", "cache_config", lambda c: qm.cache_config(c, **run)),
        ("requests", "cached_tokens_coverage", lambda c: qr.cached_tokens_coverage(c, **rng, **run)),
        ("requests", "request_counts", lambda c: qr.request_counts(c, **rng, **run)),
        ("requests", "request_hit_rate_by_window",
         lambda c: qr.request_hit_rate_by_window(c, window_s=3600, by=("model",), **rng, **run)),
        ("requests", "request_hit_rate_histogram",
         lambda c: qr.request_hit_rate_histogram(c, bins=20, **rng, **run)),
        ("requests", "request_hit_rate_bands",
         lambda c: qr.request_hit_rate_bands(c, window_s=3600, **rng, **run)),
        ("requests", "request_latency_quantiles",
         lambda c: qr.request_latency_quantiles(c, column="ttft_ms", **rng, **run)),
        ("requests", "newest_requests(page 1)", lambda c: qr.newest_requests(c, **rng, **run)),
        ("savings", "savings_by_model", lambda c: qs.savings_by_model(c, **rng, **run)),
        ("savings", "savings_totals", lambda c: qs.savings_totals(c, **rng, **run)),
        ("savings", "savings_by_window",
         lambda c: qs.savings_by_window(c, window_s=86400, **rng, **run)),
        ("data sources", "table_row_counts", lambda c: qi.table_row_counts(c)),
        ("scopes", "hit_rate_by_scope_totals(scope)",
         lambda c: qg.hit_rate_by_scope_totals(c, by=("scope",), **rng, **run)),
        ("scopes", "hit_rate_by_scope_window(scope, 15m)",
         lambda c: qg.hit_rate_by_scope_window(c, window_s=900, by=("scope",), **rng, **run)),
        ("scopes", "hit_rate_by_scope_window(scope, namespace, 15m)",
         lambda c: qg.hit_rate_by_scope_window(c, window_s=900, by=("scope", "namespace_digest"),
                                               **rng, **run)),
        ("rejections", "miss_breakdown_by_window(15m)",
         lambda c: qg.miss_breakdown_by_window(c, window_s=900, **rng, **run)),
        ("rejections", "rejections_by_reason_window(15m)",
         lambda c: qg.rejections_by_reason_window(c, window_s=900, **rng, **run)),
        ("rejections", "top_rejected_namespaces",
         lambda c: qg.top_rejected_namespaces(c, limit=10, **rng, **run)),
        ("scopes", "uncounted_note: counters_and_requests",
         lambda c: qr.counters_and_requests(c, **rng, **run)),
        ("scopes", "run_list(with_decisions)",
         lambda c: qrp.run_list(c, with_decisions=True)),
        ("rejections", "gateway_events", lambda c: qg.gateway_events(c, **rng, **run)),
        ("invariants", "invariant_counts", lambda c: qg.invariant_counts(c, **rng, **run)),
        ("invariants", "invariant_violations(cross_scope)",
         lambda c: qg.invariant_violations(c, invariant="cross_scope_acceptance", **rng, **run)),
    ]


BARE_SCAN = ("SELECT count(*), sum(prompt_tokens), sum(cached_tokens), sum(ttft_ms) "
             "FROM requests")


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def time_queries(db: str, repeat: int) -> tuple[dict[str, float], float]:
    from prefixscope.store import db as store_db

    out: dict[str, float] = {}
    with store_db.reader(db) as con:
        con.execute("SET enable_progress_bar = false")
        bare = best_of(lambda: con.execute(BARE_SCAN).fetchall(), repeat)
        for page, name, fn in panel_queries():
            out[f"{page}: {name}"] = best_of(lambda fn=fn: fn(con), repeat)
    return out, bare


def _group_rss_bytes(pgid: int) -> int:
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (OSError, ProcessLookupError):
            continue
    return total


def _server_pgid(port: int) -> int | None:
    """The process group of the dashboard server listening on ``port`` (``prefixscope
    dashboard`` runs Streamlit in its own session: the group holds every process of it)."""
    needle = str(port).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd and (b"streamlit" in cmd or b"prefixscope" in cmd) \
                and b"chromium" not in cmd:
            try:
                return os.getpgid(int(pid))
            except ProcessLookupError:
                continue
    return None


def _wait_done(page, title: str, timeout_s: float = 600.0) -> float:
    """Seconds from now until the page's own heading (``title``) is drawn and no script runs
    (quiet for 1 s; the quiet time itself is not counted). Waiting for the heading first keeps
    the app shell, drawn before the script starts, from counting as done."""
    t0 = time.perf_counter()
    page.wait_for_selector('[data-testid="stMain"]', timeout=timeout_s * 1000)
    page.locator('[data-testid="stMain"] h1', has_text=title).first.wait_for(
        timeout=timeout_s * 1000)
    quiet_since = None
    while time.perf_counter() - t0 < timeout_s:
        busy = page.locator('[data-testid="stStatusWidget"], [data-testid="stAppSkeleton"], '
                            '[data-testid="stSkeleton"]').count() > 0
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.perf_counter()
        elif time.perf_counter() - quiet_since > 1.0:
            return quiet_since - t0
        time.sleep(0.05)
    raise TimeoutError("the page kept running")


def time_pages(db: str, workdir: Path, only: set[str] | None = None
               ) -> tuple[dict[str, float], int, list[str]]:
    """Render every page once to warm the server, then time each (cache expired).
    Returns (seconds per page, peak RSS bytes of the server, exception/error texts)."""
    from playwright.sync_api import sync_playwright

    from tests import dashboard_support as ds

    cfg = workdir / "prefixscope.toml"
    # Live off: with it on, the app re-runs every TTL (1 s here) and a page slower than that
    # never goes quiet (run 4 in docs/benchmarks-history.md); a measured render is one run of the page
    cfg.write_text("[dashboard]\ncache_ttl_s = 1\nlive = false\n", encoding="utf-8")
    times: dict[str, float] = {}
    problems: list[str] = []
    peak = [0]
    stop = threading.Event()
    with ds.dashboard_server(db, env={"PREFIXSCOPE_CONFIG": str(cfg)},
                             log_path=workdir / f"{Path(db).stem}-server.log",
                             timeout_s=120) as url:
        pgid = _server_pgid(int(url.rsplit(":", 1)[1]))

        def sample():
            while not stop.is_set():
                if pgid is not None:
                    peak[0] = max(peak[0], _group_rss_bytes(pgid))
                time.sleep(0.2)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        entries = ds.page_entries()
        if only:
            entries = [entries[0]] + [e for e in entries[1:] if e[1] in only]
        with sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(
                str(workdir / f"profile-{Path(db).stem}"), executable_path=ds.CHROMIUM,
                args=ds.CHROMIUM_ARGS, headless=True, viewport={"width": 1400, "height": 1000})
            try:
                page = ctx.new_page()
                for measure in (False, True):
                    for i, (rel, title, _icon) in enumerate(entries):
                        if measure:
                            time.sleep(1.2)  # the 1 s cache TTL runs out: every query runs
                        t0 = time.perf_counter()
                        page.goto(f"{url}/{ds.page_url_path(rel, first=(i == 0))}",
                                  wait_until="domcontentloaded")
                        took = (time.perf_counter() - t0) + _wait_done(page, title)
                        if measure and (not only or title in only):
                            times[title] = took
                            for sel in ('[data-testid="stException"]',
                                        '[data-testid="stAlertContentError"]'):
                                boxes = page.locator(sel)
                                for k in range(boxes.count()):
                                    problems.append(f"{title}: {boxes.nth(k).inner_text()[:300]}")
            finally:
                ctx.close()
        stop.set()
        th.join()
    return times, peak[0], problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--workdir", help="build in (or re-use the databases of) this folder; kept")
    ap.add_argument("--pages", help="comma-separated page titles to time (default: every page)")
    args = ap.parse_args()
    only = {t.strip() for t in args.pages.split(",")} if args.pages else None

    from tests.scale_support import build_deployment

    if args.workdir:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        args.keep = True
    else:
        work = Path(tempfile.mkdtemp(prefix="prefixscope-scale-", dir="/tmp"))
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()}")
    try:
        sizes = {"small": (1_000, 3600.0), "big": (args.requests, 15.0)}
        dbs = {}
        for name, (n, scrape) in sizes.items():
            path = work / f"{name}.duckdb"
            if path.exists() and args.workdir:
                print(f"re-using {path} ({path.stat().st_size / 1e6:,.0f} MB)")
                dbs[name] = str(path)
                continue
            t = time.perf_counter()
            rows = build_deployment(path, requests=n, scrape_s=scrape)
            print(f"built {name}: {rows['requests']:,} requests, {rows['metric_samples']:,} "
                  f"samples, {rows['gateway_decisions']:,} gateway decisions in {time.perf_counter() - t:.1f} s "
                  f"({path.stat().st_size / 1e6:,.0f} MB)")
            dbs[name] = str(path)

        q_small, _ = time_queries(dbs["small"], args.repeat)
        q_big, bare = time_queries(dbs["big"], args.repeat)
        print(f"\nbare scan of requests at {args.requests:,}: {bare * 1000:.0f} ms")
        print(f"{'query':58s} {'small ms':>9s} {'big ms':>9s} {'big/bare':>9s}")
        worst = 0.0
        for k in q_big:
            r = q_big[k] / bare
            worst = max(worst, r)
            flag = "" if r <= 20 else "  > 20x"
            print(f"{k:58s} {q_small[k] * 1000:9.1f} {q_big[k] * 1000:9.1f} {r:8.1f}x{flag}")
        print(f"worst panel query: {worst:.1f}x the bare scan (target <= 20x)")
        print(f"load after queries: {os.getloadavg()}")

        if not args.no_browser:
            p_small, rss_small, bad_small = time_pages(dbs["small"], work, only)
            p_big, rss_big, bad_big = time_pages(dbs["big"], work, only)
            print(f"\n{'page (range all, warmed, cache expired)':40s} {'small s':>8s} "
                  f"{'big s':>8s} {'big/small':>10s}")
            worst_p = 0.0
            for k in p_big:
                r = p_big[k] / p_small[k]
                worst_p = max(worst_p, r)
                flag = "" if r <= 3 else "  > 3x"
                print(f"{k:40s} {p_small[k]:8.2f} {p_big[k]:8.2f} {r:9.2f}x{flag}")
            print(f"worst page: {worst_p:.2f}x (target <= 3x)")
            print(f"dashboard peak RSS: small {rss_small / 2**20:,.0f} MiB, big "
                  f"{rss_big / 2**20:,.0f} MiB (target <= 1024 MiB)")
            for b in bad_small + bad_big:
                print(f"ERROR BOX: {b}")
            print(f"load at the end: {os.getloadavg()}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
