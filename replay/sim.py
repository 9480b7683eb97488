"""Replay a trace through the exact CPU model of vLLM's prefix cache.

Entry points:

- :func:`simulate` ``(requests, config) -> SimRun``: a lazy iterator of
  :class:`~replay.types.RequestResult` (trace order for sequential replay, completion order for
  the step model). It reads the trace lazily and keeps no finished request, so memory is bounded
  by the cache capacity and the requests in flight, not by the trace length.
- :class:`SimSummary`: totals in vLLM's counter terms; ``SimSummary.from_results(run, config)``
  or ``run.summary()``.

Layers (as in vLLM's v1 core): :mod:`prefixscope.replay.hashing` -> :mod:`prefixscope.replay.block_pool` ->
:mod:`prefixscope.replay.kv_cache_manager` -> :mod:`prefixscope.replay.scheduler` -> this module.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from prefixscope.core.errors import SimulationError
from prefixscope.replay.hashing import BlockHasher, PrefixMemo, check_algo
from prefixscope.replay.kv_cache_manager import KVCacheManager, SimRequest, cdiv
from prefixscope.replay.observed_clock import run_observed
from prefixscope.replay.scheduler import EngineStats, run_concurrent, run_sequential
from prefixscope.replay.types import RequestResult, SimConfig, TraceRequest

#: How many rejected requests the summary lists by id (all are counted).
MAX_LISTED_REJECTIONS = 100

#: ``simulate(..., read_ahead=True)``: sequential replay with a vLLM hash prepares (reads and
#: hashes) requests ahead of the cache model, up to this many requests or until they hold this
#: many prompt blocks, then runs them:
#: the same work in the same order for each part (keys depend only on the tokens), with the
#: hasher's and the block pool's working sets each staying in the CPU caches for a batch
#: instead of evicting each other at every request (about -7% replay time, docs/benchmarks.md).
READ_AHEAD_REQUESTS = 64
READ_AHEAD_BLOCKS = 1 << 14


def read_ahead(items: Iterator[tuple[SimRequest | None, TraceRequest]], max_items: int,
               max_blocks: int) -> Iterator[tuple[SimRequest | None, TraceRequest]]:
    """``items`` in order, pulled in batches of up to ``max_items`` items or ``max_blocks``
    prompt block keys (the batch that reaches the bound ends it).

    An exception raised by ``items`` (a bad trace record, a request without token ids) is
    raised after the items before it are yielded, where iterating ``items`` directly would
    raise it; only the reading happens earlier. Memory: one batch of prepared requests.
    """
    buf: deque[tuple[SimRequest | None, TraceRequest]] = deque()
    pop = buf.popleft
    while True:
        blocks = 0
        try:
            while len(buf) < max_items and blocks < max_blocks:
                item = next(items)
                buf.append(item)
                if item[0] is not None:
                    blocks += len(item[0].block_keys)
        except StopIteration:
            while buf:
                yield pop()
            return
        except Exception:
            while buf:
                yield pop()
            raise
        while buf:
            yield pop()


@dataclass(frozen=True, slots=True)
class SimSummary:
    """Totals of one simulated run, in the terms of vLLM's counters.

    Attributes:
        requests: results seen, rejected ones included.
        counted_requests: requests counted in ``prefix_cache_queries`` (not skip-read, not
            rejected, caching on).
        rejected_requests: requests the cache could never hold (or past ``max_model_len``).
        prompt_tokens: tokens, sum of prompt lengths of counted requests
            (= delta ``vllm:prefix_cache_queries_total``).
        cached_tokens: tokens, sum of hit tokens of counted requests
            (= delta ``vllm:prefix_cache_hits_total``).
        hit_rate: ``cached_tokens / prompt_tokens`` in [0, 1], None when ``prompt_tokens`` is 0.
        all_prompt_tokens: tokens, prompt lengths of every non-rejected request.
        created_cache_tokens: tokens, sum of ``created_cache_tokens``.
        completion_tokens: tokens generated (simulated outputs).
        num_preemptions: preemptions (step model; 0 for sequential replay).
        evicted_blocks: cached blocks evicted (vLLM ``BlockRemoved`` events), None when unknown
            (a summary built from a plain list of results).
        rejected: ``(request_id, reason)`` of the first 100 rejected requests.
        block_size, num_gpu_blocks, hash_algo, mode: the configuration (mode is
            ``sequential`` or ``concurrent``).
    """

    requests: int
    counted_requests: int
    rejected_requests: int
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float | None
    all_prompt_tokens: int
    created_cache_tokens: int
    completion_tokens: int
    num_preemptions: int
    evicted_blocks: int | None
    rejected: tuple[tuple[str, str], ...] = ()
    block_size: int = 16
    num_gpu_blocks: int | None = None
    hash_algo: str = "sha256"
    mode: str = "sequential"

    @classmethod
    def from_results(cls, results: Iterable[RequestResult], config: SimConfig) -> SimSummary:
        """Summarise ``results``: a :class:`SimRun` (consumed to the end; engine counters
        included) or any iterable of :class:`RequestResult` (``evicted_blocks`` then None and
        ``num_preemptions`` summed over results)."""
        if isinstance(results, SimRun):
            for _ in results:
                pass
            return results.summary()
        acc = _Accumulator()
        for r in results:
            acc.add(r)
        return acc.build(config, evicted_blocks=None, num_preemptions=None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``rejected`` as a list of ``{request_id, reason}``)."""
        d = asdict(self)
        d["rejected"] = [{"request_id": i, "reason": r} for i, r in self.rejected]
        return d


