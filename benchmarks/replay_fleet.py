"""Benchmark: fleet replay with the miss ledger, and the capacity sweep, against one replay.

Issue 26's targets, as ratios in one run on the same requests (read and materialised before
the clock: token lists for sha256, block keys for fast):

- ``replay fleet`` round robin over N instances (ledger on) / a single-instance ``replay sim``
  of the same trace: <= 1.5x;
- ``longest-prefix`` routing over N instances / the same single replay: <= 3x;
- a 6-size capacity sweep (LRU and Belady's MIN per size, 2 processes; the hashing pass
  included) / one single replay at one size: <= 4x (also printed: the same sweep in one
  process, for a machine whose second core is busy).

Wall seconds, best of ``--repeat`` (the five measurements run in turn, each round, so a load
that changes during the run weighs on all alike); the machine's load is printed (other
processes share the CPUs: quote it with the figures).

Usage:

    .venv/bin/python benchmarks/replay_fleet.py --requests 3000 --algo sha256 --block-size 16 --capacity 20000 --instances 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prefixscope.replay.belady import capacity_sweep, collect_accesses  # noqa: E402
from prefixscope.replay.fleet import replay_fleet  # noqa: E402
from prefixscope.replay.sim import simulate  # noqa: E402
from prefixscope.replay.traces import read_trace  # noqa: E402
from prefixscope.replay.types import SimConfig  # noqa: E402

DEFAULT_TRACE = ROOT / "data" / "traces" / "mooncake" / "conversation_trace.jsonl.gz"


def load(trace: Path, count: int, block_size: int, algo: str) -> list:
    reqs = []
    for r in read_trace(trace, format="mooncake", hash_id_block_size=512,
                        block_size=block_size, limit=count).requests:
        if algo == "fast":
            reqs.append(replace(r, prompt_token_ids=None, block_keys=list(r.block_keys)))
        else:
            reqs.append(replace(r, prompt_token_ids=list(r.prompt_token_ids), block_keys=None))
    return reqs


def best_interleaved(fns: dict, repeat: int) -> dict:
    """``{name: (best wall seconds, last result)}``, the functions run in turn ``repeat``
    times (a load that changes during the run then weighs on every figure alike)."""
    times: dict = {k: [] for k in fns}
    outs: dict = {}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            outs[k] = fn()
            times[k].append(time.perf_counter() - t)
    return {k: (min(times[k]), outs[k]) for k in fns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--algo", default="sha256")
    ap.add_argument("--capacity", type=int, default=20000, help="num_gpu_blocks per instance")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    reqs = load(a.trace, a.requests, a.block_size, a.algo)
    cfg = SimConfig(block_size=a.block_size, num_gpu_blocks=a.capacity, hash_algo=a.algo)
    print(f"{len(reqs):,} requests of {a.trace.name}, B={a.block_size}, {a.algo}, "
          f"{a.capacity:,} blocks per instance, {a.instances} instances; load before "
          f"{os.getloadavg()[0]:.2f}")

    def single():
        run = simulate(reqs, cfg, read_ahead=True)
        for _ in run:
            pass
        return run.summary()

    def fleet(router):
        return lambda: replay_fleet(reqs, cfg, instances=a.instances, router=router).run()

    sizes = [max(2, a.capacity * k // 8) for k in (1, 2, 4, 8, 16, 32)]

    def sweep(jobs):
        def run():
            acc = collect_accesses(reqs, cfg)
            return capacity_sweep(acc, sizes, jobs=jobs)
        return run

    res = best_interleaved({"one": single, "rr": fleet("round-robin"),
                            "lp": fleet("longest-prefix"), "sw": sweep(a.jobs), "sw1": sweep(1)},
                           a.repeat)
    (t_one, s), (t_rr, rr), (t_lp, lp) = res["one"], res["rr"], res["lp"]
    (t_sw, rows), (t_sw1, rows1) = res["sw"], res["sw1"]
    assert rows1 == rows
    print(f"single replay           {t_one:7.2f} s  hit rate {s.hit_rate:.4f}")
    print(f"fleet round-robin       {t_rr:7.2f} s  hit rate {rr.hit_rate:.4f}  "
          f"ratio {t_rr / t_one:.2f}x (target <= 1.5x)")
    print(f"fleet longest-prefix    {t_lp:7.2f} s  hit rate {lp.hit_rate:.4f}  "
          f"ratio {t_lp / t_one:.2f}x (target <= 3x)")
    print(f"capacity sweep, 6 sizes {t_sw:7.2f} s  ratio {t_sw / t_one:.2f}x (target <= 4x, "
          f"{a.jobs} processes)")
    print(f"capacity sweep, 1 process {t_sw1:5.2f} s  ratio {t_sw1 / t_one:.2f}x")
    for r in rows:
        print(f"  {r.num_gpu_blocks:>9,} blocks  LRU {r.lru_hit_rate:.4f}  MIN {r.min_hit_rate:.4f}")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
