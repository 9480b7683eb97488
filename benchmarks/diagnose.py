"""Benchmark: ``prefixscope diagnose`` against a plain ``replay sim`` of the same trace, same run.

Target (issue 13): diagnose of 10,000 chat requests costs at most 3x a plain ``replay sim`` of
the same trace; memory bounded by the unique prefixes, not by requests x length.

The trace is a synthetic support-bot log written into a temporary folder (``make_trace``):
conversations of 1-6 turns, a system prompt of ~60 lines whose first line is a timestamp
that changes every minute, five tools whose order is reversed in a fifth of the
conversations, a per-conversation first question and short replies (``response_text``, so
decode blocks are real). Its breakers: the timestamp (level 1) and the reordered tools
(level 2).

In one run, best of ``--repeat`` each, CPU seconds of this thread (``time.thread_time``; wall
seconds printed too):

1. ``replay sim``: ``prefixscope.replay.runner.run_sim`` (read, render, tokenise, replay, write
   requests.jsonl, metrics and run.json), exactly what the command does;
2. ``diagnose``: ``prefixscope.replay.diagnose_fix.diagnose`` (attribution pass, one
   counterfactual replay per measured breaker, the level-2 pass, the suggested layout's replay).

Memory: peak traced memory (``tracemalloc``) of the attribution pass over growing prefixes of a
trace whose conversations all share one system prompt (the unique prefixes grow with the
conversations, not with their length), against the index size (unique blocks).

Usage:

    .venv/bin/python benchmarks/diagnose.py
    .venv/bin/python benchmarks/diagnose.py --requests 10000 --repeat 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prefixscope.replay.diagnose import DiagnoseSpec, attribution_pass  # noqa: E402
from prefixscope.replay.diagnose_fix import diagnose  # noqa: E402
from prefixscope.replay.runner import SimRunSpec, run_sim  # noqa: E402

TOPICS = ["billing", "refunds", "shipping", "accounts", "passwords", "invoices", "orders",
          "returns", "warranty", "coupons", "subscriptions", "delivery"]


def _tool(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"{name.replace('_', ' ')} for the customer's account.",
        "parameters": {"type": "object", "properties": {
            "account_id": {"type": "string", "description": "The customer's account id."},
            "reason": {"type": "string", "description": "Why the agent calls it."}},
            "required": ["account_id"]}}}


TOOLS = [_tool(n) for n in ("lookup_order", "refund_payment", "update_address",
                            "reset_password", "open_ticket")]
SYSTEM_BODY = "\n".join(
    f"{i}. When the customer asks about {TOPICS[i % len(TOPICS)]}, check the account first, "
    f"explain the policy in two sentences and offer the next step." for i in range(1, 61))


def make_trace(path: Path, n: int, *, seed: int = 7, shared_only: bool = False) -> None:
    """Write ``n`` chat requests (see the module docstring) to ``path``."""
    rng = random.Random(seed)
    t = 0.0
    written = 0
    conv = 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < n:
            conv += 1
            minute = int(t // 60)
            stamp = "" if shared_only else \
                f"Current time: 2026-11-28T{9 + minute // 60 % 12:02d}:{minute % 60:02d}:00Z\n"
            system = stamp + "You are the support assistant of a shop.\n" + SYSTEM_BODY
            tools = TOOLS[::-1] if (not shared_only and rng.random() < 0.2) else TOOLS
            msgs = [{"role": "system", "content": system}]
            topic = rng.choice(TOPICS)
            for turn in range(rng.randint(1, 6)):
                if written >= n:
                    break
                msgs.append({"role": "user", "content":
                             f"Conversation {conv}, question {turn + 1}: my {topic} issue, order "
                             f"{rng.randint(10000, 99999)}, what now?"})
                reply = (f"Thanks. For {topic}, I checked order number {rng.randint(1, 999)}; "
                         "here is what happens next and what you need to do.")
                fh.write(json.dumps({"t": round(t, 3), "request_id": f"c{conv}-{turn}",
                                     "conversation": f"c{conv}", "model": "support-bot",
                                     "messages": list(msgs), "tools": tools,
                                     "response_text": reply}) + "\n")
                msgs.append({"role": "assistant", "content": reply})
                written += 1
                t += rng.uniform(0.5, 4.0)


def timed(fn, repeat: int) -> tuple[float, float, object]:
    best_cpu, best_wall, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        gc.collect()
        c0, w0 = time.thread_time(), time.perf_counter()
        result = fn()
        best_cpu = min(best_cpu, time.thread_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return best_cpu, best_wall, result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--memory-steps", type=int, nargs="*", default=[1000, 2000, 4000])
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "support.jsonl"
        make_trace(trace, args.requests)
        size = trace.stat().st_size
        print(f"trace: {args.requests:,} chat requests, {size / 1e6:.1f} MB; load "
              f"{os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
        # Warm both (tokenizer load, imports) outside the clock.
        run_sim(SimRunSpec(trace=str(trace), format="chat", limit=50), Path(tmp) / "warm")
        diagnose(DiagnoseSpec(trace=str(trace), format="chat", limit=50))

        sim_cpu, sim_wall, res = timed(
            lambda: run_sim(SimRunSpec(trace=str(trace), format="chat"), Path(tmp) / "sim"),
            args.repeat)
        dg_cpu, dg_wall, d = timed(lambda: diagnose(DiagnoseSpec(trace=str(trace),
                                                                 format="chat")), args.repeat)
        assert d.summary.cached_tokens == res.summary.cached_tokens, "diagnose != replay sim"
        print(f"replay sim: {sim_cpu:.2f} s CPU ({sim_wall:.2f} s wall), hit rate "
              f"{res.summary.hit_rate:.4f}")
        print(f"diagnose:   {dg_cpu:.2f} s CPU ({dg_wall:.2f} s wall), {d.passes} exact replays, "
              f"{len(d.breakers)} breakers: "
              + ", ".join(f"L{b.level} {b.kind} {b.lost_tokens:,}" for b in d.breakers)
              + f"; suggested layout {d.what_if.hit_rate:.4f}" if d.what_if else "")
        ratio = dg_cpu / sim_cpu
        print(f"ratio diagnose / replay sim: {ratio:.2f}x CPU ({dg_wall / sim_wall:.2f}x wall); "
              f"target <= 3x: {'met' if ratio <= 3 else 'NOT met'}")

        print("memory (attribution pass, one shared system prompt, growing trace):")
        for n in args.memory_steps:
            path = Path(tmp) / f"shared-{n}.jsonl"
            make_trace(path, n, shared_only=True)
            gc.collect()
            tracemalloc.start()
            p = attribution_pass(DiagnoseSpec(trace=str(path), format="chat"))
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            toks = p.summary.all_prompt_tokens
            print(f"  {n:>6,} requests, {toks:>11,} prompt tokens, {p.unique_blocks:>8,} unique "
                  f"blocks: peak {peak / 1e6:7.1f} MB ({peak / max(p.unique_blocks, 1):.0f} B "
                  f"per unique block, {peak / max(toks, 1):.1f} B per prompt token)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