@dataclass(slots=True)
class _Accumulator:
    requests: int = 0
    counted: int = 0
    rejected_n: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    all_prompt_tokens: int = 0
    created: int = 0
    completion: int = 0
    preemptions: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)

    def add(self, r: RequestResult) -> None:
        self.requests += 1
        if r.rejected_reason is not None:
            self.rejected_n += 1
            if len(self.rejected) < MAX_LISTED_REJECTIONS:
                self.rejected.append((r.request_id, r.rejected_reason))
            return
        self.all_prompt_tokens += r.prompt_tokens
        self.created += r.created_cache_tokens
        self.completion += r.completion_tokens
        self.preemptions += r.num_preemptions
        if r.counted:
            self.counted += 1
            self.prompt_tokens += r.prompt_tokens
            self.cached_tokens += r.cached_tokens

    def build(self, config: SimConfig, *, evicted_blocks: int | None,
              num_preemptions: int | None) -> SimSummary:
        return SimSummary(
            requests=self.requests,
            counted_requests=self.counted,
            rejected_requests=self.rejected_n,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            hit_rate=(self.cached_tokens / self.prompt_tokens) if self.prompt_tokens else None,
            all_prompt_tokens=self.all_prompt_tokens,
            created_cache_tokens=self.created,
            completion_tokens=self.completion,
            num_preemptions=self.preemptions if num_preemptions is None else num_preemptions,
            evicted_blocks=evicted_blocks,
            rejected=tuple(self.rejected),
            block_size=config.block_size,
            num_gpu_blocks=config.num_gpu_blocks,
            hash_algo=config.hash_algo,
            mode="sequential" if config.concurrency is None else "concurrent",
        )


