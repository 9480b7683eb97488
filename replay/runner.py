"""One simulated replay run, from a trace file to output files (pure: no DuckDB, no HTTP).

:func:`run_sim` reads the trace (``replay/traces.py``), optionally applies a prompt layout
(``replay/layouts.py``), replays it through the exact cache model (``replay/sim.py``) and writes,
into one run directory:

- ``requests.jsonl``: per-request usage records (``replay/outputs.py``),
- ``metrics/metrics-NNNNNN.prom``: vLLM ``/metrics`` snapshots over the simulated time span,
- ``run.json``: the manifest: run id, label, parameters, summary, skipped trace records,
  rejected requests and the list of output files with their times.

``ingest/runs.py`` ingests such a directory through the normal ingest functions and registers
the run in the ``runs`` table.

Time placement: trace time 0 is put at ``t0_unix_s``; by default the run is placed so that its
last request arrives (sequential) or finishes (step model) one second before the run was made,
so a fresh run shows up in the dashboard's recent time ranges.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefixscope.core.errors import UsageError
from prefixscope.core.paths import RUN_MANIFEST
from prefixscope.replay.run_ids import default_run_dir, new_run_id
from prefixscope.replay.layouts import Layout, load_layout
from prefixscope.replay.outputs import MAX_SNAPSHOTS, SNAPSHOT_EVERY_S, UsageWriter, write_exposition
from prefixscope.replay.sim import SimSummary, simulate
from prefixscope.replay.traces import TraceProblem, read_trace
from prefixscope.replay.types import ConcurrencyConfig, SimConfig

KIND = "replay-sim"
MANIFEST = RUN_MANIFEST  # the run directory's manifest (read back by prefixscope.ingest.runs)
#: Problems (skipped trace records) listed by name in the manifest; all are counted.
MAX_LISTED_PROBLEMS = 100
DEFAULT_MODEL = "replay-sim"
#: Layout name of requests replayed as recorded.
AS_RECORDED = "as-recorded"


@dataclass(frozen=True)
class SimRunSpec:
    """Everything a simulated run depends on (recorded as the run's parameters).

    Attributes:
        trace: trace file or directory.
        format: trace format (``prefixscope.replay.traces.FORMATS``).
        block_size: engine block size in tokens.
        capacity_blocks: vLLM ``num_gpu_blocks`` including the null block; None = unbounded.
        algo: block hash algorithm (``sha256``, ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``,
            ``fast``).
        hash_id_block_size: tokens per hash id (Mooncake 512, Bailian 16).
        output_tokens: ``trace`` or ``0``.
        concurrency: None for sequential replay, else the step model's settings.
        max_model_len: vLLM ``--max-model-len`` (tokens) or None.
        tokenizer_dir: tokenizer for chat traces (None: the bundled one).
        layout_path: layout file for chat traces (None: as recorded).
        limit: replay only the first N requests.
        label: a short name for the run (dashboards show it).
        model: the ``model`` of the usage records and the ``model_name`` label (default
            ``replay-sim``); name the model whose price the run should be costed at.
        hash_seed: plays PYTHONHASHSEED for the vLLM hash algorithms.
        strict: stop at the first malformed trace record.
    """

    trace: str
    format: str = "auto"
    block_size: int = 16
    capacity_blocks: int | None = None
    algo: str = "sha256"
    hash_id_block_size: int = 512
    output_tokens: str = "trace"
    concurrency: ConcurrencyConfig | None = None
    max_model_len: int | None = None
    tokenizer_dir: str | None = None
    layout_path: str | None = None
    limit: int | None = None
    label: str | None = None
    model: str | None = None
    hash_seed: str | None = None
    strict: bool = False

    def sim_config(self) -> SimConfig:
        """The simulator configuration of this spec."""
        return SimConfig(block_size=self.block_size, num_gpu_blocks=self.capacity_blocks,
                         hash_algo=self.algo, hash_seed=self.hash_seed,
                         simulate_output=self.output_tokens == "trace",
                         concurrency=self.concurrency, max_model_len=self.max_model_len)

    def params(self) -> dict[str, Any]:
        """JSON-ready parameters (what ``runs.params_json`` stores)."""
        d = asdict(self)
        d["concurrency"] = None if self.concurrency is None else asdict(self.concurrency)
        return d


@dataclass
class SimRunResult:
    """What :func:`run_sim` produced.

    Attributes:
        run_id, label, kind: the run's identity (``kind`` = ``replay-sim``).
        out_dir: the run directory; ``usage_path``, ``metrics`` (path, Unix time) inside it.
        summary: the simulator's totals.
        problems: skipped trace records (all of them; the manifest lists the first 100).
        instance, model: as written in the outputs.
        t0_unix_s: Unix time of trace time 0.
        created_unix_s: when the run was made.
        layout: layout name, or None.
        format: the trace format read (resolved when ``auto``).
        seconds: wall time of the run.
    """

    run_id: str
    label: str
    kind: str
    out_dir: Path
    usage_path: Path
    metrics: list[tuple[Path, float]]
    summary: SimSummary
    problems: list[TraceProblem]
    instance: str
    model: str
    t0_unix_s: float
    created_unix_s: float
    params: dict[str, Any]
    layout: str | None = None
    format: str | None = None
    trace_stats: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def summary_dict(self) -> dict[str, Any]:
        """The JSON summary ``replay sim --json`` prints (tokens; ``hit_rate`` a fraction)."""
        s = self.summary
        return {
            "run_id": self.run_id, "label": self.label, "requests": s.requests,
            "counted_requests": s.counted_requests, "rejected_requests": s.rejected_requests,
            "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens,
            "hit_rate": s.hit_rate, "all_prompt_tokens": s.all_prompt_tokens,
            "created_cache_tokens": s.created_cache_tokens,
            "completion_tokens": s.completion_tokens, "num_preemptions": s.num_preemptions,
            "evicted_blocks": s.evicted_blocks, "block_size": s.block_size,
            "capacity_blocks": s.num_gpu_blocks, "hash_algo": s.hash_algo, "mode": s.mode,
            "format": self.format, "layout": self.layout, "model": self.model,
            "instance": self.instance,
            "skipped_records": len(self.problems),
            "rejected": [{"request_id": i, "reason": r} for i, r in s.rejected],
            "out_dir": str(self.out_dir), "t0_unix_s": self.t0_unix_s,
            "seconds": round(self.seconds, 3),
        }


def run_sim(spec: SimRunSpec, out_dir: str | os.PathLike[str] | None = None, *,
            run_id: str | None = None, t0_unix_s: float | None = None,
            snapshot_every_s: float = SNAPSHOT_EVERY_S,
            max_snapshots: int = MAX_SNAPSHOTS) -> SimRunResult:
    """Replay ``spec.trace`` through the cache model and write the run directory.

    Args:
        spec: what to replay and how.
        out_dir: the run directory (default ``out/replay/<run_id>``); created, and files of an
            earlier run there are replaced.
        run_id: the run's id (default :func:`prefixscope.replay.run_ids.new_run_id`).
        t0_unix_s: Unix time of trace time 0 (default: the run ends one second before now).
        snapshot_every_s, max_snapshots: exposition snapshot spacing (simulated seconds) and cap.

    Returns:
        :class:`SimRunResult`.

    Raises:
        SourceUnavailable, UsageError, ParseError (strict), ConfigError: from the trace reader
        and layout loader; SimulationError: from the simulator.
    """
    started = time.time()
    layout: Layout | None = load_layout(spec.layout_path) if spec.layout_path else None
    if spec.capacity_blocks is not None and spec.capacity_blocks < 2:
        raise UsageError("--capacity-blocks must be at least 2 (block 0 is vLLM's null block)")
    label = spec.label or _default_label(spec, layout)
    rid = run_id or new_run_id("sim", label, now_unix_s=started)
    out = Path(out_dir) if out_dir is not None else default_run_dir(rid)
    read = read_trace(spec.trace, format=spec.format, hash_id_block_size=spec.hash_id_block_size,
                      block_size=spec.block_size, tokenizer_dir=spec.tokenizer_dir,
                      output_tokens=spec.output_tokens, strict=spec.strict, layout=layout,
                      limit=spec.limit)
    config = spec.sim_config()
    run = simulate(read.requests, config, read_ahead=True)  # consumed whole: batches
    out.mkdir(parents=True, exist_ok=True)
    metrics_dir = out / "metrics"
    if metrics_dir.is_dir():
        for old in metrics_dir.glob("metrics-*.prom"):
            old.unlink()
    usage_tmp = out / "requests.jsonl.part"
    model = spec.model or DEFAULT_MODEL
    endpoint = "chat" if read.format == "chat" else "completions"
    # t0 is known only at the end (default placement): write with t0 = 0, then shift.
    with UsageWriter(usage_tmp, run_id=rid, model=model, instance=rid, t0_unix_s=0.0,
                     endpoint=endpoint) as writer:
        for result in run:
            writer.add(result)
    summary = run.summary()
    if t0_unix_s is None:
        end_s = max((e.finished_s for e in writer.events), default=0.0)
        t0_unix_s = float(int(started - end_s - 1.0))
    usage_path = out / "requests.jsonl"
    _shift_usage(usage_tmp, usage_path, t0_unix_s)
    metrics = write_exposition(writer.events, metrics_dir, model=model, config=config,
                               t0_unix_s=t0_unix_s, every_s=snapshot_every_s,
                               max_snapshots=max_snapshots)
    result = SimRunResult(
        run_id=rid, label=label, kind=KIND, out_dir=out, usage_path=usage_path, metrics=metrics,
        summary=summary, problems=list(read.problems), instance=rid, model=model,
        t0_unix_s=t0_unix_s, created_unix_s=started, params=spec.params(),
        layout=layout.name if layout else None, format=read.format,
        trace_stats=dict(read.stats),
        seconds=time.time() - started)
    write_manifest(result)
    return result


def _default_label(spec: SimRunSpec, layout: Layout | None) -> str:
    name = Path(spec.trace).name.split(".")[0] or "trace"
    cap = "unbounded" if spec.capacity_blocks is None else f"{spec.capacity_blocks} blocks"
    parts = [name, f"B={spec.block_size}", cap]
    if layout is not None:
        parts.append(f"layout {layout.name}")
    return ", ".join(parts)


def _shift_usage(src: Path, dst: Path, t0_unix_s: float) -> None:
    with open(src, encoding="utf-8") as fin, open(dst, "w", encoding="utf-8") as fout:
        for line in fin:
            rec = json.loads(line)
            rec["ts_unix_s"] = round(rec["ts_unix_s"] + t0_unix_s, 6)
            fout.write(json.dumps(rec, separators=(",", ":")) + "\n")
    src.unlink()


def write_manifest(result: SimRunResult) -> Path:
    """Write ``run.json`` into the run directory (paths relative to it); returns its path."""
    out = result.out_dir
    doc = {
        "run_id": result.run_id, "label": result.label, "kind": result.kind,
        "created_unix_s": result.created_unix_s, "t0_unix_s": result.t0_unix_s,
        "instance": result.instance, "model": result.model, "layout": result.layout,
        "params": result.params, "summary": result.summary_dict(),
        "trace_stats": result.trace_stats,
        "skipped_records": [asdict(p) for p in result.problems[:MAX_LISTED_PROBLEMS]],
        "files": {
            "usage": result.usage_path.relative_to(out).as_posix(),
            "metrics": [{"path": p.relative_to(out).as_posix(), "at_unix_s": at}
                        for p, at in result.metrics],
        },
    }
    path = out / MANIFEST
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    return path


@dataclass
class CompareResult:
    """Two runs of one trace: ``a`` and ``b`` (see :func:`run_compare`), under ``out_dir``."""

    a: SimRunResult
    b: SimRunResult
    out_dir: Path
    compare_id: str


def run_compare(*, trace: str, layout_a: str | None = None, layout_b: str | None = None,
                capacity_blocks: int | None = None, capacity_blocks_b: int | None = None,
                out_dir: str | os.PathLike[str] | None = None, t0_unix_s: float | None = None,
                label: str | None = None, **spec_fields: Any) -> CompareResult:
    """Replay ``trace`` twice: A (``layout_a``, ``capacity_blocks``) and B (``layout_b``,
    ``capacity_blocks_b`` or the same capacity), into ``out_dir/a`` and ``out_dir/b``.

    Both runs get the same ``t0_unix_s`` (default: A's default placement), so they cover the
    same time span on the dashboard. ``spec_fields`` are the other :class:`SimRunSpec` fields
    (``format``, ``block_size``, ``algo``...).

    Raises:
        UsageError: A and B would be identical (same layout and capacity).
    """
    cap_b = capacity_blocks if capacity_blocks_b is None else capacity_blocks_b
    if layout_a == layout_b and capacity_blocks == cap_b:
        raise UsageError("runs A and B would be identical: give --layout-b (or --layout-a) or "
                         "--capacity-blocks-b")
    started = time.time()
    base = label or Path(trace).name.split(".")[0] or "trace"
    compare_id = new_run_id("compare", base, now_unix_s=started)
    root = Path(out_dir) if out_dir is not None else default_run_dir(compare_id)
    runs: list[SimRunResult] = []
    for side, layout, cap in (("a", layout_a, capacity_blocks), ("b", layout_b, cap_b)):
        lname = load_layout(layout).name if layout else AS_RECORDED
        capname = "unbounded" if cap is None else f"{cap} blocks"
        spec = SimRunSpec(trace=trace, layout_path=layout, capacity_blocks=cap,
                          label=f"{base} {side.upper()}: {lname}, {capname}", **spec_fields)
        t0 = t0_unix_s if not runs else runs[0].t0_unix_s
        runs.append(run_sim(spec, root / side,
                            run_id=new_run_id("sim", f"{base}-{side}", now_unix_s=started),
                            t0_unix_s=t0))
    return CompareResult(a=runs[0], b=runs[1], out_dir=root, compare_id=compare_id)


