"""Replay runs for the demo database (called by ``prefixscope demo`` / ``make demo``).

:func:`run_demo_replays` makes five simulated runs from bundled real data and ingests each one
through the normal ingest path (``ingest/runs.py``), so the Overview, Requests, Savings and
Replay pages all show them:

1. Mooncake conversation trace (the first :data:`MOONCAKE_REQUESTS` requests, about 15 minutes
   of Kimi traffic), block size 32 (the CPU backend's), at two cache sizes: 20,000 blocks
   (640k tokens) and 200,000 blocks (6.4M tokens). Fast keys (same hit counts as vLLM's sha256).
2. The aider chat trace (``data/captures/aider/chat-requests.jsonl``) as recorded, with the
   ``date-at-end`` layout and with the ``date-in-first-user`` layout (block size 16, unbounded).

About 30 to 60 s on 2 cores.

:func:`run_demo_fleet` adds a fleet (issue 26): the same aider chats replayed by ``replay fleet``
on :data:`FLEET_INSTANCES` replicas under round robin (routing is the largest loss) and under
the prefix-aware ``longest-prefix`` router (which recovers it), stored as ``--ingest`` stores
them (``ledger.json`` through ``ingest/ledger.py``) for the Miss ledger page. About a second.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefixscope.core.paths import data_file
from prefixscope.ingest.runs import ingest_run_dir
from prefixscope.replay.runner import SimRunSpec, run_sim
from prefixscope.store import db as store_db

MOONCAKE = data_file("traces", "mooncake", "conversation_trace.jsonl.gz")
AIDER = data_file("captures", "aider", "chat-requests.jsonl")
LAYOUTS = data_file("layouts")
MOONCAKE_REQUESTS = 3000
MOONCAKE_CAPACITIES = (20_000, 200_000)


def demo_specs() -> list[tuple[str, SimRunSpec]]:
    """``(run directory name, spec)`` of every demo run, in the order they are made."""
    specs = []
    for cap in MOONCAKE_CAPACITIES:
        specs.append((f"mooncake-{cap}", SimRunSpec(
            trace=str(MOONCAKE), format="mooncake", block_size=32, capacity_blocks=cap,
            algo="fast", limit=MOONCAKE_REQUESTS,
            label=f"Mooncake conversation, first {MOONCAKE_REQUESTS:,} requests, B=32, "
                  f"{cap:,} blocks")))
    for name, layout in (("as-recorded", None), ("date-at-end", "date-at-end.yaml"),
                         ("date-in-first-user", "date-in-first-user.yaml")):
        specs.append((f"aider-{name}", SimRunSpec(
            trace=str(AIDER), format="chat", block_size=16,
            layout_path=str(LAYOUTS / layout) if layout else None,
            label=f"aider chats, layout {name}")))
    return specs


def run_demo_replays(db_path: str, out_dir: str) -> str:
    """Make the demo replay runs into ``out_dir`` and ingest them into ``db_path``.

    All runs of one trace share one time placement (trace time 0 at the same Unix time), so
    they line up on the time-based pages.

    Returns:
        A one-line summary (runs, requests, seconds) for the demo report.

    Raises:
        PrefixscopeError subclasses from the readers, the simulator or the store.
    """
    started = time.monotonic()
    out = Path(out_dir)
    t0: dict[str, float] = {}
    done = []
    for name, spec in demo_specs():
        res = run_sim(spec, out / name, run_id=f"demo-{name}", t0_unix_s=t0.get(spec.trace))
        t0.setdefault(spec.trace, res.t0_unix_s)
        done.append(res)
    with store_db.writer(db_path) as con:
        for res in done:
            ingest_run_dir(con, res.out_dir)
    rates = ", ".join(f"{r.run_id.removeprefix('demo-')} {r.summary.hit_rate:.1%}" for r in done)
    return (f"{len(done)} runs, {sum(r.summary.requests for r in done):,} requests "
            f"({rates}) in {time.monotonic() - started:.0f} s")


#: The demo fleet: replicas, policies (in the order the Miss ledger page shows them), run id.
FLEET_INSTANCES = 3
FLEET_ROUTERS = "round-robin,longest-prefix"
FLEET_RUN_ID = "demo-fleet-aider"
FLEET_LABEL = f"aider chats on {FLEET_INSTANCES} replicas: round robin vs longest-prefix"


def run_demo_fleet(db_path: str, out_dir: str) -> str:
    """Replay the aider chats through a fleet of :data:`FLEET_INSTANCES` exact cache models
    (block size 16, unbounded) under :data:`FLEET_ROUTERS` and store each policy's miss ledger
    in ``db_path`` as run :data:`FLEET_RUN_ID` (``ledger.json`` in ``out_dir``).

    Returns:
        A one-line summary for the demo report (hit rates, routing's share of the missed
        tokens under round robin, ledger rows).

    Raises:
        PrefixscopeError subclasses from the reader, the simulator or the store.
    """
    from prefixscope.cli.commands.replay_fleet import ingest_fleet
    from prefixscope.replay.fleet_run import run_fleet

    started = time.monotonic()
    spec = SimRunSpec(trace=str(AIDER), format="chat", block_size=16, label=FLEET_LABEL)
    report = run_fleet(spec, instances=FLEET_INSTANCES, routers=FLEET_ROUTERS, group=True)
    ing = ingest_fleet(report, db=db_path, out_dir=Path(out_dir), label=FLEET_LABEL,
                       run_id=FLEET_RUN_ID)
    rr, best = report.results
    share = rr.ledger.share_of_missed("routing") or 0.0
    return (f"{FLEET_INSTANCES} replicas, round-robin {rr.hit_rate or 0:.1%} (routing "
            f"{share:.1%} of missed), {best.router} {best.hit_rate or 0:.1%}; "
            f"{ing['ledger_rows_added']} ledger rows in {time.monotonic() - started:.1f} s")