class _RequestFactory:
    """Turns :class:`TraceRequest` records into :class:`SimRequest` state, or a rejection."""

    def __init__(self, config: SimConfig) -> None:
        check_algo(config.hash_algo)
        if config.block_size < 1:
            raise SimulationError(f"block_size must be >= 1, got {config.block_size}")
        if config.num_gpu_blocks is not None and config.num_gpu_blocks < 2:
            raise SimulationError(
                f"num_gpu_blocks must be >= 2 (block 0 is vLLM's null block), "
                f"got {config.num_gpu_blocks}"
            )
        self.config = config
        self.capacity_blocks = (
            None if config.num_gpu_blocks is None else config.num_gpu_blocks - 1
        )
        self._hashers: dict[tuple[str | None, str | None, str | None], BlockHasher] = {}
        # Digests of recent prompts, shared by this run's hashers (bounded; exact reuse).
        self._memo = PrefixMemo() if config.hash_algo in ("sha256", "xxhash") else None

    def _hasher(self, tr: TraceRequest) -> BlockHasher:
        key = (tr.cache_salt, tr.lora_name, tr.lora_path)
        h = self._hashers.get(key)
        if h is None:
            if len(self._hashers) >= 4096:
                self._hashers.clear()
            c = self.config
            h = self._hashers[key] = BlockHasher(
                algo=c.hash_algo, block_size=c.block_size, seed=c.hash_seed,
                cache_salt=tr.cache_salt, lora_name=tr.lora_name, lora_path=tr.lora_path,
                memo=self._memo,
            )
        return h

    def output_tokens(self, tr: TraceRequest) -> int:
        """Tokens to generate for ``tr`` under the config (0 when outputs are not simulated)."""
        out = tr.output_tokens if self.config.simulate_output else 0
        if self.config.max_model_len is not None:
            out = min(out, self.config.max_model_len - tr.num_prompt_tokens)
        return max(out, 0)

    def reject_reason(self, tr: TraceRequest) -> str | None:
        """Why ``tr`` can never run, or None. Never includes prompt text."""
        c = self.config
        p = tr.num_prompt_tokens
        if p < 1:
            return "empty prompt (num_prompt_tokens < 1)"
        if tr.prompt_token_ids is not None and len(tr.prompt_token_ids) != p:
            return (f"prompt_token_ids has {len(tr.prompt_token_ids)} tokens but "
                    f"num_prompt_tokens is {p}")
        if c.max_model_len is not None and p >= c.max_model_len:
            return f"prompt of {p} tokens reaches max_model_len {c.max_model_len}"
        if self.capacity_blocks is not None:
            peak_tokens = p + max(self.output_tokens(tr), 1) - 1
            need = cdiv(peak_tokens, c.block_size)
            if need > self.capacity_blocks:
                return (f"needs {need} blocks of {c.block_size} tokens for {peak_tokens} "
                        f"tokens; the cache holds {self.capacity_blocks}")
        return None

    def build(self, tr: TraceRequest) -> SimRequest:
        """The simulator state of an accepted request (keys of its full prompt blocks computed)."""
        c = self.config
        out = self.output_tokens(tr)
        if c.hash_algo == "fast" and tr.block_keys is not None:
            keys: list[Hashable] = list(tr.block_keys)
            if len(keys) != tr.num_prompt_tokens // c.block_size:
                raise SimulationError(
                    f"request {tr.request_id} ({tr.source or 'trace'}): {len(keys)} block keys "
                    f"for {tr.num_prompt_tokens} tokens at block size {c.block_size}"
                )
            if tr.cache_salt or tr.lora_name is not None:
                extra = (tr.cache_salt or None, tr.lora_name, tr.lora_path)
                keys = [(extra, k) for k in keys]
            return SimRequest(
                tr.request_id, block_size=c.block_size, prompt_block_keys=keys,
                num_prompt_tokens=tr.num_prompt_tokens, max_tokens=out,
                skip_reading=tr.skip_reading, own_keys=True,
            )
        if tr.prompt_token_ids is None:
            raise SimulationError(
                f"request {tr.request_id} ({tr.source or 'trace'}) has no token ids: hash "
                f"algorithm {c.hash_algo!r} needs them (use --algo fast with block keys)"
            )
        return SimRequest(
            tr.request_id, block_size=c.block_size, prompt_token_ids=tr.prompt_token_ids,
            hasher=self._hasher(tr), max_tokens=out, output_token_ids=tr.output_token_ids,
            skip_reading=tr.skip_reading,
        )


