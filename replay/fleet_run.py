"""``replay fleet`` as a library call: one trace, several routing policies side by side.

:func:`run_fleet` replays the trace of a :class:`~replay.runner.SimRunSpec` (the trace and cache
options ``replay sim`` takes) once per policy through :func:`replay.fleet.replay_fleet` and
returns a :class:`FleetReport`. Pure computation: no files written, no DuckDB.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefixscope.core.errors import UsageError
from prefixscope.replay.fleet import DEFAULT_ROUTER_PARAMS, FleetResult, RouterParams, replay_fleet
from prefixscope.replay.ledger_store import PolicyLedger, policy_ledger, write_ledger_file
from prefixscope.replay.routers import ROUTERS
from prefixscope.replay.runner import SimRunSpec
from prefixscope.replay.trace_common import TraceProblem
from prefixscope.replay.traces import read_trace

#: Trace records skipped that a report lists by name (all are counted).
MAX_LISTED_PROBLEMS = 20


@dataclass
class FleetReport:
    """Every policy's :class:`FleetResult` for one trace and fleet.

    Attributes:
        spec: the trace and cache options (``capacity_blocks`` is per instance).
        instances: N (for ``recorded``: the number of instance names in the trace).
        results: one per policy, in the order asked.
        problems: trace records skipped (from the first policy's pass; every pass reads the
            same records).
        format: the trace format read.
        ledgers: each policy's ledger per (model, instance, day, scope), same order as
            ``results`` (only when :func:`run_fleet` was asked to ``group``; else empty).
    """

    spec: SimRunSpec
    instances: int
    params: RouterParams
    results: list[FleetResult] = field(default_factory=list)
    problems: list[TraceProblem] = field(default_factory=list)
    format: str | None = None
    ledgers: list[PolicyLedger] = field(default_factory=list)

    def write_ledger(self, path: Any, *, run_id: str, label: str | None = None,
                     model: str | None = None) -> Any:
        """Write the grouped ledgers as ``ledger.json`` (``replay.ledger_store``; run kind
        ``replay-fleet``, policies in the order asked) for ``prefixscope.ingest.ledger``;
        returns its path. ``model`` replaces each request's model in the rows.

        Raises:
            ValueError: the report was made without ``group=True``.
        """
        if len(self.ledgers) != len(self.results):
            raise ValueError("run_fleet(..., group=True) keeps the ledger per group")
        s = self.spec
        return write_ledger_file(path, self.ledgers, run_id=run_id, run_kind="replay-fleet",
                                 label=label, block_size=s.block_size,
                                 capacity_blocks=s.capacity_blocks, model=model,
                                 trace=s.trace)

    def as_dict(self) -> dict[str, Any]:
        """The ``replay fleet --json`` document (docs/replay.md, "Fleet replay")."""
        s = self.spec
        return {
            "trace": s.trace, "format": self.format, "instances": self.instances,
            "block_size": s.block_size, "capacity_blocks": s.capacity_blocks,
            "hash_algo": s.algo, "model": "sequential",
            "router_params": {"seed": self.params.seed, "hash_blocks": self.params.hash_blocks,
                              "load_factor": self.params.load_factor,
                              "load_window_s": self.params.load_window_s},
            "skipped_records": len(self.problems),
            "policies": [r.as_dict() for r in self.results],
        }


def parse_routers(text: str | None, *, has_instances: bool) -> list[str]:
    """The policies of ``--router`` (comma-separated; None = every policy, ``recorded`` only
    when the trace names instances).

    Raises:
        UsageError: an unknown name, or ``recorded`` for a trace without instances.
    """
    if text is None:
        return [r for r in ROUTERS if r != "recorded" or has_instances]
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ROUTERS]
    if bad or not names:
        raise UsageError(f"--router: unknown policy {', '.join(bad) or '(none)'}; choose from "
                         f"{', '.join(ROUTERS)}")
    if "recorded" in names and not has_instances:
        raise UsageError("--router recorded: the trace's first request names no instance "
                         "(an 'instance' field in token-ids and chat traces)")
    return list(dict.fromkeys(names))


def _read(spec: SimRunSpec):
    from prefixscope.replay.layouts import load_layout

    layout = load_layout(spec.layout_path) if spec.layout_path else None
    return read_trace(spec.trace, format=spec.format, hash_id_block_size=spec.hash_id_block_size,
                      block_size=spec.block_size, tokenizer_dir=spec.tokenizer_dir,
                      output_tokens=spec.output_tokens, strict=spec.strict, layout=layout,
                      limit=spec.limit)


def trace_instances(spec: SimRunSpec) -> list[str] | None:
    """The instance names of the trace in order of first appearance, or None when its first
    request names none (reads the whole trace only in that case)."""
    it = _read(spec).requests
    first = next(it, None)
    if first is None or not first.attrs.get("instance"):
        return None
    names = {first.attrs["instance"]: None}
    for tr in it:
        name = tr.attrs.get("instance")
        if name:
            names.setdefault(name, None)
    return list(names)


def run_fleet(spec: SimRunSpec, *, instances: int, routers: str | None = None,
              params: RouterParams = DEFAULT_ROUTER_PARAMS, group: bool = False) -> FleetReport:
    """Replay ``spec``'s trace through ``instances`` cache models once per policy.

    Args:
        spec: trace and cache options (``capacity_blocks``: each instance's ``num_gpu_blocks``;
            sequential: ``concurrency`` must be None).
        instances: N >= 1 (the ``recorded`` policy uses the trace's own instances).
        routers: ``--router``'s text (comma-separated policy names), None = all.
        params: router settings.
        group: also keep each policy's ledger per (model, instance, day, scope)
            (``FleetReport.ledgers``, what ``--ingest`` stores).

    Returns:
        :class:`FleetReport`.

    Raises:
        UsageError: bad options; SourceUnavailable, ParseError, ConfigError: from the trace
        reader; SimulationError: from the replay.
    """
    if instances < 1:
        raise UsageError("--instances must be >= 1")
    if spec.concurrency is not None:
        raise UsageError("replay fleet is sequential: no --concurrency")
    recorded = trace_instances(spec)
    names = parse_routers(routers, has_instances=recorded is not None)
    report = FleetReport(spec=spec, instances=instances, params=params)
    config = spec.sim_config()
    for k, name in enumerate(names):
        started = time.time()
        read = _read(spec)
        inst_names = recorded if name == "recorded" else None
        run = replay_fleet(read.requests, config, instances=instances, router=name,
                           params=params, instance_names=inst_names)
        if group:
            n = len(inst_names) if inst_names else instances
            report.ledgers.append(policy_ledger(name, n, run))
            res = run.result
        else:
            res = run.run()
        res.seconds = time.time() - started
        report.results.append(res)
        if k == 0:
            report.problems = list(read.problems)
            report.format = read.format
    return report


def run_capacity(spec: SimRunSpec, sizes: list[int], *, jobs: int | None = None
                 ) -> dict[str, Any]:
    """``replay capacity`` as a call: hash ``spec``'s trace once, sweep ``sizes``
    (``num_gpu_blocks`` each) with LRU and Belady's MIN (:mod:`prefixscope.replay.belady`).

    Returns:
        ``{"trace", "format", "block_size", "hash_algo", "requests", "skipped_records",
        "rows": [CapacityRow.as_dict()...], "seconds", "problems"}`` (``problems``: the skipped
        trace records, for the caller to print; not JSON).

    Raises:
        UsageError: ``--concurrency`` (the sweep is sequential); the trace reader's and the
        simulator's errors.
    """
    from prefixscope.replay.belady import capacity_sweep, collect_accesses

    if spec.concurrency is not None:
        raise UsageError("replay capacity is sequential: no --concurrency")
    started = time.time()
    read = _read(spec)
    acc = collect_accesses(read.requests, spec.sim_config())
    rows = capacity_sweep(acc, sizes, jobs=jobs)
    return {"trace": spec.trace, "format": read.format, "block_size": spec.block_size,
            "hash_algo": spec.algo, "requests": len(acc) + acc.rejected,
            "skipped_records": len(read.problems), "rows": [r.as_dict() for r in rows],
            "seconds": round(time.time() - started, 3), "problems": list(read.problems)}
