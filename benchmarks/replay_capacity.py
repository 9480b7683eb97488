"""Benchmark: how our replay model's time grows with the cache capacity (ours alone, issue 17).

For each capacity, the same slice of the Mooncake trace as ``benchmarks/replay_sim.py``, read
and materialised before the clock, replayed sequentially with sha256 and with fast keys; best
of ``--repeat`` of:

- the thread CPU seconds of the whole replay and of the time inside ``BlockPool.run_alone`` (the
  pool: lookup, eviction, registration, relinking), the rest being hashing and bookkeeping;
- the minor page faults and system seconds of the thread during the replay (new memory, mostly
  the block map's growing tables).

Then the largest capacity's times over the smallest's (1.00 = flat). A churn microbenchmark of
a bare dict (FIFO, 800 int keys per batch, as many insertions as the trace has blocks) shows
the part that is CPython's dict alone: insertion seconds while the dict grows to the capacity
and once it is at its steady size, for consecutive int keys and for keys spaced 16 apart.

Usage:

    .venv/bin/python benchmarks/replay_capacity.py --requests 600 --repeat 5
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
from collections import deque
from itertools import repeat
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from replay_sim import DEFAULT_TRACE, load_requests  # noqa: E402

from prefixscope.replay import block_pool  # noqa: E402
from prefixscope.replay.native import native_status  # noqa: E402
from prefixscope.replay.sim import simulate  # noqa: E402
from prefixscope.replay.types import SimConfig  # noqa: E402

_consume = deque(maxlen=0).extend


def replay_once(reqs: list, config: SimConfig) -> dict:
    """One replay: thread CPU seconds (total, in ``run_alone``), faults, system seconds, hits."""
    inside = [0.0]
    original = block_pool.BlockPool.run_alone

    def timed(self, *args):
        t = time.thread_time()
        try:
            return original(self, *args)
        finally:
            inside[0] += time.thread_time() - t

    gc.collect()
    run = simulate(reqs, config, read_ahead=True)  # builds the empty cache before the clock
    block_pool.BlockPool.run_alone = timed
    try:
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        c0 = time.thread_time()
        hits = sum(r.cached_tokens for r in run)
        cpu = time.thread_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
    finally:
        block_pool.BlockPool.run_alone = original
    return {"cpu_s": cpu, "pool_s": inside[0], "minflt": r1.ru_minflt - r0.ru_minflt,
            "sys_s": r1.ru_stime - r0.ru_stime, "hits": hits}


def dict_churn(capacity: int, insertions: int, stride: int = 1) -> tuple[float, float]:
    """Insertion CPU seconds of a FIFO-churned dict: (growing to ``capacity``, then steady).

    ``stride`` 1: consecutive int keys, like the hash-id readers' fast keys now; 16: keys
    ``15 + 16 k``, the readers' keys before (every first probe in one slot of 16)."""
    keys = list(range(stride - 1, stride * 2 * insertions, stride))
    d: dict[int, int] = {}
    q: deque[int] = deque()
    ids = list(range(capacity + 2))
    out = []
    for phase in range(2):
        spent = 0.0
        for s in range(phase * insertions, (phase + 1) * insertions, 800):
            batch = keys[s:s + 800]
            excess = len(q) + len(batch) - capacity
            if excess > 0:
                _consume(map(d.pop, [q.popleft() for _ in range(excess)], repeat(None)))
            t = time.thread_time()
            _consume(map(d.setdefault, batch, ids[100:100 + len(batch)]))
            spent += time.thread_time() - t
            q.extend(batch)
        out.append(spent)
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, action="append",
                    help="num_gpu_blocks (repeatable; default 20000 and 200000)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    caps = sorted(args.capacity or [20000, 200000])
    bs = args.block_size
    print(f"replay loops: {native_status()} (PREFIXSCOPE_NATIVE=0 runs the Python path)")
    print(f"load average {os.getloadavg()[0]:.1f}; first {args.requests} requests, best of "
          f"{args.repeat}, thread CPU seconds")
    data = {"sha256": load_requests(args.trace, args.requests, bs, "tokens"),
            "fast": load_requests(args.trace, args.requests, bs, "keys")}
    blocks = sum(r.num_prompt_tokens // bs for r in data["fast"])
    best: dict[tuple[str, int], dict] = {}
    for cap in caps:
        for algo, reqs in data.items():
            cfg = SimConfig(block_size=bs, num_gpu_blocks=cap, hash_algo=algo)
            runs = [replay_once(reqs, cfg) for _ in range(args.repeat)]
            assert len({r["hits"] for r in runs}) == 1
            b = min(runs, key=lambda r: r["cpu_s"])
            best[algo, cap] = b
            print(f"capacity {cap:>7} {algo:6}: total {b['cpu_s']:.4f} s, in run_alone "
                  f"{min(r['pool_s'] for r in runs):.4f} s, rest {b['cpu_s'] - b['pool_s']:.4f} "
                  f"s; {b['minflt']:,} minor faults, system {b['sys_s']:.4f} s; hit tokens "
                  f"{b['hits']:,}", flush=True)
    lo, hi = caps[0], caps[-1]
    for algo in data:
        print(f"{algo}: capacity {hi} / {lo}: total "
              f"{best[algo, hi]['cpu_s'] / best[algo, lo]['cpu_s']:.2f}x, run_alone "
              f"{best[algo, hi]['pool_s'] / best[algo, lo]['pool_s']:.2f}x")
    for cap in caps:
        for stride in (1, 16):
            grow, steady = min(dict_churn(cap, blocks, stride) for _ in range(3))
            print(f"bare dict, {blocks:,} insertions at {cap} keys spaced {stride}: growing "
                  f"{grow:.4f} s, steady {steady:.4f} s")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
