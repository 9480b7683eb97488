"""Concurrent replay on a recorded timeline: the cache model driven by when each request really
ran, instead of by the step model's clock.

The step model (``replay/scheduler.py``) has to *predict* which requests run together, and on a
loaded machine its clock cannot (docs/fidelity.md: the same traffic took 32.6 s and 84.3 s).
When the trace was recorded from a server, every request carries when it was sent
(``arrival_s``) and when its answer ended (``finished_s``), and this module replays the cache
operations of vLLM 0.32 in that order (``ConcurrencyConfig.observed_clock``; ``replay sim
--clock observed``):

1. **Admission** at ``arrival_s``, in trace order (the engine's arrival order): lookup
   (``get_computed_blocks``), then allocation of the whole prompt with the whole sequence
   required to fit (``scheduler_reserve_full_isl``), as the scheduler's waiting loop does; the
   prompt's full blocks are cached; one token is sampled. A request that does not fit waits
   (FIFO, head-of-line) and is retried after each free.
2. **Decode**: the ``out - 1`` fed-back tokens are spread evenly between admission and
   ``finished_s`` (token *k* at ``t_a + (t_f - t_a) * k / out``); each allocates its slot and
   caches a block it fills (``allocate_slots`` with one token, as a running request's step).
3. **Free** at ``finished_s`` (blocks in reverse order to the free queue, ``KVCacheManager.free``).

Events at the same instant run free, then decode, then admission (vLLM frees a finished request
after its step, and serves running requests before waiting ones). Statistics as the step model:
counted at admission. Memory: the requests in flight and one pending event each.

Measured against the real vLLM: with the client's send and end times this replays 99.3 to
100 % of the tight-cache requests exactly where the step model gets 96.7 to 98.7 %
(docs/fidelity.md); the rest is the client's timestamps, not the engine's.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from prefixscope.core.errors import SimulationError
from prefixscope.replay.kv_cache_manager import KVCacheManager, SimRequest
from prefixscope.replay.scheduler import EngineStats

_FREE, _DECODE, _ADMIT = 0, 1, 2


def run_observed(
    items: Iterator[tuple[SimRequest | None, object, float]],
    manager: KVCacheManager,
    stats: EngineStats,
) -> Iterator[tuple[object, SimRequest | None, float]]:
    """Replay on the recorded timeline; yields ``(trace item, finished request or None,
    finished_s)`` in finishing order.

    ``items`` yields ``(request or None if rejected, trace item, arrival_s)`` in trace order;
    each trace item must carry ``finished_s`` (seconds on the ``arrival_s`` clock). Read
    lazily, as far as the timeline has reached.

    Raises:
        SimulationError: a request without ``finished_s``, or one that ends before it arrives;
            a request that cannot be admitted into an empty cache.
    """
    heap: list[tuple[float, int, int, SimRequest, float, float, int]] = []
    waiting: deque[tuple[SimRequest, float, float]] = deque()
    seq = 0
    running = 0
    last_arrival = float("-inf")
    pending = next(items, None)

    def admit(req: SimRequest, t: float, end: float) -> bool:
        nonlocal seq, running
        hits, hit_tokens = manager.get_computed_blocks(req)
        new_blocks = manager.allocate_slots(req, req.num_tokens - hit_tokens, hit_tokens, hits,
                                            full_sequence_must_fit=True)
        if new_blocks is None:
            return False
        if manager.enable_caching and not req.skip_reading:
            stats.prefix_cache_queries += req.num_tokens
            stats.prefix_cache_hits += hit_tokens
        req.cached_tokens = hit_tokens
        req.admitted_s = t
        req.num_computed_tokens = req.num_tokens
        req.append_output_tokens(1)
        running += 1
        stats.peak_running = max(stats.peak_running, running)
        out = max(req.max_tokens, 1)
        seq += 1
        if out > 1:
            heapq.heappush(heap, (t + (end - t) / out, _DECODE, seq, req, t, end, out))
        else:
            heapq.heappush(heap, (end, _FREE, seq, req, t, end, out))
        return True

    def try_waiting(now: float) -> None:
        while waiting:
            req, t, end = waiting[0]
            if not admit(req, max(now, t), max(end, now)):
                return
            waiting.popleft()

    while True:
        next_event = heap[0][0] if heap else None
        if pending is not None and (next_event is None or
                                    max(pending[2], last_arrival) < next_event or
                                    (max(pending[2], last_arrival) == next_event
                                     and heap[0][1] == _ADMIT)):
            req, item, arrival = pending
            pending = next(items, None)
            t = max(arrival, last_arrival)
            last_arrival = t
            if req is None:
                yield item, None, t
                continue
            end = getattr(item, "finished_s", None)
            rid = getattr(item, "request_id", "?")
            if end is None:
                raise SimulationError(f"request {rid}: no finished_s (the observed clock needs "
                                      "the recorded end of every answer)")
            if end < arrival:
                raise SimulationError(f"request {rid}: finished_s {end} is before its arrival "
                                      f"{arrival}")
            req.trace = item
            if waiting or not admit(req, t, end):
                if not heap and not waiting:
                    raise SimulationError(f"request {rid} cannot be admitted into an idle "
                                          "engine")
                waiting.append((req, t, end))
                stats.peak_waiting = max(stats.peak_waiting, len(waiting))
            continue
        if not heap:
            if waiting:  # pragma: no cover - admission into an empty cache always fits
                raise SimulationError(f"request {waiting[0][0].request_id} cannot be admitted "
                                      "into an idle engine")
            return
        t, kind, _s, req, start, end, out = heapq.heappop(heap)
        if kind == _DECODE:
            if manager.allocate_slots(req, 1) is None:
                raise SimulationError(f"request {req.request_id}: no block for a decode token "
                                      "on the recorded timeline (the cache is smaller than "
                                      "the one recorded)")
            req.num_computed_tokens += 1
            req.append_output_tokens(1)
            k = req.num_output_tokens
            seq += 1
            if k < out:
                heapq.heappush(heap, (start + (end - start) * k / out, _DECODE, seq, req,
                                      start, end, out))
            else:
                heapq.heappush(heap, (end, _FREE, seq, req, start, end, out))
            continue
        manager.free(req)
        running -= 1
        yield req.trace, req, t
        try_waiting(t)
