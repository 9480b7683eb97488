"""Replay outputs in production formats: per-request usage JSONL and vLLM ``/metrics`` snapshots.

A simulated run re-enters prefixscope exactly like production traffic (``docs/architecture.md``):

- ``requests.jsonl``: one *prefixscope usage log* record per request, the shape
  ``prefixscope ingest requests`` reads (``ingest/usage.py``)::

      {"ts_unix_s": t0 + arrival_s, "request_id": ..., "run_id": ..., "instance": ...,
       "model": ..., "endpoint": "chat" | "completions",
       "usage": {"prompt_tokens": P, "completion_tokens": O, "total_tokens": P + O,
                 "prompt_tokens_details": {"cached_tokens": C, "created_cache_tokens": W}}}

  as vLLM 0.32 reports it with ``--enable-prompt-tokens-details`` (``cached_tokens`` fixed at
  the first admission; ``created_cache_tokens`` = prompt tokens newly cached, in full blocks).
  A rejected request (it could never run) gets no line, as a failed HTTP request has no usage;
  it is counted in the run summary instead.
- ``metrics/metrics-NNNNNN.prom``: Prometheus text-format expositions with vLLM 0.32/0.33's
  metric names (``vllm/v1/metrics/loggers.py``), rendered by ``prometheus_client``, one per
  snapshot time (at most one per ``snapshot_every_s`` of simulated time, only when a counter
  moved, plus the final state), each file's modification time set to its snapshot time so that
  ``prefixscope ingest metrics FILE`` stamps it right. Counters, labels ``model_name`` and
  ``engine="0"``, each with its ``_created`` time = t0 - 1 s:
  ``vllm:prefix_cache_queries_total`` / ``..._hits_total`` (tokens, at admission, counted
  requests only), ``vllm:external_prefix_cache_*`` (0: no connector), ``vllm:prompt_tokens_total``,
  ``vllm:prompt_tokens_cached_total``, ``vllm:prompt_tokens_by_source_total{source}``,
  ``vllm:prompt_tokens_cached_by_source_total{source}``, ``vllm:generation_tokens_total``,
  ``vllm:request_success_total{finished_reason="length"}`` (at finish), ``vllm:num_preemptions_total``;
  and the gauge ``vllm:cache_config_info`` (value 1; labels ``block_size``, ``num_gpu_blocks``
  — ``None`` for an unbounded cache —, ``prefix_caching_hash_algo``, ``enable_prefix_caching``).
  ``prompt_tokens_total`` moves at admission here (vLLM moves it at the first output token, a
  step later); no ``kv_cache_usage_perc`` (the results do not carry pool occupancy).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from prefixscope.replay.types import RequestResult, SimConfig

ENGINE = "0"
#: Default and cap for exposition snapshots.
SNAPSHOT_EVERY_S = 60.0
MAX_SNAPSHOTS = 240
#: The simulated server "starts" this long before trace time 0: the counters' ``_created`` time,
#: so a request admitted at time 0 falls after the created-zero sample.
CREATED_LEAD_S = 1.0


@dataclass(frozen=True, slots=True)
class CounterEvent:
    """What one request adds to the counters, and when (seconds since trace start).

    ``admitted_s``: queries/hits/prompt/cached move; ``finished_s``: success, generation tokens
    and preemptions move. ``counted`` False (skip-read) keeps it out of queries/hits.
    """

    admitted_s: float
    finished_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    counted: bool
    num_preemptions: int


@dataclass
class Counters:
    """Cumulative counter values (tokens, except ``requests`` and ``preemptions``)."""

    queries: int = 0
    hits: int = 0
    prompt: int = 0
    cached: int = 0
    generation: int = 0
    requests: int = 0
    preemptions: int = 0

    def copy(self) -> Counters:
        return Counters(**self.__dict__)


def usage_record(result: RequestResult, *, run_id: str, model: str, instance: str,
                 t0_unix_s: float, endpoint: str) -> dict[str, object]:
    """The usage-log record of one simulated request (see the module docstring)."""
    rec: dict[str, object] = {
        "ts_unix_s": round(t0_unix_s + result.arrival_s, 6),
        "request_id": result.request_id,
        "run_id": run_id,
        "instance": instance,
        "model": model,
        "endpoint": endpoint,
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {
                "cached_tokens": result.cached_tokens,
                "created_cache_tokens": result.created_cache_tokens,
            },
        },
    }
    for key in ("scope", "tenant_digest"):
        if result.attrs.get(key):
            rec[key] = result.attrs[key]
    return rec


def event_of(result: RequestResult) -> CounterEvent:
    """The counter contribution of one admitted request."""
    admitted = result.admitted_s if result.admitted_s is not None else result.arrival_s
    finished = result.finished_s if result.finished_s is not None else admitted
    return CounterEvent(admitted, max(finished, admitted), result.prompt_tokens,
                        result.cached_tokens, result.completion_tokens, result.counted,
                        result.num_preemptions)


class UsageWriter:
    """Writes usage records as results stream in, and keeps their counter events.

    Use as a context manager; :meth:`add` each result once (rejected ones are counted, not
    written). ``events`` then feed :func:`snapshot_counters`.
    """

    def __init__(self, path: str | os.PathLike[str], *, run_id: str, model: str, instance: str,
                 t0_unix_s: float, endpoint: str = "completions") -> None:
        self.path = Path(path)
        self.run_id, self.model, self.instance = run_id, model, instance
        self.t0_unix_s = t0_unix_s
        self.endpoint = endpoint
        self.events: list[CounterEvent] = []
        self.rejected: list[RequestResult] = []
        self.written = 0
        self._fh = None

    def __enter__(self) -> UsageWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "w", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._fh is not None
        self._fh.close()

    def add(self, result: RequestResult) -> None:
        if result.rejected_reason is not None:
            self.rejected.append(result)
            return
        assert self._fh is not None, "use UsageWriter as a context manager"
        rec = usage_record(result, run_id=self.run_id, model=self.model,
                           instance=self.instance, t0_unix_s=self.t0_unix_s, endpoint=self.endpoint)
        self._fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.written += 1
        self.events.append(event_of(result))


def write_usage_jsonl(results: Iterable[RequestResult], path: str | os.PathLike[str], *,
                      run_id: str, model: str, instance: str, t0_unix_s: float,
                      endpoint: str = "completions") -> int:
    """Write one usage record per admitted result to ``path`` (JSONL). Returns lines written."""
    with UsageWriter(path, run_id=run_id, model=model, instance=instance, t0_unix_s=t0_unix_s,
                     endpoint=endpoint) as w:
        for r in results:
            w.add(r)
    return w.written


def snapshot_times(events: Sequence[CounterEvent], *, every_s: float = SNAPSHOT_EVERY_S,
                   max_snapshots: int = MAX_SNAPSHOTS) -> list[float]:
    """Snapshot times (seconds since trace start, ascending): the end of every ``every_s``
    window in which a counter moved, the window widened (to a whole multiple of ``every_s``) so
    that there are at most ``max_snapshots``; the last one is the time of the last event."""
    if not events:
        return []
    times = sorted({e.admitted_s for e in events} | {e.finished_s for e in events})
    end = times[-1]
    step = every_s
    if end / step > max_snapshots:
        step = every_s * math.ceil(end / every_s / max_snapshots)
    windows = sorted({math.floor(t / step) for t in times})
    out = [min((w + 1) * step, end) for w in windows]
    if out[-1] != end:
        out.append(end)
    return sorted(set(out))


def snapshot_counters(events: Sequence[CounterEvent], times: Sequence[float]) -> list[Counters]:
    """Cumulative counters at each of ``times`` (inclusive of events at that time)."""
    adm = sorted(events, key=lambda e: e.admitted_s)
    fin = sorted(events, key=lambda e: e.finished_s)
    c = Counters()
    out: list[Counters] = []
    i = j = 0
    for t in times:
        while i < len(adm) and adm[i].admitted_s <= t:
            e = adm[i]
            c.prompt += e.prompt_tokens
            c.cached += e.cached_tokens
            if e.counted:
                c.queries += e.prompt_tokens
                c.hits += e.cached_tokens
            i += 1
        while j < len(fin) and fin[j].finished_s <= t:
            e = fin[j]
            c.generation += e.completion_tokens
            c.requests += 1
            c.preemptions += e.num_preemptions
            j += 1
        out.append(c.copy())
    return out


class _Families:
    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self) -> Iterator:
        return iter(self._families)


def render_exposition(counters: Counters, *, model: str, config: SimConfig,
                      created_unix_s: float) -> str:
    """One exposition text (Prometheus 0.0.4) of ``counters`` with vLLM's names and labels."""
    labels = ["engine", "model_name"]
    values = [ENGINE, model]

    def counter(name: str, doc: str, value: float, extra: dict[str, str] | None = None):
        fam = CounterMetricFamily(name, doc, labels=labels + list(extra or {}))
        fam.add_metric(values + list((extra or {}).values()), value, created=created_unix_s)
        return fam

    fams = [
        counter("vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.", counters.queries),
        counter("vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.", counters.hits),
        counter("vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, "
                "in terms of number of queried tokens.", 0),
        counter("vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in "
                "terms of number of cached tokens.", 0),
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                counters.preemptions),
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", counters.prompt),
        counter("vllm:prompt_tokens_cached",
                "Number of cached prompt tokens (local + external).", counters.cached),
        counter("vllm:generation_tokens", "Number of generation tokens processed.",
                counters.generation),
    ]
    by_source = CounterMetricFamily("vllm:prompt_tokens_by_source",
                                    "Number of prompt tokens by source.",
                                    labels=labels + ["source"])
    for source, value in (("local_compute", counters.prompt - counters.cached),
                          ("local_cache_hit", counters.cached), ("external_kv_transfer", 0)):
        by_source.add_metric(values + [source], value, created=created_unix_s)
    cached_by = CounterMetricFamily(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them.",
        labels=labels + ["source"])
    for source in ("device", "host", "p2p", "disk", "external_unspecified"):
        cached_by.add_metric(values + [source], counters.hits if source == "device" else 0,
                             created=created_unix_s)
    success = CounterMetricFamily("vllm:request_success",
                                  "Count of successfully processed requests.",
                                  labels=["engine", "finished_reason", "model_name"])
    success.add_metric([ENGINE, "length", model], counters.requests, created=created_unix_s)
    fams += [by_source, cached_by, success]
    info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                             labels=["block_size", "enable_prefix_caching", "engine",
                                     "num_gpu_blocks", "prefix_caching_hash_algo"])
    info.add_metric([str(config.block_size), str(config.enable_prefix_caching), ENGINE,
                     str(config.num_gpu_blocks), "sha256" if config.hash_algo == "fast"
                     else config.hash_algo], 1.0)
    fams.append(info)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(fams))
    return generate_latest(registry).decode("utf-8")


