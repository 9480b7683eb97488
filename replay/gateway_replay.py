"""A whole multi-tenant trace through the gateway model and the exact cache simulator
(:func:`replay_gateway_trace`), and the decision log it writes (:func:`write_decision_log`,
``docs/scopes.md#decision-log``).

Pure: no DuckDB, no HTTP.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefixscope.replay.gateway import DecisionRecord, Faults, Gateway
from prefixscope.replay.gateway_trace import RESTART_EVENTS, MultiTenantTrace, VersionEvent
from prefixscope.core.identity import PublicInventory
from prefixscope.replay.types import RequestResult, SimConfig, TraceRequest


@dataclass
class GatewayReplay:
    """Outcome of :func:`replay_gateway_trace`.

    Attributes:
        decisions: one record per request, trace order.
        events: decision-log event records, time order.
        segments: per engine lifetime (between restarts): its trace requests and the simulator's
            results for them (trace order for sequential replay).
        config: the simulator configuration used.
    """

    decisions: list[DecisionRecord]
    events: list[dict[str, Any]]
    segments: list[tuple[list[TraceRequest], list[RequestResult]]]
    config: SimConfig

    @property
    def results(self) -> list[RequestResult]:
        """All simulator results, segment after segment."""
        return [r for _, res in self.segments for r in res]

    def decision_lines(self) -> Iterator[dict[str, Any]]:
        """Decision-log records (decisions and events) in time order."""
        recs = [d.as_json() for d in self.decisions] + list(self.events)
        recs.sort(key=lambda r: (r["ts_unix_s"], 0 if r["record"] == "event" else 1))
        return iter(recs)


def replay_gateway_trace(trace: MultiTenantTrace, *, key: bytes, run_id: str | None = None,
                         instance: str | None = "gateway-replay",
                         sim_config: SimConfig | None = None, faults: Faults | None = None,
                         inventory: PublicInventory | None = None,
                         simulate: Callable[[Iterable[TraceRequest], SimConfig],
                                            Iterable[RequestResult]] | None = None
                         ) -> GatewayReplay:
    """Replay a multi-tenant trace through the gateway and the exact cache simulator.

    Args:
        trace: from :func:`read_multitenant_trace`.
        key: the HMAC key.
        run_id: copied into every decision and event record.
        sim_config: default: the header's block size and ``num_gpu_blocks``, sequential, sha256.
        faults: failure injection (tests only).
        simulate: the simulator (default ``prefixscope.replay.sim.simulate``).

    Returns:
        A :class:`GatewayReplay`; each engine lifetime (see :data:`RESTART_EVENTS`) was
        simulated from an empty cache.
    """
    if simulate is None:
        from prefixscope.replay.sim import simulate as simulate  # noqa: PLW0127
    cfg = sim_config or SimConfig(block_size=trace.header.block_size,
                                  num_gpu_blocks=trace.header.num_gpu_blocks)
    if cfg.block_size != trace.header.block_size:
        cfg = replace(cfg, block_size=trace.header.block_size)
    gw = Gateway(key, trace.header, base_dir=trace.base_dir, inventory=inventory, faults=faults,
                 run_id=run_id, instance=instance)
    decisions: list[DecisionRecord] = []
    events: list[dict[str, Any]] = []
    lifetimes: list[list[TraceRequest]] = [[]]
    for item in trace.items:
        if isinstance(item, VersionEvent):
            events.append(gw.apply_event(item))
            if item.event in RESTART_EVENTS and lifetimes[-1]:
                lifetimes.append([])
            continue
        routed = gw.route(item)
        decisions.append(routed.decision)
        lifetimes[-1].append(routed.trace_request)
    segments = []
    for reqs in lifetimes:
        if reqs:
            segments.append((reqs, list(simulate(reqs, cfg, read_ahead=True))))
    return GatewayReplay(decisions, events, segments, cfg)


def write_decision_log(replay: GatewayReplay, path: str | os.PathLike[str]) -> int:
    """Write the decision log JSONL (decisions and events, time order); returns lines written."""
    n = 0
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for rec in replay.decision_lines():
            fh.write(json.dumps(rec, separators=(",", ":"), sort_keys=False) + "\n")
            n += 1
    return n
