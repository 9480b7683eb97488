"""Fleet replay: one trace through N exact per-instance cache models under a routing policy.

:func:`replay_fleet` reads :class:`~replay.types.TraceRequest` records in trace order, builds each
request's keys once (``replay.sim``'s request factory: the same hashing, salts, adapters and
rejections as ``replay sim``), asks the router (``replay.routers``) for an instance, classifies
its prompt tokens with the miss ledger (``replay.ledger``) against the caches as they are at
arrival, and runs it on that instance's own :class:`~replay.kv_cache_manager.KVCacheManager`.

Model: **sequential replay** (each request finishes before the next one starts, on whichever
instance), exactly ``replay sim``'s sequential model per instance: with one instance and any
router the hits equal ``replay sim``'s. Requests in flight, queues and time are not modelled,
so routers that read load read routed prompt tokens (``replay.routers``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prefixscope.core.errors import SimulationError
from prefixscope.replay.kv_cache_manager import KVCacheManager
from prefixscope.replay.ledger import (CLASSES, LedgerRecord, LedgerTotals, MissLedger,
                                       check_record)
from prefixscope.replay.routers import FleetView, make_router
from prefixscope.replay.scheduler import run_steps
from prefixscope.replay.sim import _RequestFactory
from prefixscope.replay.types import SimConfig, TraceRequest


@dataclass(frozen=True, slots=True)
class RouterParams:
    """Router settings (see ``replay.routers``).

    Attributes:
        seed: ``random``'s seed.
        hash_blocks: ``hash-prefix``'s K (blocks hashed, >= 1).
        load_factor: ``longest-prefix-bounded``'s k (>= 1, multiple of the mean load).
        load_window_s: ``longest-prefix-bounded``'s load window, seconds of trace time (> 0).
    """

    seed: int = 0
    hash_blocks: int = 4
    load_factor: float = 1.25
    load_window_s: float = 60.0


#: The default router settings (a module-level value: an immutable default argument).
DEFAULT_ROUTER_PARAMS = RouterParams()


@dataclass
class InstanceStats:
    """One instance's share of a fleet run (counted requests; tokens)."""

    name: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    evicted_blocks: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with ``hit_rate`` (fraction or None)."""
        return {"instance": self.name, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens
                else None, "evicted_blocks": self.evicted_blocks}


@dataclass
class FleetResult:
    """Totals of one policy's fleet replay.

    Attributes:
        router: the policy name.
        instances: per-instance stats, index order.
        ledger: ledger totals over counted requests (tokens per class).
        requests: trace requests read; ``rejected``: the cache could never hold them;
            ``uncounted``: skip-read requests (they write but are not counted, as in vLLM).
    """

    router: str
    instances: list[InstanceStats]
    ledger: LedgerTotals
    requests: int = 0
    rejected: int = 0
    uncounted: int = 0
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float | None:
        """Σ hit / Σ prompt tokens of counted requests (fraction), None without tokens."""
        return self.ledger.hit_rate

    def balance(self) -> dict[str, float | None]:
        """Load balance: max over mean, per instance, of counted requests and of prompt tokens
        (1.0 = perfectly even; N = all on one instance; None when there is nothing)."""
        out: dict[str, float | None] = {}
        for name in ("requests", "prompt_tokens"):
            vals = [getattr(s, name) for s in self.instances]
            mean = sum(vals) / len(vals)
            out[f"{name}_max_over_mean"] = max(vals) / mean if mean else None
        return out

    def as_dict(self) -> dict[str, Any]:
        """The ``replay fleet --json`` object of one policy (docs/replay.md lists the fields)."""
        led = self.ledger
        return {
            "router": self.router, "instances": len(self.instances),
            "requests": self.requests, "counted_requests": led.requests,
            "rejected_requests": self.rejected, "uncounted_requests": self.uncounted,
            "prompt_tokens": led.prompt_tokens, "cached_tokens": led.hit,
            "hit_rate": led.hit_rate, "missed_tokens": led.missed,
            "ledger": {c: getattr(led, c) for c in CLASSES},
            "capacity_belady": led.capacity_belady,
            "routing_share_of_missed": led.share_of_missed("routing"),
            **self.balance(),
            "per_instance": [s.as_dict() for s in self.instances],
            "seconds": round(self.seconds, 3),
        }


class FleetRun(Iterator[LedgerRecord]):
    """The lazy record stream of :func:`replay_fleet`: one :class:`LedgerRecord` per counted
    request, trace order; :attr:`result` holds the running totals (complete at the end)."""

    def __init__(self, requests: Iterable[TraceRequest], config: SimConfig, *,
                 instances: int, router: str, params: RouterParams,
                 instance_names: list[str] | None = None,
                 on_request: Callable[[int, Any], None] | None = None) -> None:
        if not config.enable_prefix_caching:
            raise SimulationError("fleet replay needs prefix caching on")
        if config.concurrency is not None:
            raise SimulationError("fleet replay is sequential (no --concurrency)")
        names = instance_names or [f"i{k}" for k in range(instances)]
        if len(names) < 1:
            raise SimulationError("a fleet needs at least one instance")
        self.config = config
        self.factory = _RequestFactory(config)
        self.managers = [KVCacheManager(num_gpu_blocks=config.num_gpu_blocks,
                                        block_size=config.block_size,
                                        max_model_len=config.max_model_len)
                         for _ in names]
        pools = [m.block_pool for m in self.managers]
        self.view = FleetView([p._first for p in pools], config.block_size)
        self.router = make_router(router, self.view, seed=params.seed,
                                  hash_blocks=params.hash_blocks, load_factor=params.load_factor,
                                  load_window_s=params.load_window_s,
                                  instance_names={n: k for k, n in enumerate(names)})
        self.ledger = MissLedger(pools, names, config)
        self.result = FleetResult(router=router, instances=[InstanceStats(n) for n in names],
                                  ledger=LedgerTotals())
        self._on_request = on_request
        self._it = self._generate(iter(requests))

    def __iter__(self) -> FleetRun:
        return self

    def __next__(self) -> LedgerRecord:
        return next(self._it)

    def run(self) -> FleetResult:
        """Consume the stream; the totals."""
        for _ in self:
            pass
        return self.result

    def _generate(self, requests: Iterator[TraceRequest]) -> Iterator[LedgerRecord]:
        factory, managers, ledger, view = self.factory, self.managers, self.ledger, self.view
        res = self.result
        stats = res.instances
        totals = res.ledger
        choose = self.router.choose
        on_request = self._on_request
        for tr in requests:
            res.requests += 1
            if factory.reject_reason(tr) is not None:
                res.rejected += 1
                continue
            req = factory.build(tr)
            i = choose(tr, req)
            view.routed(i, tr)
            mgr = managers[i]
            rec = None if req.skip_reading else ledger.classify(i, tr, req)
            hit = mgr.run_alone(req)
            if hit is None:
                hit = run_steps(mgr, req)
            if on_request is not None:
                on_request(i, req)
            if rec is None:
                ledger.stored_unclassified(i, tr, req, hit)
                res.uncounted += 1
                req.release_tokens()
                continue
            assert rec.hit == hit, (tr.request_id, rec.hit, hit)
            ledger.stored(req)
            req.release_tokens()
            s = stats[i]
            s.requests += 1
            s.prompt_tokens += rec.prompt_tokens
            s.cached_tokens += hit
            totals.add(rec)
            yield rec
        for s, m in zip(stats, managers):
            s.evicted_blocks = m.block_pool.num_evicted_blocks


def replay_fleet(requests: Iterable[TraceRequest], config: SimConfig, *, instances: int,
                 router: str = "round-robin", params: RouterParams = DEFAULT_ROUTER_PARAMS,
                 instance_names: list[str] | None = None) -> FleetRun:
    """Replay ``requests`` through ``instances`` cache models routed by ``router``.

    Args:
        requests: trace requests in trace order (read lazily).
        config: each instance's cache (``block_size``, ``num_gpu_blocks`` per instance, hash
            algorithm); must be sequential (``concurrency`` None) with caching on.
        instances: N >= 1 (ignored when ``instance_names`` is given).
        router: one of ``replay.routers.ROUTERS``.
        params: router settings.
        instance_names: the instances' names (``recorded``: the trace's names, in order of
            first appearance); default ``i0 .. i{N-1}``.

    Returns:
        :class:`FleetRun`: iterate for per-request :class:`LedgerRecord` (counted requests,
        trace order) or call ``.run()`` for the :class:`FleetResult`.

    Raises:
        SimulationError: bad configuration, a request the recorded router cannot place, or
            the factory's errors (``replay.sim``). UsageError: a router parameter out of range.
    """
    return FleetRun(requests, config, instances=instances, router=router, params=params,
                    instance_names=instance_names)


def check_fleet_records(records: Iterable[LedgerRecord]) -> int:
    """Assert :func:`replay.ledger.check_record` on every record; returns how many."""
    n = 0
    for r in records:
        check_record(r)
        n += 1
    return n


__all__ = ["DEFAULT_ROUTER_PARAMS", "FleetResult", "FleetRun", "InstanceStats", "RouterParams", "check_fleet_records",
           "replay_fleet"]
