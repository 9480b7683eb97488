"""Benchmark: `prefixscope ingest requests` against DuckDB's own `read_json` on the same file.

Generates N realistic usage lines (default 1,000,000) in a temporary folder: vLLM chat and
completions responses as a gateway would log them (prefixscope usage-log records wrapping the
response, with a short generated answer text), a few final stream chunks and Anthropic-shaped
/v1/messages responses. Then, each in its own child process so that peak memory is measured
separately (`resource.getrusage(RUSAGE_SELF).ru_maxrss` of that child):

1. baseline: DuckDB `CREATE TABLE raw AS SELECT * FROM read_json(file)` into a fresh database
   file (DuckDB parses and stores every field; it does no normalisation);
2. ours: `prefixscope.ingest.usage.ingest_usage_file` into a fresh, migrated database file (parse,
   normalise, checkpoint, insert with the primary key) through `store.db.batch_writer` as the
   CLI does (the opening and closing is in the time);
3. ours again on the same file and database (the re-ingest: nothing new to read).

These run interleaved ``--repeat`` times (default 2) and the best time of each is reported, as
other work on the machine can slow any single run. Prints rows/s, wall and CPU seconds (ours:
with its parser processes) and peak RSS of each, and the ratios ours / baseline. Target: our
rows/s at least 0.5x the baseline's.

    .venv/bin/python benchmarks/ingest_requests.py [--lines 1000000] [--repeat 2] [--keep DIR]
        [--workers N] [--ids random|sequential]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = ("the cache prefix block token model request answer legal case file page question "
         "summary section clause court party ruling evidence").split()


def generate(path: Path, n: int, seed: int = 7, ids: str = "random") -> int:
    """Write ``n`` usage lines to ``path``; returns the file size in bytes.

    ``ids``: ``random`` gives each response a random 16-hex id (``chatcmpl-8e0e3b17bd6accf5``,
    as vLLM's captured responses in /work/shared/data have); ``sequential`` numbers them
    (``chatcmpl-000000000000002a``, the generator before 2026-11-29 19:40), which favours an
    index on the text id (neighbouring keys)."""
    import msgspec

    encode = msgspec.json.encode
    rnd = random.Random(seed)
    id_rnd = random.Random(seed + 1)  # its own stream: the other fields do not depend on ``ids``

    def hex_id(i: int) -> str:
        return f"{id_rnd.getrandbits(64):016x}" if ids == "random" else f"{i:016x}"

    t0 = 1_795_000_000.0
    models = ("llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct")
    instances = ("vllm-a:8000", "vllm-b:8000", "vllm-c:8000")
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            ts = t0 + i * 0.05
            model = models[i % 3]
            prompt = rnd.randint(200, 8000)
            cached = (rnd.randint(0, prompt - 1) // 16) * 16 if rnd.random() < 0.8 else 0
            out = rnd.randint(5, 300)
            answer = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(5, 25)))
            kind = i % 20
            if kind < 14:  # chat completion in a log record
                resp = {"id": f"chatcmpl-{hex_id(i)}", "object": "chat.completion",
                        "created": int(ts), "model": model,
                        "choices": [{"index": 0, "message": {"role": "assistant",
                                                             "content": answer},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": prompt, "total_tokens": prompt + out,
                                  "completion_tokens": out,
                                  "prompt_tokens_details": {"cached_tokens": cached,
                                                            "created_cache_tokens": 0}}}
                rec = {"ts_unix_s": ts, "request_id": resp["id"], "model": model,
                       "instance": instances[i % 3], "endpoint": "chat",
                       "ttft_ms": round(rnd.uniform(20, 900), 1),
                       "latency_ms": round(rnd.uniform(200, 9000), 1), "response": resp}
            elif kind < 18:  # completions response, no details object (not reported)
                rec = {"id": f"cmpl-{hex_id(i)}", "object": "text_completion", "created": int(ts),
                       "model": model, "choices": [{"index": 0, "text": answer,
                                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": prompt, "total_tokens": prompt + out,
                                 "completion_tokens": out, "prompt_tokens_details": None}}
            elif kind == 18:  # final usage chunk of a stream
                rec = {"id": f"chatcmpl-{hex_id(i)}", "object": "chat.completion.chunk",
                       "created": int(ts), "model": model, "choices": [],
                       "usage": {"prompt_tokens": prompt, "total_tokens": prompt + out,
                                 "completion_tokens": out,
                                 "prompt_tokens_details": {"cached_tokens": cached}}}
            else:  # vLLM /v1/messages (Anthropic shape, exclusive input)
                rec = {"id": f"msg_{hex_id(i)}", "type": "message", "role": "assistant",
                       "model": model, "content": [{"type": "text", "text": answer}],
                       "usage": {"input_tokens": prompt - cached, "output_tokens": out,
                                 "cache_read_input_tokens": cached,
                                 "cache_creation_input_tokens": 0},
                       "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))}
            fh.write(encode(rec).decode() + "\n")
    return path.stat().st_size


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _baseline(path: str, db: str) -> dict:
    import duckdb

    con = duckdb.connect(db)
    con.execute("SET enable_progress_bar = false")
    t, c = time.perf_counter(), time.process_time()
    con.execute("CREATE TABLE raw AS SELECT * FROM read_json(?, format = 'newline_delimited')",
                [path])
    rows = con.execute("SELECT count(*) FROM raw").fetchone()[0]
    con.close()
    return {"rows": rows, "seconds": time.perf_counter() - t, "cpu_s": time.process_time() - c,
            "peak_rss_mb": _peak_rss_mb()}


def _ours(path: str, db: str, workers: int | None = None) -> dict:
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    t, c = time.perf_counter(), time.process_time()
    with store_db.batch_writer(db) as con:  # as the CLI: the file released between batches
        s = ingest_usage_file(con, path, workers=workers)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the parser processes, once joined
    return {"rows": s.rows_read, "rows_added": s.rows_added, "quarantined": s.rows_quarantined,
            "seconds": dt, "cpu_s": dc + kids.ru_utime + kids.ru_stime,
            "peak_rss_mb": _peak_rss_mb(), "parser_peak_rss_mb": kids.ru_maxrss / 1024.0,
            "opens": con.opens}


def _run_in_child(target, args, q) -> None:
    try:
        q.put(("ok", target(*args)))
    except BaseException as exc:  # report, never hang the parent
        q.put(("error", f"{type(exc).__name__}: {exc}"))


def _child(target, *args) -> dict:
    """Run ``target(*args)`` in a fresh process (its own peak RSS); return its result dict."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_run_in_child, args=(target, args, q))
    p.start()
    status, result = q.get()
    p.join()
    if status != "ok":
        raise RuntimeError(f"{target.__name__} failed: {result}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--keep", help="folder to keep the generated file and databases in "
                                   "(a file of the same --lines found there is reused)")
    ap.add_argument("--workers", type=int, default=None,
                    help="parser processes of our ingest (default: the product's own choice)")
    ap.add_argument("--ids", choices=("random", "sequential"), default="random",
                    help="response ids: random 16-hex (as vLLM's) or numbered (the old file)")
    ap.add_argument("--repeat", type=int, default=2,
                    help="rounds (baseline, ours, re-ingest each); the best time of each is shown")
    args = ap.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="prefixscope-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        data = work / "usage.jsonl"
        stamp = work / "usage.jsonl.lines"
        want = f"{args.lines} {args.ids}"
        if args.keep and data.exists() and stamp.exists() and \
                stamp.read_text().strip() == want:
            print(f"reusing {args.lines:,} lines ({args.ids} ids), {data.stat().st_size / 1e6:.1f} MB: {data}")
        else:
            t = time.perf_counter()
            size = generate(data, args.lines, ids=args.ids)
            stamp.write_text(want)
            print(f"generated {args.lines:,} lines ({args.ids} ids), {size / 1e6:.1f} MB in "
                  f"{time.perf_counter() - t:.1f} s: {data}")
        import duckdb

        print(f"python {sys.version.split()[0]}, duckdb {duckdb.__version__}, "
              f"{os.cpu_count()} CPUs (DuckDB's threads and our parser processes use all); "
              f"load average before: {os.getloadavg()[0]:.1f}")
        base = ours = again = None
        for i in range(args.repeat):  # interleaved; the best of each (the machine may be busy)
            for f in work.glob("*.duckdb*"):
                f.unlink()
            b = _child(_baseline, str(data), str(work / "baseline.duckdb"))
            o = _child(_ours, str(data), str(work / "ours.duckdb"), args.workers)
            a = _child(_ours, str(data), str(work / "ours.duckdb"), args.workers)
            print(f"round {i + 1}: baseline {b['seconds']:.2f} s, ours {o['seconds']:.2f} s, "
                  f"re-ingest {a['seconds']:.2f} s; load average now "
                  f"{os.getloadavg()[0]:.1f}")
            base = b if base is None or b["seconds"] < base["seconds"] else base
            ours = o if ours is None or o["seconds"] < ours["seconds"] else ours
            again = a if again is None or a["seconds"] < again["seconds"] else again
        for name, r in (("duckdb read_json (baseline)", base), ("prefixscope ingest", ours),
                        ("prefixscope re-ingest", again)):
            rate = r["rows"] / r["seconds"] if r["rows"] else 0.0
            print(f"{name:<28} rows {r['rows']:>9,}  {r['seconds']:7.2f} s wall "
                  f"{r['cpu_s']:7.2f} s CPU  {rate:>9,.0f} rows/s  "
                  f"peak RSS {r['peak_rss_mb']:7.1f} MB")
        ratio = (ours["rows"] / ours["seconds"]) / (base["rows"] / base["seconds"])
        print(f"ratio rows/s ours / baseline: {ratio:.2f}x (target >= 0.5x)")
        print(f"ratio CPU seconds ours / baseline: {ours['cpu_s'] / base['cpu_s']:.2f}x; "
              f"our parser processes peaked at {ours.get('parser_peak_rss_mb', 0):.1f} MB each; "
              f"load average after: {os.getloadavg()[0]:.1f}")
        print(f"ratio peak RSS ours / baseline: {ours['peak_rss_mb'] / base['peak_rss_mb']:.2f}x")
        print(f"ours opened the database file {ours['opens']} times (it is closed after a "
              f"commit only while another process waits for it)")
        print(f"re-ingest added {again['rows_added']} rows (expected 0); first ingest "
              f"added {ours['rows_added']:,}, quarantined {ours['quarantined']}")
        return 0 if ratio >= 0.5 else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
