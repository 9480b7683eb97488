"""Engine models that drive the KV-cache manager: sequential (exact) and step-based (concurrent).

Sequential replay runs each request alone: lookup and admission, prefill, decode, free, then the
next request. That is exactly what vLLM does when requests never overlap, whatever its chunk
size, so its hit counts are exact (``tests/vllm_parity`` checks them against vLLM's own
``KVCacheManager``).

The step model follows ``Scheduler.schedule`` and ``update_from_output`` of
``vllm/v1/core/sched/scheduler.py`` (vLLM 0.32.0) with the FCFS policy, synchronous scheduling,
no speculative decoding and no KV connector:

1. Each step has a token budget (``max_num_batched_tokens``). Running requests are served
   first, in running order: each gets ``min(remaining tokens, budget, long-prefill cap)``.
   When a running request cannot get blocks, the *last* running request (the most recently
   admitted) is preempted: its blocks are freed (cached ones keep their keys), its computed
   tokens reset to 0 and it goes to the *front* of the waiting queue. If it was the request
   itself, scheduling of running requests stops.
2. Waiting requests are admitted only when no request was preempted in this step, FCFS and
   head-of-line: while the budget lasts and fewer than ``max_num_seqs`` run, the first waiting
   request is looked up and allocated with the whole sequence required to fit
   (``scheduler_reserve_full_isl``, default True); the first failure ends admission.
   Without chunked prefill a request that does not fit the remaining budget also ends it.
3. Statistics are recorded at successful admission after a lookup: queries += prompt tokens,
   hits += hit tokens, unless the request skips reading or was preempted before (vLLM sends
   those to fields the counters do not export). ``cached_tokens`` is fixed at first admission.
4. Blocks are cached when scheduled (see ``KVCacheManager.allocate_slots``): a later request in
   the same step can hit blocks an earlier one registered.
5. After the step, every request whose computed tokens reached its length samples one token;
   a request that has its ``max_tokens`` (at least 1) finishes and is freed, in scheduled order.
   The last sampled token is never fed back.

Time: step k starts at ``t_k``; a step takes ``step_time_s + step_token_s * P + step_decode_s *
D`` (P: prefill tokens scheduled in the step, including a preempted request's recomputation; D:
requests decoding one token; the two coefficients default to 0, a constant step); idle engines
jump to the next arrival. Requests enter the waiting queue when ``arrival_s <= t_k``, in trace
order.

6. **Follow-ups wait for their answer.** A request whose trace item names another in
   ``attrs["follows"]`` (a conversation's next turn: its prompt holds the other's prompt and
   output) cannot be sent before that answer exists: while the request it follows is still
   waiting or running in the model, it is held, and it enters the waiting queue in the step in
   which that request finishes, at its trace position (before the waiting requests that come
   after it in the trace: the engine's order is kept). Without this the model could admit a follow-up
   while its parent is still decoding, when the parent's last output blocks are not yet full
   and cached, and predict fewer hits than vLLM gives (the client sends it only after the
   answer). Only requests in flight are remembered, so memory stays bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from prefixscope.core.errors import SimulationError
from prefixscope.replay.kv_cache_manager import KVCacheManager, SimRequest
from prefixscope.replay.types import ConcurrencyConfig


class EngineStats:
    """Counters of one simulated engine (cumulative).

    Attributes:
        prefix_cache_queries: tokens, vLLM ``vllm:prefix_cache_queries_total`` delta.
        prefix_cache_hits: tokens, vLLM ``vllm:prefix_cache_hits_total`` delta.
        num_preemptions: vLLM ``vllm:num_preemptions_total`` delta.
        num_steps: engine steps run (step model only).
        peak_running: most requests running at once.
        peak_waiting: most requests waiting at once.
    """

    __slots__ = ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "num_steps",
                 "peak_running", "peak_waiting")

    def __init__(self) -> None:
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.num_steps = 0
        self.peak_running = 0
        self.peak_waiting = 0


def run_sequential(
    items: Iterable[tuple[SimRequest | None, object]],
    manager: KVCacheManager,
    stats: EngineStats,
) -> Iterator[tuple[object, SimRequest | None]]:
    """Replay requests one at a time; yields ``(trace item, finished request or None)``.

    ``items`` yields ``(request, trace item)``; a None request (rejected upstream) is passed
    through. Each request is looked up, admitted with all its prompt tokens, given its
    ``max_tokens - 1`` fed-back decode tokens, and freed before the next one starts.
    """
    for req, item in items:
        if req is None:
            yield item, None
            continue
        hit_tokens = manager.run_alone(req)
        if hit_tokens is None:  # blocks in use: the step-by-step path
            hit_tokens = run_steps(manager, req)
        # else the one-pass path: same state, see KVCacheManager.run_alone
        if manager.enable_caching and not req.skip_reading:
            stats.prefix_cache_queries += req.num_prompt_tokens
            stats.prefix_cache_hits += hit_tokens
        yield item, req


def run_steps(manager: KVCacheManager, req: SimRequest) -> int:
    """One request alone, step by step as vLLM runs it: look up, admit all prompt tokens, feed
    back its ``max_tokens - 1`` decode tokens, free. Returns the hit tokens (``cached_tokens``).

    The reference :meth:`KVCacheManager.run_alone` must equal (tests/test_replay_core_fastpaths).

    Raises:
        SimulationError: the request does not fit an empty cache (excluded upstream).
    """
    hits, hit_tokens = manager.get_computed_blocks(req)
    new_blocks = manager.allocate_slots(
        req, req.num_prompt_tokens - hit_tokens, hit_tokens, hits,
        full_sequence_must_fit=True,
    )
    if new_blocks is None:  # pragma: no cover - excluded by the capacity check upstream
        raise SimulationError(f"request {req.request_id} does not fit an empty cache")
    req.cached_tokens = hit_tokens
    req.num_computed_tokens = req.num_prompt_tokens
    out = max(req.max_tokens, 1)
    if out > 1:
        # All generated tokens exist; the first out-1 are fed back. One allocation gives
        # the same blocks, keys and order as out-1 single-token steps: nothing else runs.
        req.append_output_tokens(out)
        manager.allocate_slots(req, out - 1)
        req.num_computed_tokens += out - 1
    else:
        req.num_output_tokens = 1
    manager.free(req)
    return hit_tokens


class StepScheduler:
    """The step-based FCFS scheduler model (module rules 1-5) over a :class:`KVCacheManager`."""

    def __init__(self, manager: KVCacheManager, config: ConcurrencyConfig, stats: EngineStats):
        self.manager = manager
        self.config = config
        self.stats = stats
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.max_model_len = manager.max_model_len
        self.last_num_scheduled = 0
        self.last_prefill_tokens = 0
        self.last_decodes = 0

    def add_request(self, request: SimRequest) -> None:
        """Append a newly arrived request to the waiting queue."""
        self.waiting.append(request)
        if len(self.waiting) > self.stats.peak_waiting:
            self.stats.peak_waiting = len(self.waiting)

    def add_in_order(self, request: SimRequest, seq: dict[int, int]) -> None:
        """Put a released follow-up (rule 6) into the waiting queue at its trace position:
        before every waiting request that comes after it in the trace (``seq``: id(request) ->
        trace position). Scans from the back, so the cost is the number of later requests
        already waiting."""
        waiting = self.waiting
        mine = seq[id(request)]
        j = len(waiting)
        while j > 0 and seq.get(id(waiting[j - 1]), -1) > mine:
            j -= 1
        waiting.insert(j, request)
        if len(waiting) > self.stats.peak_waiting:
            self.stats.peak_waiting = len(waiting)

    def has_requests(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.waiting or self.running)

    def _preempt(self, request: SimRequest) -> None:
        self.manager.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(request)

    def step(self, now_s: float) -> list[SimRequest]:
        """Run one engine step starting at ``now_s``; return the requests that finished."""
        cfg, mgr, stats = self.config, self.manager, self.stats
        stats.num_steps += 1
        budget = cfg.max_num_batched_tokens
        running, waiting = self.running, self.waiting
        threshold = cfg.long_prefill_token_threshold
        if len(running) + len(waiting) <= 1:
            threshold = 0
        scheduled: list[tuple[SimRequest, int]] = []
        preempted = False

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = req.num_tokens - req.num_computed_tokens
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, self.max_model_len - req.num_computed_tokens - 1)
            if n <= 0:
                i += 1
                continue
            while True:
                new_blocks = mgr.allocate_slots(req, n)
                if new_blocks is not None:
                    break
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if new_blocks is None:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1

        if not preempted:
            while waiting and budget > 0:
                if len(running) >= cfg.max_num_seqs:
                    break
                req = waiting[0]
                did_lookup = req.num_computed_tokens == 0
                if did_lookup:
                    hits, hit_tokens = mgr.get_computed_blocks(req)
                    computed = hit_tokens
                else:  # pragma: no cover - preemption resets computed tokens to 0
                    hits, hit_tokens, computed = [], 0, req.num_computed_tokens
                n = req.num_tokens - computed
                if 0 < threshold < n:
                    n = threshold
                if not cfg.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                new_blocks = mgr.allocate_slots(
                    req, n, hit_tokens, hits, full_sequence_must_fit=True
                )
                if new_blocks is None:
                    break
                if did_lookup and mgr.enable_caching and not req.skip_reading \
                        and req.num_preemptions == 0:
                    stats.prefix_cache_queries += req.num_tokens
                    stats.prefix_cache_hits += hit_tokens
                waiting.popleft()
                running.append(req)
                if req.cached_tokens < 0:
                    req.cached_tokens = hit_tokens
                    req.admitted_s = now_s
                req.num_computed_tokens = computed
                scheduled.append((req, n))
                budget -= n
            if len(running) > stats.peak_running:
                stats.peak_running = len(running)

        self.last_num_scheduled = len(scheduled) + (1 if preempted else 0)
        finished: list[SimRequest] = []
        prefill_tokens = decodes = 0
        for req, n in scheduled:
            if n == 1 and req.num_computed_tokens >= req.num_prompt_tokens:
                decodes += 1
            else:
                prefill_tokens += n
            req.num_computed_tokens += n
        self.last_prefill_tokens = prefill_tokens
        self.last_decodes = decodes
        for req, _n in scheduled:
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: no token sampled
            req.append_output_tokens(1)
            if req.num_output_tokens >= max(req.max_tokens, 1) or \
                    req.num_tokens >= self.max_model_len:
                finished.append(req)
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in running if id(r) not in done]
            for req in finished:
                mgr.free(req)
        return finished


def run_concurrent(
    items: Iterator[tuple[SimRequest | None, object, float]],
    manager: KVCacheManager,
    config: ConcurrencyConfig,
    stats: EngineStats,
) -> Iterator[tuple[object, SimRequest | None, float]]:
    """Replay with the step model; yields ``(trace item, finished request or None, finished_s)``.

    ``items`` yields ``(request or None if rejected, trace item, arrival_s)`` in trace order;
    it is read lazily, only as far as the simulated clock has reached, so memory holds only
    requests that have arrived and not finished.
    """
    sched = StepScheduler(manager, config, stats)
    step_s = config.step_time_s
    token_s, decode_s = config.step_token_s, config.step_decode_s
    in_flight: set[str] = set()  # trace ids waiting, running or held (rule 6)
    held: dict[str, list[SimRequest]] = {}  # id of the request followed -> its follow-ups
    seq: dict[int, int] = {}  # id(request) -> trace position, for requests in flight
    n_seen = 0
    pending: tuple[SimRequest | None, object, float] | None = None
    source_done = False
    now: float | None = None
    last_arrival = float("-inf")

    def pull() -> tuple[SimRequest | None, object, float] | None:
        nonlocal source_done
        if source_done:
            return None
        try:
            return next(items)
        except StopIteration:
            source_done = True
            return None

    pending = pull()
    while True:
        # Admit arrivals up to the clock (trace order; a late-listed early arrival waits).
        if not sched.has_requests():
            if pending is None:
                return
            arrival = max(pending[2], last_arrival)
            now = arrival if now is None else max(now, arrival)
        assert now is not None
        while pending is not None and max(pending[2], last_arrival) <= now:
            req, item, arrival = pending
            last_arrival = max(last_arrival, arrival)
            if req is None:
                yield item, None, now
            else:
                req.trace = item
                rid = getattr(item, "request_id", None)
                if rid is not None:
                    in_flight.add(rid)
                seq[id(req)] = n_seen
                n_seen += 1
                parent = (getattr(item, "attrs", None) or {}).get("follows")
                if parent is not None and parent in in_flight:
                    held.setdefault(parent, []).append(req)
                else:
                    sched.add_request(req)
            pending = pull()
        if not sched.has_requests():
            continue
        finished = sched.step(now)
        now += step_s + token_s * sched.last_prefill_tokens + decode_s * sched.last_decodes
        for req in finished:
            rid = getattr(req.trace, "request_id", None)
            in_flight.discard(rid)
            for child in held.pop(rid, ()):
                sched.add_in_order(child, seq)
            yield req.trace, req, now
        for req in finished:
            seq.pop(id(req), None)
        if sched.last_num_scheduled == 0 and not sched.running and sched.waiting:
            head = sched.waiting[0]
            raise SimulationError(
                f"request {head.request_id} cannot be admitted into an idle engine"
            )


