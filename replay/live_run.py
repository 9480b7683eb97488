"""Live replay, a whole run: scrape ``/metrics``, send the trace, wait for the counters to
settle, scrape again and write the run directory (``requests.jsonl``, ``failed.jsonl``, both
expositions, ``run.json``), which ``prefixscope.ingest.live_run.ingest_live_run`` stores.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixscope.core.errors import UsageError
from prefixscope.replay.run_ids import new_run_id
from prefixscope.replay.live import LiveConfig, LiveResult, replay_live
from prefixscope.replay.live_metrics import counter_deltas, counter_totals, scrape_metrics, wait_for_counters
from prefixscope.replay.live_outputs import result_to_usage_line, write_token_trace
from prefixscope.replay.types import TraceRequest


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` in [0, 100] of ``values`` (None when empty)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    k = max(0, min(len(vals) - 1, math.ceil(q / 100 * len(vals)) - 1))
    return vals[k]


@dataclass(frozen=True, slots=True)
class LiveRunSummary:
    """What :func:`run_live` did (also written as ``run.json`` in the run directory).

    Attributes:
        run_id: the run id (``requests.run_id`` after ingest).
        out_dir: the run directory (``requests.jsonl``, ``failed.jsonl``, ``metrics_before.prom``,
            ``metrics_after.prom``, ``run.json``).
        instance: the server's scrape instance (host:port).
        model: model name sent.
        requests, failed: requests answered with usage / failed after retries.
        prompt_tokens, cached_tokens: Σ usage over answered requests (cached: those reporting it).
        reported_requests: answered requests whose usage had ``cached_tokens``.
        hit_rate: cached_tokens / prompt_tokens of reporting requests (None when none).
        deltas: run-scoped counter increases (:func:`counter_deltas`), {} without /metrics.
        settled: Δ queries reached Σ prompt_tokens before the after scrape.
        before_ts_unix_s, after_ts_unix_s: scrape times (None without /metrics).
        started_unix_s, finished_unix_s: first send / last answer, Unix seconds.
        ttft_ms_p50, ttft_ms_p90, latency_ms_p50, latency_ms_p90: nearest-rank percentiles.
        params: the replay parameters.
    """

    run_id: str
    out_dir: str
    instance: str
    model: str
    requests: int
    failed: int
    prompt_tokens: int
    cached_tokens: int
    reported_requests: int
    hit_rate: float | None
    deltas: Mapping[str, float]
    settled: bool
    before_ts_unix_s: float | None
    after_ts_unix_s: float | None
    started_unix_s: float
    finished_unix_s: float
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    latency_ms_p50: float | None
    latency_ms_p90: float | None
    params: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def run_live(requests: Iterable[TraceRequest], config: LiveConfig, out_dir: str | Any, *,
             run_id: str | None = None, instance: str | None = None,
             scrape: bool = True, settle_timeout_s: float = 30.0,
             on_result: Callable[[LiveResult], None] | None = None,
             extra_params: Mapping[str, Any] | None = None, record_tokens: bool = False
             ) -> tuple[LiveRunSummary, list[LiveResult]]:
    """Replay ``requests`` against a server and write the run directory.

    Steps: scrape ``/metrics`` (before), send every request (:func:`replay_live`), wait until
    the prefix-cache counters caught up with the run (:func:`wait_for_counters`, at most
    ``settle_timeout_s``), scrape again (after), then write ``requests.jsonl`` (answered
    requests, :func:`result_to_usage_line`, the shape ``prefixscope ingest requests`` reads),
    ``failed.jsonl`` (failures: trace request id, attempts, status, reason), both expositions
    and ``run.json`` (:class:`LiveRunSummary`). Ingest the directory with
    ``prefixscope.ingest.live_run.ingest_live_run``.

    With other traffic on the server the deltas include it; the counters are server-wide.

    Args:
        requests: the trace, in trace order.
        config: see :class:`LiveConfig`.
        out_dir: directory to create (must not hold a previous run).
        run_id: default :func:`prefixscope.replay.run_ids.new_run_id` (``live``).
        instance: the scrape instance name (default host:port of ``base_url``).
        scrape: read ``/metrics`` before and after (False for servers without it).
        settle_timeout_s: seconds to wait for the counters after the last answer.
        on_result: progress callback, once per finished request.
        extra_params: stored in ``run.json`` ``params`` (e.g. the trace path and format).
        record_tokens: also write ``trace.jsonl``: the traffic exactly as sent, in the
            ``token-ids`` trace format (prompt ids, real output ids, salt, send order), for
            ``prefixscope replay sim``. It holds the prompts as token ids: keep it private.

    Returns:
        (summary, results in completion order).

    Raises:
        UsageError: ``out_dir`` already holds a ``run.json``.
        SourceUnavailable: the server (or its /metrics) cannot be reached.
    """
    from pathlib import Path
    from urllib.parse import urlsplit

    out = Path(out_dir)
    if (out / "run.json").exists():
        raise UsageError(f"{out} already holds a run (run.json): choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    run_id = run_id or new_run_id("live")
    if instance is None:
        parts = urlsplit(config.base_url)
        instance = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    before_text = after_text = None
    before_ts = after_ts = None
    if scrape:
        before_text, before_ts = scrape_metrics(config.base_url, api_key=config.api_key)
    started = time.time()
    results = replay_live(requests, config, on_result=on_result)
    finished = time.time()
    ok = [r for r in results if r.ok]
    prompt_sum = sum(r.prompt_tokens or 0 for r in ok)
    settled = False
    deltas: dict[str, float] = {}
    if scrape:
        after_text, after_ts, settled = wait_for_counters(
            config.base_url, before_text, prompt_tokens=prompt_sum, timeout_s=settle_timeout_s,
            api_key=config.api_key)
        deltas = counter_deltas(before_text, after_text, before_ts_unix_s=before_ts,
                                after_ts_unix_s=after_ts)
        (out / "metrics_before.prom").write_text(before_text)
        (out / "metrics_after.prom").write_text(after_text)
    with open(out / "requests.jsonl", "w") as f:
        for r in sorted(ok, key=lambda r: r.sent_unix_s):
            f.write(json.dumps(result_to_usage_line(r, run_id=run_id, instance=instance)) + "\n")
    with open(out / "failed.jsonl", "w") as f:
        for r in results:
            if not r.ok:
                f.write(json.dumps({"run_id": run_id, "trace_request_id": r.request_id,
                                    "attempts": r.attempts, "http_status": r.http_status,
                                    "error": r.error, "ts_unix_s": r.sent_unix_s}) + "\n")
    if record_tokens:
        write_token_trace(results, out / "trace.jsonl")
    reporting = [r for r in ok if r.cached_tokens is not None]
    rep_prompt = sum(r.prompt_tokens or 0 for r in reporting)
    cached_sum = sum(r.cached_tokens or 0 for r in reporting)
    params = {
        "base_url": config.base_url, "endpoint": config.endpoint, "model": results[0].model
        if results else config.model, "concurrency": config.concurrency,
        "rate_from_trace": config.rate_from_trace, "speedup": config.speedup,
        "salt_per_tenant": config.salt_per_tenant, "fixed_output": config.fixed_output,
        "stream": config.stream, "settle_timeout_s": settle_timeout_s,
        **(dict(extra_params or {})),
    }
    summary = LiveRunSummary(
        run_id=run_id, out_dir=str(out), instance=instance,
        model=(results[0].model if results else (config.model or "")),
        requests=len(ok), failed=len(results) - len(ok), prompt_tokens=prompt_sum,
        cached_tokens=cached_sum, reported_requests=len(reporting),
        hit_rate=(cached_sum / rep_prompt) if rep_prompt else None, deltas=deltas,
        settled=settled, before_ts_unix_s=before_ts, after_ts_unix_s=after_ts,
        started_unix_s=started, finished_unix_s=finished,
        ttft_ms_p50=percentile([r.ttft_ms for r in ok if r.ttft_ms is not None], 50),
        ttft_ms_p90=percentile([r.ttft_ms for r in ok if r.ttft_ms is not None], 90),
        latency_ms_p50=percentile([r.latency_ms for r in ok if r.latency_ms is not None], 50),
        latency_ms_p90=percentile([r.latency_ms for r in ok if r.latency_ms is not None], 90),
        params=params,
    )
    run_doc = summary.as_dict()
    run_doc["before_totals"] = counter_totals(before_text) if before_text else {}
    run_doc["after_totals"] = counter_totals(after_text) if after_text else {}
    (out / "run.json").write_text(json.dumps(run_doc, indent=1, default=str) + "\n")
    return summary, results

