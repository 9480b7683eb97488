"""Benchmark: how fast the ``prefixscope`` command answers, against the interpreter's own start.

Target (issue 30 item 6): ``prefixscope --version`` and ``prefixscope --help`` within 0.2 s of
``python -c pass`` (the same interpreter, same run), and any command's first output line within
0.5 s. Each command is run ``--repeat`` times as a fresh process (the installed console script
of this venv); the best wall time of each is printed with its margin over the baseline.

Usage:

    .venv/bin/python benchmarks/cli_start.py
    .venv/bin/python benchmarks/cli_start.py --repeat 15 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
#: (label, argv, target seconds over the baseline)
CASES = [
    ("--version", [str(BIN / "prefixscope"), "--version"], 0.2),
    ("--help", [str(BIN / "prefixscope"), "--help"], 0.2),
    ("report --help", [str(BIN / "prefixscope"), "report", "--help"], 0.5),
]


def best_of(argv: list[str], repeat: int) -> float:
    """Best wall seconds of ``argv`` run to completion as a new process, ``repeat`` times."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = best_of([sys.executable, "-c", "pass"], args.repeat)
    rows = []
    for label, argv, target in CASES:
        s = best_of(argv, args.repeat)
        rows.append({"command": label, "seconds": round(s, 4), "over_baseline_s": round(s - base, 4),
                     "ratio": round(s / base, 2), "target_over_baseline_s": target,
                     "met": s - base <= target})
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"baseline_s": round(base, 4), "load_1m": load, "cases": rows}))
        return
    print(f"baseline python -c pass: {base:.3f} s (best of {args.repeat}; load {load:.2f})")
    for r in rows:
        print(f"{r['command']:<16} {r['seconds']:.3f} s  +{r['over_baseline_s']:.3f} s over the "
              f"baseline ({r['ratio']:.1f}x), target +{r['target_over_baseline_s']} s: "
              f"{'met' if r['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
