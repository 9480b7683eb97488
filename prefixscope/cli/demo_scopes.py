"""Replay a multi-tenant trace through the gateway model and load it like production traffic.

:func:`run_gateway_replay` is what ``prefixscope replay gateway`` calls, and
:func:`run_demo_scopes` is what ``prefixscope demo`` calls for the bundled trace. Both write the
same files production would give prefixscope, then load them through the normal ingest path
(``docs/architecture.md``: nothing is written around it):

- ``decisions.jsonl``: the gateway decision log (``docs/scopes.md#decision-log``) ->
  ``prefixscope.ingest.decisions.ingest_decisions_file``;
- ``requests.jsonl``: one usage record per request, with ``scope`` and ``tenant_digest``
  (``prefixscope.replay.outputs.write_usage_jsonl``) -> ``prefixscope.ingest.usage.ingest_usage_file``;
- ``metrics/engine-N/metrics-*.prom``: vLLM ``/metrics`` expositions, one folder per engine
  lifetime (a restart, model, tokenizer or runtime upgrade starts a new engine whose counters
  start from 0) -> ``prefixscope.ingest.exposition.ingest_exposition`` under one instance name;
- ``summary.json``: the run's totals (no raw ids).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from prefixscope.core.paths import data_file
from prefixscope.store import db as store_db

DEMO_TRACE = data_file("multitenant", "trace.jsonl")
DEMO_RUN_ID = "demo-scopes"


@dataclass(frozen=True, slots=True)
class GatewayRunReport:
    """What one gateway replay produced.

    Attributes:
        run_id: the run id of every decision and usage row.
        requests: requests replayed; ``accepts``/``rejects``/``misses`` by decision.
        prompt_tokens, cached_tokens, accepted_cached_tokens: tokens over the run.
        hit_rate: cached / prompt tokens (fraction), None without prompt tokens.
        engine_lifetimes: engines simulated (1 + restarts).
        out_dir: where the files are.
        rows_added: rows the ingest added (decisions + events, requests, metric samples).
        counter_prompt_tokens, counter_cached_tokens: what vLLM's counters count of the run
            (queries, hits): requests sent with ``skip_reading_prefix_cache`` (rejected) left
            out.
        uncounted_requests, uncounted_prompt_tokens: those left out (docs/metrics.md
            "Counters and per-request figures").
    """

    run_id: str
    requests: int
    accepts: int
    rejects: int
    misses: int
    prompt_tokens: int
    cached_tokens: int
    accepted_cached_tokens: int
    hit_rate: float | None
    engine_lifetimes: int
    out_dir: str
    rows_added: dict[str, int]
    counter_prompt_tokens: int = 0
    counter_cached_tokens: int = 0
    uncounted_requests: int = 0
    uncounted_prompt_tokens: int = 0

    def as_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return asdict(self)

    def __str__(self) -> str:
        rate = "n/a" if self.hit_rate is None else f"{self.hit_rate:.1%}"
        return (f"{self.requests} requests ({self.accepts} accepted, {self.rejects} rejected, "
                f"{self.misses} without candidate), {self.cached_tokens:,} of "
                f"{self.prompt_tokens:,} prompt tokens from cache ({rate}), "
                f"{self.engine_lifetimes} engine lifetimes")

    def uncounted_note(self) -> str | None:
        """Both figures and why they differ (None when no request was left out)."""
        from prefixscope.core.report import uncounted_note

        return uncounted_note(self.uncounted_requests, self.uncounted_prompt_tokens,
                              counters_hit=self.counter_cached_tokens,
                              counters_query=self.counter_prompt_tokens,
                              per_request_cached=self.cached_tokens,
                              per_request_prompt=self.prompt_tokens)


def write_gateway_outputs(replay, out_dir: str | os.PathLike[str], *, run_id: str,
                          instance: str) -> dict[str, object]:
    """Write decision log, usage JSONL and expositions of a :class:`GatewayReplay`.

    Returns:
        ``{"decisions": path, "requests": path, "expositions": [(path, at_unix_s), ...]}``.
    """
    from prefixscope.replay.gateway_replay import write_decision_log
    from prefixscope.replay.outputs import event_of, write_exposition, write_usage_jsonl

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = _trace_t0(replay)
    dec_path = out / "decisions.jsonl"
    write_decision_log(replay, dec_path)
    req_path = out / "requests.jsonl"
    model = replay.decisions[0].model if replay.decisions else "unknown"
    write_usage_jsonl(replay.results, req_path, run_id=run_id, model=model, instance=instance,
                      t0_unix_s=t0, endpoint="chat")
    expositions: list[tuple[Path, float]] = []
    for i, (reqs, results) in enumerate(replay.segments, start=1):
        start_s = min(r.arrival_s for r in reqs)
        events = []
        for r in results:
            if r.rejected_reason is not None:
                continue
            e = event_of(r)
            events.append(type(e)(e.admitted_s - start_s, e.finished_s - start_s,
                                  e.prompt_tokens, e.cached_tokens, e.completion_tokens,
                                  e.counted, e.num_preemptions))
        expositions += write_exposition(events, out / "metrics" / f"engine-{i}", model=model,
                                        config=replay.config, t0_unix_s=t0 + start_s)
    return {"decisions": dec_path, "requests": req_path, "expositions": expositions}


def _trace_t0(replay) -> float:
    # decision ts = t0 + arrival_s (replay/gateway.py); recover t0 from the first request
    if not replay.decisions or not replay.segments:
        return 0.0
    first = replay.segments[0][0][0]
    by_id = {d.request_id: d for d in replay.decisions}
    return by_id[first.request_id].ts_unix_s - first.arrival_s


def run_gateway_replay(trace_path: str | os.PathLike[str], *, db_path: str | None,
                       out_dir: str | os.PathLike[str], key: bytes, run_id: str,
                       instance: str = "gateway-replay", num_gpu_blocks: int | None = None,
                       label: str | None = None,
                       inventory_path: str | os.PathLike[str] | None = None) -> GatewayRunReport:
    """Replay ``trace_path`` through the gateway + simulator, write the files, ingest them.

    Args:
        trace_path: a ``prefixscope-multitenant/v1`` trace (``docs/scopes.md#trace``).
        db_path: DuckDB file to load the outputs into; None writes the files only.
        out_dir: folder for ``decisions.jsonl``, ``requests.jsonl``, ``metrics/``,
            ``summary.json``.
        key: the server-side HMAC key.
        run_id: run id of the replay (decisions and usage rows join on it).
        instance: instance name of the simulated engine.
        num_gpu_blocks: override the trace header's cache size (blocks, incl. the null block).
        inventory_path: approved public inventory file (default: the trace header's).

    Returns:
        A :class:`GatewayRunReport`.

    Raises:
        SourceUnavailable, ParseError: unreadable or invalid trace.
        SimulationError: a configuration the simulator cannot model.
        StoreLocked: the database stayed locked.
    """
    from prefixscope.replay.gateway_replay import replay_gateway_trace
    from prefixscope.replay.gateway_trace import read_multitenant_trace
    from prefixscope.replay.types import SimConfig

    trace = read_multitenant_trace(trace_path)
    cfg = SimConfig(block_size=trace.header.block_size,
                    num_gpu_blocks=num_gpu_blocks if num_gpu_blocks is not None
                    else trace.header.num_gpu_blocks)
    inventory = None
    if inventory_path is not None:
        from prefixscope.core.identity import PublicInventory

        inventory = PublicInventory.from_file(inventory_path)
    replay = replay_gateway_trace(trace, key=key, run_id=run_id, instance=instance,
                                  sim_config=cfg, inventory=inventory)
    files = write_gateway_outputs(replay, out_dir, run_id=run_id, instance=instance)
    results = {r.request_id: r for r in replay.results}
    prompt = sum(r.prompt_tokens for r in results.values() if r.rejected_reason is None)
    cached = sum(r.cached_tokens for r in results.values() if r.rejected_reason is None)
    counted = [r for r in results.values() if r.rejected_reason is None and r.counted]
    uncounted = [r for r in results.values() if r.rejected_reason is None and not r.counted]
    counts = {k: sum(1 for d in replay.decisions if d.decision == k)
              for k in ("accept", "reject", "miss")}
    rows: dict[str, int] = {}
    if db_path is not None:
        from prefixscope.ingest.decisions import ingest_decisions_file
        from prefixscope.ingest.exposition import ingest_exposition
        from prefixscope.ingest.usage import ingest_usage_file
        from prefixscope.store.queries.scopes import record_replay_run

        with store_db.writer(db_path) as con:
            rows["decisions"] = ingest_decisions_file(con, files["decisions"]).rows_added
            rows["requests"] = ingest_usage_file(con, str(files["requests"]),
                                                 run_id=run_id).rows_added
            rows["metric_samples"] = sum(
                ingest_exposition(con, str(p), instance=instance, at_unix_s=at,
                                  run_id=run_id, label_key=key).rows_added
                for p, at in files["expositions"])
            record_replay_run(con, run_id=run_id, label=label or f"gateway replay of "
                              f"{Path(trace_path).name}", params={
                                  "trace": Path(trace_path).name, "mode": "gateway",
                                  "block_size": cfg.block_size,
                                  "num_gpu_blocks": cfg.num_gpu_blocks,
                                  "hash_algo": cfg.hash_algo})
    report = GatewayRunReport(
        run_id=run_id, requests=len(replay.decisions), accepts=counts["accept"],
        rejects=counts["reject"], misses=counts["miss"], prompt_tokens=prompt,
        cached_tokens=cached,
        accepted_cached_tokens=sum(d.accepted_cached_tokens for d in replay.decisions),
        hit_rate=cached / prompt if prompt else None, engine_lifetimes=len(replay.segments),
        out_dir=str(out_dir), rows_added=rows,
        counter_prompt_tokens=sum(r.prompt_tokens for r in counted),
        counter_cached_tokens=sum(r.cached_tokens for r in counted),
        uncounted_requests=len(uncounted),
        uncounted_prompt_tokens=sum(r.prompt_tokens for r in uncounted))
    Path(out_dir, "summary.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n",
                                             encoding="utf-8")
    return report


def run_demo_scopes(db_path: str, out_dir: str, *, key: bytes | None = None) -> GatewayRunReport:
    """The multi-tenant scope demo: replay ``data/multitenant/trace.jsonl`` (run id
    ``demo-scopes``) into ``db_path``, files in ``out_dir``.

    The HMAC key is the configured one (``PREFIXSCOPE_HMAC_KEY_FILE`` ...) when present, else a
    fresh random key that lives only in this process: digests stay consistent within the demo
    and nothing secret is written anywhere.
    """
    if key is None:
        from prefixscope.core.errors import ConfigError
        from prefixscope.core.identity import load_hmac_key

        try:
            key = load_hmac_key()
        except ConfigError:
            key = secrets.token_bytes(32)
    return run_gateway_replay(DEMO_TRACE, db_path=db_path, out_dir=out_dir, key=key,
                              run_id=DEMO_RUN_ID, label="multi-tenant scope demo")
