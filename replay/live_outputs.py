"""Live replay, output side: what a run's results become.

- :func:`result_to_usage_line`: one line of the run's ``requests.jsonl``, the OpenAI response
  shape ``prefixscope ingest requests`` reads (no prompt text, no token ids);
- :func:`results_as_trace` / :func:`write_token_trace`: the traffic exactly as sent (prompt
  ids, real output ids, salts) as trace requests for the simulator.

Pure: no HTTP, no DuckDB.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from prefixscope.core.errors import UsageError
from prefixscope.replay.live import LiveResult
from prefixscope.replay.types import TraceRequest


def result_to_usage_line(res: LiveResult, *, run_id: str, instance: str | None) -> dict[str, Any]:
    """One line of the per-request JSONL (the OpenAI response shape ``ingest requests`` reads).

    The server's own ``usage`` object is kept verbatim (inclusive ``prompt_tokens``;
    ``prompt_tokens_details`` null when the server did not report it). prefixscope fields:
    ``run_id``, ``request_id`` (the server's id, else ``<run_id>/<trace id>``), ``trace_request_id``,
    ``ts_unix_s`` (send time), ``ttft_ms``, ``latency_ms``, ``endpoint``, ``instance``, ``status``
    and ``error`` for failed requests (no usage then), ``attempts``, and ``tenant_digest`` /
    ``scope`` when the trace carried them. No prompt text, no token ids.
    """
    line: dict[str, Any] = {
        "id": res.response_id or f"{run_id}/{res.request_id}",
        "object": "text_completion" if res.endpoint == "completions" else "chat.completion",
        "created": int(res.sent_unix_s),
        "model": res.model,
        "usage": dict(res.usage) if res.usage is not None else None,
        "run_id": run_id,
        "request_id": res.response_id or f"{run_id}/{res.request_id}",
        "trace_request_id": res.request_id,
        "ts_unix_s": res.sent_unix_s,
        "ttft_ms": res.ttft_ms,
        "latency_ms": res.latency_ms,
        "endpoint": res.endpoint,
        "instance": instance,
        "attempts": res.attempts,
        "status": "ok" if res.ok else "failed",
    }
    if res.error is not None:
        line["error"] = res.error
    for key in ("tenant_digest", "scope"):
        if res.attrs.get(key):
            line[key] = res.attrs[key]
    return line


def results_as_trace(results: Iterable[LiveResult], *, order: Sequence[str] | None = None,
                     step_s: float = 0.0) -> list[TraceRequest]:
    """Turn live results back into exact trace requests for the simulator.

    Each successful result becomes a :class:`TraceRequest` with the prompt ids as sent, the
    real output ids and ``output_tokens`` = their count, and the salt sent.

    Args:
        results: live results (any order).
        order: request ids in the order the engine received them (e.g. from
            ``--enable-log-requests``); default: by ``sent_unix_s``.
        step_s: ``arrival_s`` spacing given to the ordered requests (0 keeps send times,
            relative to the first send). ``finished_s`` is the end of the answer relative to
            the same first request's send.

    Raises:
        UsageError: a successful result has no prompt or output token ids (the server did not
            honour ``return_token_ids``).
    """
    ok = [r for r in results if r.ok]
    for r in ok:
        if r.prompt_token_ids is None or r.output_token_ids is None:
            raise UsageError(f"request {r.request_id}: no token ids recorded; replay with "
                             "return_token_ids against vLLM >= 0.10")
    by_id = {r.request_id: r for r in ok}
    if order is None:
        ordered = sorted(ok, key=lambda r: r.sent_unix_s)
    else:
        ordered = [by_id[i] for i in order if i in by_id]
    t0 = ordered[0].sent_unix_s if ordered else 0.0
    out = []
    for i, r in enumerate(ordered):
        arrival = i * step_s if (order is not None or step_s) else r.sent_unix_s - t0
        finished = None if r.latency_ms is None else r.sent_unix_s + r.latency_ms / 1000 - t0
        out.append(TraceRequest(
            request_id=r.request_id, arrival_s=max(0.0, arrival),
            num_prompt_tokens=len(r.prompt_token_ids or ()),
            prompt_token_ids=tuple(r.prompt_token_ids or ()),
            output_tokens=len(r.output_token_ids or ()),
            output_token_ids=tuple(r.output_token_ids or ()),
            model=r.model, cache_salt=r.cache_salt, attrs=dict(r.attrs),
            finished_s=finished,
        ))
    return out



def write_token_trace(results: Iterable[LiveResult], path: Any, *,
                      order: Sequence[str] | None = None) -> int:
    """Write answered requests as a ``token-ids`` trace (``prefixscope.replay.traces`` reads it back).

    One line per request, in ``order`` (trace request ids) or send order: ``request_id``,
    ``arrival_s`` (seconds after the first send), ``prompt_token_ids`` (as sent),
    ``output_token_ids`` (as generated), ``output_tokens``, ``cache_salt``, ``model``,
    ``finished_s`` (end of the answer on the same clock, for ``replay sim --clock observed``).

    Returns:
        Lines written.
    """
    trace = results_as_trace(results, order=order)
    with open(path, "w") as f:
        for r in trace:
            f.write(json.dumps({
                "request_id": r.request_id, "arrival_s": r.arrival_s,
                "prompt_token_ids": list(r.prompt_token_ids or ()),
                "output_token_ids": list(r.output_token_ids or ()),
                "output_tokens": r.output_tokens, "cache_salt": r.cache_salt, "model": r.model,
                "finished_s": r.finished_s,
            }) + "\n")
    return len(trace)
