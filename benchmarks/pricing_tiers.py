"""Benchmark: per-request tier/period pricing in SQL (issue 16) at 10 M requests.

Builds ``--requests`` rows of ``requests`` with DuckDB SQL (``range()``; 30 days ending
2026-11-20, prompts 200 to 400,000 tokens so some cross the 200k and 272k tiers, 70% with
cache reads) over four models: ``claude-sonnet-4-5`` (tiers), ``gpt-5.6-sol`` (tiers and a
price change on 2026-08-21), ``deepseek-chat`` (time-of-day prices) and ``tiny-llama-random``
(a TOML shadow price). Then, best of ``--repeat`` on a read-only connection:

1. bare: ``SELECT count(*), sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens)
   FROM requests`` (the floor: one scan);
2. one price row per model (every model in a TOML table: what pricing cost before tiers);
3. genai-prices rows (``price_tiers``: 2 + 4 + 3 rows for the hosted models) plus the TOML row.

Prints each time and the ratios 3/1 and 3/2 (the cost of applying tiers and periods per request
in SQL). Target: 3/1 <= 20x, the dashboard's bound for a panel query against a bare scan
(``benchmarks/dashboard_scale.py``).

    .venv/bin/python benchmarks/pricing_tiers.py [--requests 10000000] [--repeat 3] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

END_S = 1_795_651_200.0  # 2026-11-20T00:00:00Z
MODELS = [("claude-sonnet-4-5", "anthropic"), ("gpt-5.6-sol", "openai"),
          ("deepseek-chat", "deepseek"), ("tiny-llama-random", None)]
TOML_ALL = "".join(
    f'[models."{m}"]\ncurrency = "USD"\ninput = 3\ncached_input = 0.3\noutput = 15\n'
    f'source = "flat"\n' for m, _ in MODELS)
TOML_SHADOW = ('[models."tiny-llama-random"]\ncurrency = "USD"\ninput = 0.05\ncached_input = 0\n'
               'output = 0.08\nshadow = true\nsource = "shadow"\n')


def build(path: str, n: int) -> None:
    from prefixscope.store import db as store_db
    from prefixscope.store.schema import REQUEST_KEY_SQL

    cols = ("run_id, request_id, source_id, line, ts_unix_s, ts_estimated, model, provider, "
            "prompt_tokens, cached_tokens, cache_write_tokens, completion_tokens")
    with store_db.writer(path) as con:
        con.execute(f"""
            INSERT INTO requests ({cols}, request_key)
            SELECT {cols}, {REQUEST_KEY_SQL} FROM (
                SELECT '' AS run_id, 'r' || i AS request_id, 'bench' AS source_id, i AS line,
                       {END_S} - 30 * 86400 + (i * 2592000.0 / {n}) AS ts_unix_s,
                       FALSE AS ts_estimated,
                       (['claude-sonnet-4-5','gpt-5.6-sol','deepseek-chat','tiny-llama-random'])
                           [1 + i % 4] AS model,
                       (['anthropic','openai','deepseek', NULL])[1 + i % 4] AS provider,
                       200 + (hash(i) % 400000) AS prompt_tokens,
                       CASE WHEN hash(i * 7) % 10 < 7 THEN (hash(i) % 400000) // 2 END
                           AS cached_tokens,
                       CAST(hash(i * 3) % 50 AS BIGINT) AS cache_write_tokens,
                       CAST(50 + hash(i * 5) % 500 AS BIGINT) AS completion_tokens
                FROM range({n}) t(i))
        """)
        con.execute("CHECKPOINT")


def best(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--db", help="reuse a database built by an earlier --keep run")
    args = ap.parse_args()
    from prefixscope.ingest.genai_prices import refresh_genai_prices
    from prefixscope.ingest.prices import load_prices
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.savings import savings_by_model

    tmp = Path(tempfile.mkdtemp(prefix="prefixscope-pricing-"))
    try:
        db = args.db or str(tmp / "bench.duckdb")
        if not args.db:
            t0 = time.perf_counter()
            build(db, args.requests)
            print(f"built {args.requests:,} requests in {time.perf_counter() - t0:.1f} s")
            if args.keep:
                print(f"kept: {db}")
        (tmp / "all.toml").write_text(TOML_ALL)
        (tmp / "shadow.toml").write_text(TOML_SHADOW)

        def bare(con):
            return con.execute("SELECT count(*), sum(prompt_tokens), sum(cached_tokens), "
                               "sum(completion_tokens) FROM requests").fetchone()

        with store_db.writer(db) as con:
            load_prices(con, tmp / "all.toml")
        with store_db.reader(db) as con:
            t_bare, _ = best(lambda: bare(con), args.repeat)
            t_flat, flat = best(lambda: savings_by_model(con), args.repeat)
        with store_db.writer(db) as con:
            load_prices(con, tmp / "shadow.toml")
            refresh_genai_prices(con)
            tiers = con.execute("SELECT count(*) FROM price_tiers").fetchone()[0]
        with store_db.reader(db) as con:
            t_tier, tiered = best(lambda: savings_by_model(con), args.repeat)
        print(f"bare scan                {t_bare * 1000:9.1f} ms")
        print(f"one price row per model  {t_flat * 1000:9.1f} ms")
        print(f"genai-prices tiers ({tiers} rows) {t_tier * 1000:9.1f} ms")
        print(f"ratio tiers / bare       {t_tier / t_bare:9.2f}x (target <= 20x)")
        print(f"ratio tiers / one row    {t_tier / t_flat:9.2f}x")
        print(tiered[["model", "requests", "cost_with_cache", "note"]].to_string(index=False))
        print(f"load: {os.getloadavg()}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