class SimRun(Iterator[RequestResult]):
    """The lazy result stream of :func:`simulate`, with running totals.

    Iterate it for :class:`RequestResult` records; :meth:`summary` gives the totals of the
    results yielded so far (call it after the end for the whole run). ``stats`` holds the engine
    counters and ``manager`` the final cache state (for tests and benchmarks).
    """

    def __init__(self, requests: Iterable[TraceRequest], config: SimConfig, *,
                 read_ahead: bool = False) -> None:
        self.config = config
        self._read_ahead = read_ahead
        self._factory = _RequestFactory(config)
        self.manager = KVCacheManager(
            num_gpu_blocks=config.num_gpu_blocks, block_size=config.block_size,
            enable_caching=config.enable_prefix_caching, max_model_len=config.max_model_len,
        )
        self.stats = EngineStats()
        self._acc = _Accumulator()
        self._it = self._generate(iter(requests))

    def __iter__(self) -> SimRun:
        return self

    def __next__(self) -> RequestResult:
        r = next(self._it)
        self._acc.add(r)
        return r

    @property
    def evicted_blocks(self) -> int:
        """Cached blocks evicted so far."""
        return self.manager.block_pool.num_evicted_blocks

    def summary(self) -> SimSummary:
        """Totals of the results yielded so far, with the engine's counters."""
        return self._acc.build(
            self.config, evicted_blocks=self.evicted_blocks,
            num_preemptions=self.stats.num_preemptions,
        )

    def _prepared(self, requests: Iterator[TraceRequest]) -> Iterator[tuple[SimRequest | None,
                                                                              TraceRequest]]:
        factory = self._factory
        for tr in requests:
            if factory.reject_reason(tr) is not None:
                yield None, tr
            else:
                yield factory.build(tr), tr

    def _generate(self, requests: Iterator[TraceRequest]) -> Iterator[RequestResult]:
        cfg = self.config
        caching = cfg.enable_prefix_caching
        bs = cfg.block_size
        factory = self._factory

        def result(tr: TraceRequest, req: SimRequest | None, admitted_s: float | None,
                   finished_s: float | None) -> RequestResult:
            if req is None:
                return RequestResult(
                    request_id=tr.request_id, arrival_s=tr.arrival_s,
                    prompt_tokens=tr.num_prompt_tokens, cached_tokens=0,
                    created_cache_tokens=0, completion_tokens=0, counted=False,
                    rejected_reason=factory.reject_reason(tr), attrs=tr.attrs,
                )
            cached = max(req.cached_tokens, 0)
            p = req.num_prompt_tokens
            created = max(0, (p // bs) * bs - cached) if caching else 0
            r = RequestResult(
                request_id=tr.request_id, arrival_s=tr.arrival_s, prompt_tokens=p,
                cached_tokens=cached, created_cache_tokens=created,
                completion_tokens=req.max_tokens, counted=caching and not req.skip_reading,
                admitted_s=admitted_s, finished_s=finished_s,
                num_preemptions=req.num_preemptions, attrs=tr.attrs,
            )
            req.release_tokens()
            return r

        if cfg.concurrency is None:
            prepared = self._prepared(requests)
            if self._read_ahead and cfg.hash_algo != "fast":  # prepare a batch ahead
                prepared = read_ahead(prepared, READ_AHEAD_REQUESTS, READ_AHEAD_BLOCKS)
            for tr, req in run_sequential(prepared, self.manager, self.stats):
                yield result(tr, req, tr.arrival_s, tr.arrival_s)
            return
        triples = ((req, tr, tr.arrival_s) for req, tr in self._prepared(requests))
        if cfg.concurrency.observed_clock:
            engine = run_observed(triples, self.manager, self.stats)
        else:
            engine = run_concurrent(triples, self.manager, cfg.concurrency, self.stats)
        for tr, req, finished_s in engine:
            yield result(tr, req, None if req is None else req.admitted_s, finished_s)


def simulate(requests: Iterable[TraceRequest], config: SimConfig, *,
             read_ahead: bool = False) -> SimRun:
    """Replay ``requests`` through the cache model; a lazy iterator of results.

    Args:
        requests: trace requests in trace order (arrival then file order); read lazily.
        config: cache and scheduler configuration. ``config.concurrency`` None replays
            sequentially (exact: each request finishes before the next starts; simulated time
            does not advance, ``admitted_s = finished_s = arrival_s``); otherwise the step model
            of :mod:`prefixscope.replay.scheduler`.
        read_ahead: for a caller that consumes the whole run: sequential replay with a vLLM
            hash reads and hashes a batch of requests (:data:`READ_AHEAD_REQUESTS`, at most
            :data:`READ_AHEAD_BLOCKS` prompt blocks) before running them through the cache,
            which is faster (the hasher and the pool keep their caches warm) and gives the
            same results, with errors raised at the same positions; only the trace is read up
            to one batch earlier. False: each request is read when its result is asked for.

    Returns:
        A :class:`SimRun`: iterate it for :class:`RequestResult` (trace order when sequential,
        completion order when concurrent); ``.summary()`` for the totals.

    Raises:
        SimulationError: invalid configuration (unknown algorithm, fewer than 2 blocks), a
            vLLM hash algorithm on a trace without token ids, or block keys that do not match
            the prompt length. Raised when iteration reaches the offending request.
    """
    return SimRun(requests, config, read_ahead=read_ahead)