def write_exposition(events: Sequence[CounterEvent], out_dir: str | os.PathLike[str], *,
                     model: str, config: SimConfig, t0_unix_s: float,
                     every_s: float = SNAPSHOT_EVERY_S,
                     max_snapshots: int = MAX_SNAPSHOTS) -> list[tuple[Path, float]]:
    """Write exposition snapshots into ``out_dir`` (``metrics-NNNNNN.prom``, oldest first).

    Args:
        events: counter events of the admitted requests (from :class:`UsageWriter`).
        model: the ``model_name`` label.
        config: the simulated cache (for ``vllm:cache_config_info``).
        t0_unix_s: Unix time of trace time 0 (counters are ``_created`` 1 s earlier).

    Returns:
        ``(path, snapshot Unix time)`` per file; each file's mtime is set to its time.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    times = snapshot_times(events, every_s=every_s, max_snapshots=max_snapshots)
    written: list[tuple[Path, float]] = []
    for k, (t, counters) in enumerate(zip(times, snapshot_counters(events, times)), start=1):
        at = t0_unix_s + t
        path = out / f"metrics-{k:06d}.prom"
        path.write_text(render_exposition(counters, model=model, config=config,
                                          created_unix_s=t0_unix_s - CREATED_LEAD_S),
                        encoding="utf-8")
        os.utime(path, (at, at))
        written.append((path, at))
    return written
