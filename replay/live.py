"""Live replay: send a trace to an OpenAI-compatible server (vLLM first) and record what it says.

The one module of ``replay/`` that talks HTTP (httpx, async). It sends each
:class:`~replay.types.TraceRequest` to ``/v1/completions`` (token-id prompts: the exact way to
replay, vLLM ``vllm/entrypoints/openai/completion/protocol.py``) or ``/v1/chat/completions``,
streams the answer to measure TTFT, asks for the usage object in the final chunk
(``stream_options.include_usage``) and, on vLLM, for the generated token ids
(``return_token_ids``). Outputs are fixed-length when the trace knows them
(``ignore_eos`` + ``min_tokens`` = ``max_tokens`` = ``output_tokens``), so the server computes
exactly the blocks the simulator predicts.

Pacing:
- closed loop (default): at most ``concurrency`` requests in flight, sent in trace order;
- open loop (``rate_from_trace``): request *i* is sent at ``arrival_s / speedup`` seconds after
  the start, still capped at ``concurrency`` in flight.

Follow-ups: a request whose ``attrs["follows"]`` names an earlier request id R waits for R and is
sent as ``prompt(R) + output(R) + own prompt tokens`` (an agent or chat loop feeding the real
answer back), so decode blocks of R are hit exactly as in production.

Metrics: :func:`scrape_metrics` reads ``/metrics`` (text exposition); :func:`counter_deltas`
turns a before/after pair into run-scoped deltas (vLLM counters are cumulative since the server
started; a drop is a restart and counts from the new value).

Nothing here touches DuckDB: :mod:`prefixscope.commands.replay_live` writes the files and calls the
ingest path.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from prefixscope.errors import SourceUnavailable, UsageError
from replay.types import TraceRequest

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Counters whose run-scoped deltas are stored (vLLM 0.32/0.33 names as exposed, tokens unless
# noted; vllm/v1/metrics/loggers.py).
DELTA_COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",  # preemptions, not tokens
    "vllm:request_success_total",  # requests, summed over finished_reason
)


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """How to send a trace to a server.

    Attributes:
        base_url: server root, e.g. ``http://127.0.0.1:8011`` (``/v1/...`` is appended).
        endpoint: ``completions`` (token-id prompts, exact) or ``chat`` (the prompt ids are
            detokenized by the server's ``/detokenize`` and sent as one user message; the chat
            template then adds tokens, so prompt_tokens differ from the trace).
        model: model name to send; None asks ``/v1/models`` for the first one.
        concurrency: maximum requests in flight (>= 1).
        rate_from_trace: open loop: send at ``arrival_s / speedup`` seconds after the start.
        speedup: time compression for ``rate_from_trace`` (> 0; 10 = ten times faster).
        salt_per_tenant: send ``cache_salt`` = the request's ``tenant_digest`` attribute (a
            digest, never a raw tenant id) when the request has no ``cache_salt`` of its own.
        fixed_output: force exactly ``output_tokens`` generated tokens (``ignore_eos``,
            ``min_tokens``, ``max_tokens``); requests with 0 output tokens still generate 1.
        stream: stream the answer (needed for TTFT).
        return_token_ids: ask vLLM for prompt and output token ids (``return_token_ids``).
        max_retries: retries after a 429/5xx answer or a connection error.
        backoff_s: first retry delay in seconds (doubled each retry, with jitter).
        timeout_s: per-request timeout in seconds.
        api_key: sent as ``Authorization: Bearer ...`` when set.
        synth_token_min, synth_token_max: token id range [min, max) for prompts synthesised from
            hash-only traces (ids must exist in the model's vocabulary).
        block_size: tokens per synthesised block for hash-only traces (the server's block size).
        seed: seed for synthesised prompts and retry jitter.
    """

    base_url: str
    endpoint: str = "completions"
    model: str | None = None
    concurrency: int = 1
    rate_from_trace: bool = False
    speedup: float = 1.0
    salt_per_tenant: bool = False
    fixed_output: bool = True
    stream: bool = True
    return_token_ids: bool = True
    max_retries: int = 5
    backoff_s: float = 0.5
    timeout_s: float = 300.0
    api_key: str | None = None
    synth_token_min: int = 5
    synth_token_max: int = 4096
    block_size: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise UsageError(f"endpoint must be 'completions' or 'chat', not {self.endpoint!r}")
        if self.concurrency < 1:
            raise UsageError("concurrency must be >= 1")
        if not self.speedup > 0:
            raise UsageError("speedup must be > 0")


@dataclass(frozen=True, slots=True)
class LiveResult:
    """What the server reported for one request.

    Attributes:
        request_id: the trace's request id.
        response_id: the server's id (``cmpl-...``/``chatcmpl-...``), None on failure.
        endpoint: ``completions`` or ``chat``.
        model: model name sent.
        arrival_s: the trace's arrival time (seconds since trace start).
        sent_unix_s: when the (last, successful) attempt was sent (Unix seconds).
        ttft_ms: send to first generated token, milliseconds (None when not streaming/failed).
        latency_ms: send to the end of the answer, milliseconds.
        prompt_tokens: ``usage.prompt_tokens`` (inclusive of cached tokens).
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens``; None = not reported.
        created_cache_tokens: ``usage.prompt_tokens_details.created_cache_tokens`` (vLLM chat).
        completion_tokens: ``usage.completion_tokens``.
        prompt_token_ids: the prompt as sent (completions) or as the server reports it (chat).
        output_token_ids: generated ids when the server returned them, else None.
        cache_salt: the salt sent, if any.
        attempts: number of HTTP attempts (1 = no retry).
        http_status: status of the last attempt (None for a connection error).
        error: None on success, else a short reason (no prompt text).
        usage: the raw usage object as received (for the ingest JSONL).
        attrs: the trace request's attributes.
    """

    request_id: str
    response_id: str | None
    endpoint: str
    model: str
    arrival_s: float
    sent_unix_s: float
    ttft_ms: float | None
    latency_ms: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    created_cache_tokens: int | None
    completion_tokens: int | None
    prompt_token_ids: tuple[int, ...] | None = None
    output_token_ids: tuple[int, ...] | None = None
    cache_salt: str | None = None
    attempts: int = 1
    http_status: int | None = None
    error: str | None = None
    usage: Mapping[str, Any] | None = None
    attrs: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the server answered with a usage object."""
        return self.error is None


class _RetryableError(Exception):
    def __init__(self, status: int | None, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def synth_prompt_ids(req: TraceRequest, *, block_size: int, token_min: int, token_max: int,
                     seed: int = 0) -> list[int]:
    """Token ids for a request that only has ``block_keys`` (hash-only traces such as Mooncake).

    Block i becomes ``block_size`` ids drawn from a PRNG seeded by (seed, block key repr), so
    equal keys give equal blocks and the chain semantics of the keys carry over; the tokens after
    the last full block are drawn from the request id (unique, never shared).

    Returns:
        ``num_prompt_tokens`` ids in ``[token_min, token_max)``.
    """
    ids: list[int] = []
    for key in req.block_keys or ():
        digest = hashlib.sha256(f"{seed}|{key!r}".encode()).digest()
        rng = random.Random(digest)
        ids.extend(rng.randrange(token_min, token_max) for _ in range(block_size))
    ids = ids[: req.num_prompt_tokens]
    rest = req.num_prompt_tokens - len(ids)
    if rest > 0:
        rng = random.Random(hashlib.sha256(f"{seed}|tail|{req.request_id}".encode()).digest())
        ids.extend(rng.randrange(token_min, token_max) for _ in range(rest))
    return ids


def _prompt_ids(req: TraceRequest, cfg: LiveConfig) -> list[int]:
    if req.prompt_token_ids is not None:
        return list(req.prompt_token_ids)
    return synth_prompt_ids(req, block_size=cfg.block_size, token_min=cfg.synth_token_min,
                            token_max=cfg.synth_token_max, seed=cfg.seed)


def _usage_ints(usage: Mapping[str, Any] | None) -> tuple[int | None, int | None, int | None, int | None]:
    if not usage:
        return None, None, None, None
    details = usage.get("prompt_tokens_details") or None
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    created = details.get("created_cache_tokens") if isinstance(details, Mapping) else None
    return usage.get("prompt_tokens"), cached, created, usage.get("completion_tokens")


class LiveReplayer:
    """Sends requests to one server; use :func:`replay_live` unless you need the pieces."""

    def __init__(self, config: LiveConfig, client: httpx.AsyncClient):
        self.cfg = config
        self.client = client
        self.model: str = config.model or ""
        self._rng = random.Random(config.seed)

    async def resolve_model(self) -> str:
        """The model name to send: the configured one, else the first of ``/v1/models``."""
        if self.model:
            return self.model
        try:
            r = await self.client.get("/v1/models")
            r.raise_for_status()
            self.model = r.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise SourceUnavailable(
                f"{self.cfg.base_url}/v1/models: cannot read the model name ({type(exc).__name__}); "
                "pass --model"
            ) from exc
        return self.model

    def _body(self, req: TraceRequest, prompt_ids: list[int], salt: str | None,
              chat_text: str | None) -> dict[str, Any]:
        cfg = self.cfg
        body: dict[str, Any] = {"model": self.model}
        if cfg.endpoint == "completions":
            body["prompt"] = prompt_ids
        else:
            body["messages"] = [{"role": "user", "content": chat_text or ""}]
        n_out = max(1, int(req.output_tokens))
        body["max_tokens"] = n_out
        if cfg.fixed_output:
            body["min_tokens"] = n_out
            body["ignore_eos"] = True
        body["temperature"] = 0.0
        if cfg.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if cfg.return_token_ids:
            body["return_token_ids"] = True
        if salt is not None:
            body["cache_salt"] = salt
        return body

    async def _detokenize(self, prompt_ids: list[int]) -> str:
        r = await self.client.post("/detokenize", json={"model": self.model, "tokens": prompt_ids})
        r.raise_for_status()
        return r.json()["prompt"]

    async def _attempt(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One HTTP attempt. Returns a dict with response_id, usage, output ids, timings."""
        t0 = time.perf_counter()
        sent = time.time()
        ttft = None
        out_ids: list[int] = []
        prompt_ids_reported: list[int] | None = None
        usage = None
        response_id = None
        got_ids = False
        if not self.cfg.stream:
            r = await self.client.post(path, json=body)
            if r.status_code in RETRY_STATUSES:
                raise _RetryableError(r.status_code, f"HTTP {r.status_code}")
            if r.status_code >= 400:
                return {"status": r.status_code, "error": f"HTTP {r.status_code}: {_short(r.text)}",
                        "sent": sent}
            data = r.json()
            response_id = data.get("id")
            usage = data.get("usage")
            prompt_ids_reported = data.get("prompt_token_ids")
            for ch in data.get("choices") or []:
                if ch.get("token_ids") is not None:
                    got_ids = True
                    out_ids.extend(ch["token_ids"])
                if ch.get("prompt_token_ids") is not None:
                    prompt_ids_reported = ch["prompt_token_ids"]
            return {"status": r.status_code, "response_id": response_id, "usage": usage,
                    "out_ids": out_ids if got_ids else None, "prompt_ids": prompt_ids_reported,
                    "ttft_ms": None, "latency_ms": (time.perf_counter() - t0) * 1000, "sent": sent}
        async with self.client.stream("POST", path, json=body) as r:
            if r.status_code in RETRY_STATUSES:
                await r.aread()
                raise _RetryableError(r.status_code, f"HTTP {r.status_code}")
            if r.status_code >= 400:
                text = (await r.aread()).decode(errors="replace")
                return {"status": r.status_code, "error": f"HTTP {r.status_code}: {_short(text)}",
                        "sent": sent}
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    continue
                if "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"]
                    msg = err.get("message", "") if isinstance(err, Mapping) else str(err)
                    return {"status": r.status_code, "error": f"stream error: {_short(msg)}",
                            "sent": sent}
                response_id = response_id or chunk.get("id")
                if chunk.get("prompt_token_ids") is not None:
                    prompt_ids_reported = chunk["prompt_token_ids"]
                for ch in chunk.get("choices") or []:
                    ids = ch.get("token_ids")
                    if ch.get("prompt_token_ids") is not None:
                        prompt_ids_reported = ch["prompt_token_ids"]
                    text = ch.get("text")
                    if text is None:
                        text = (ch.get("delta") or {}).get("content")
                    if ids is not None:
                        got_ids = True
                        out_ids.extend(ids)
                    if ttft is None and (ids or text):
                        ttft = (time.perf_counter() - t0) * 1000
                if chunk.get("usage"):
                    usage = chunk["usage"]
        return {"status": r.status_code, "response_id": response_id, "usage": usage,
                "out_ids": out_ids if got_ids else None, "prompt_ids": prompt_ids_reported,
                "ttft_ms": ttft, "latency_ms": (time.perf_counter() - t0) * 1000, "sent": sent}

    async def send(self, req: TraceRequest, prompt_ids: list[int]) -> LiveResult:
        """Send one request with retries; never raises for server-side failures."""
        cfg = self.cfg
        salt = req.cache_salt
        if salt is None and cfg.salt_per_tenant:
            salt = req.attrs.get("tenant_digest") or None
        path = "/v1/completions" if cfg.endpoint == "completions" else "/v1/chat/completions"
        chat_text = None
        attempts = 0
        delay = cfg.backoff_s
        last_status: int | None = None
        last_reason = "not sent"
        while attempts <= cfg.max_retries:
            attempts += 1
            try:
                if cfg.endpoint == "chat" and chat_text is None:
                    chat_text = await self._detokenize(prompt_ids)
                res = await self._attempt(path, self._body(req, prompt_ids, salt, chat_text))
            except _RetryableError as exc:
                last_status, last_reason = exc.status, exc.reason
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                last_status, last_reason = None, f"{type(exc).__name__}"
            else:
                if "error" in res:
                    return self._failed(req, salt, attempts, res["status"], res["error"], res["sent"])
                p, c, created, comp = _usage_ints(res["usage"])
                if res["usage"] is None:
                    return self._failed(req, salt, attempts, res["status"],
                                        "no usage object in the answer", res["sent"])
                sent_ids = prompt_ids if cfg.endpoint == "completions" else res["prompt_ids"]
                return LiveResult(
                    request_id=req.request_id, response_id=res["response_id"],
                    endpoint=cfg.endpoint, model=self.model, arrival_s=req.arrival_s,
                    sent_unix_s=res["sent"], ttft_ms=res["ttft_ms"], latency_ms=res["latency_ms"],
                    prompt_tokens=p, cached_tokens=c, created_cache_tokens=created,
                    completion_tokens=comp,
                    prompt_token_ids=tuple(sent_ids) if sent_ids is not None else None,
                    output_token_ids=tuple(res["out_ids"]) if res["out_ids"] is not None else None,
                    cache_salt=salt, attempts=attempts, http_status=res["status"],
                    usage=res["usage"], attrs=dict(req.attrs),
                )
            if attempts <= cfg.max_retries:
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
                delay *= 2
        return self._failed(req, salt, attempts, last_status,
                            f"gave up after {attempts} attempts: {last_reason}", time.time())

    def _failed(self, req: TraceRequest, salt: str | None, attempts: int, status: int | None,
                reason: str, sent: float) -> LiveResult:
        return LiveResult(
            request_id=req.request_id, response_id=None, endpoint=self.cfg.endpoint,
            model=self.model, arrival_s=req.arrival_s, sent_unix_s=sent, ttft_ms=None,
            latency_ms=None, prompt_tokens=None, cached_tokens=None, created_cache_tokens=None,
            completion_tokens=None, cache_salt=salt, attempts=attempts, http_status=status,
            error=reason, attrs=dict(req.attrs),
        )


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


async def replay_live_async(requests: Iterable[TraceRequest], config: LiveConfig, *,
                            on_result: Callable[[LiveResult], None] | None = None,
                            client: httpx.AsyncClient | None = None) -> list[LiveResult]:
    """Send every request and return the results in **completion order**.

    Args:
        requests: the trace, in trace order (``arrival_s`` ascending for open-loop pacing).
        config: see :class:`LiveConfig`.
        on_result: called once per finished request (progress bars).
        client: an httpx client to reuse (its base_url must be the server root); tests pass one.

    Returns:
        One :class:`LiveResult` per request, completion order. Failed requests are included with
        ``error`` set (never dropped); a follow-up of a failed request fails too.

    Raises:
        SourceUnavailable: the server cannot be reached to resolve the model name.
        UsageError: a follow-up names a request that is not earlier in the trace.
    """
    reqs = list(requests)
    own_client = client is None
    if client is None:
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        client = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/"), headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=config.concurrency + 4),
        )
    try:
        player = LiveReplayer(config, client)
        await player.resolve_model()
        seen: set[str] = set()
        for r in reqs:
            dep = r.attrs.get("follows")
            if dep is not None and dep not in seen:
                raise UsageError(f"{r.source or r.request_id}: attrs.follows names {dep!r}, "
                                 "which is not an earlier request of the trace")
            seen.add(r.request_id)
        done: dict[str, asyncio.Future[LiveResult]] = {
            r.request_id: asyncio.get_running_loop().create_future() for r in reqs
        }
        prompts: dict[str, list[int]] = {}
        sem = asyncio.Semaphore(config.concurrency)
        results: list[LiveResult] = []
        t_start = time.perf_counter()

        async def one(req: TraceRequest, ticket: asyncio.Event | None) -> None:
            try:
                dep = req.attrs.get("follows")
                own = _prompt_ids(req, config)
                if dep is not None:
                    prev = await done[dep]
                    if not prev.ok or prev.prompt_token_ids is None or prev.output_token_ids is None:
                        res = player._failed(req, None, 0, None,
                                             f"follows {dep}, which failed or has no token ids",
                                             time.time())
                        prompts[req.request_id] = own
                        _finish(req, res)
                        return
                    own = list(prev.prompt_token_ids) + list(prev.output_token_ids) + own
                prompts[req.request_id] = own
                if config.rate_from_trace:
                    wait = req.arrival_s / config.speedup - (time.perf_counter() - t_start)
                    if wait > 0:
                        await asyncio.sleep(wait)
                async with sem:
                    if ticket is not None:
                        ticket.set()
                    res = await player.send(req, own)
                _finish(req, res)
            except BaseException as exc:  # keep followers from waiting forever
                if not done[req.request_id].done():
                    done[req.request_id].set_exception(exc)
                raise

        def _finish(req: TraceRequest, res: LiveResult) -> None:
            results.append(res)
            done[req.request_id].set_result(res)
            if on_result is not None:
                on_result(res)

        tasks = []
        for req in reqs:
            if config.rate_from_trace:
                tasks.append(asyncio.create_task(one(req, None)))
            else:
                # Closed loop: start the next task only once this one holds a slot (a follow-up
                # first waits for the request it follows), so requests leave in trace order.
                ticket = asyncio.Event()
                tasks.append(asyncio.create_task(one(req, ticket)))
                waiter = asyncio.create_task(ticket.wait())
                await asyncio.wait({waiter, tasks[-1]}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
        await asyncio.gather(*tasks)
        return results
    finally:
        if own_client:
            await client.aclose()


def replay_live(requests: Iterable[TraceRequest], config: LiveConfig, *,
                on_result: Callable[[LiveResult], None] | None = None) -> list[LiveResult]:
    """Synchronous wrapper of :func:`replay_live_async` (runs its own event loop)."""
    return asyncio.run(replay_live_async(requests, config, on_result=on_result))


# ----------------------------------------------------------------------------- metrics


def scrape_metrics(base_url: str, *, timeout_s: float = 10.0,
                   api_key: str | None = None) -> tuple[str, float]:
    """GET ``{base_url}/metrics``; returns (exposition text, scrape time in Unix seconds).

    Raises:
        SourceUnavailable: the endpoint cannot be read (names the URL and the reason).
    """
    url = base_url.rstrip("/") + "/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url, timeout=timeout_s, headers=headers)
        r.raise_for_status()
    except httpx.HTTPError as exc:
        raise SourceUnavailable(f"{url}: cannot scrape ({type(exc).__name__}: {exc})") from exc
    return r.text, time.time()


def counter_totals(text: str, names: Sequence[str] = DELTA_COUNTERS) -> dict[str, float]:
    """Sum each named counter over all its series (labels) in one exposition.

    Names are as exposed (``..._total``). Uses prometheus_client's parser; a counter absent from
    the exposition is absent from the result.
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names)
    totals: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in wanted:
                totals[s.name] = totals.get(s.name, 0.0) + float(s.value)
    return totals


def counter_deltas(before: str, after: str,
                   names: Sequence[str] = DELTA_COUNTERS) -> dict[str, float]:
    """Run-scoped increase of each counter between two expositions of the same server.

    ``after - before``; a drop means the server restarted during the run, and the increase then
    counts from zero (``after``), as for any Prometheus counter. A counter missing from either
    exposition is left out.
    """
    b, a = counter_totals(before, names), counter_totals(after, names)
    out: dict[str, float] = {}
    for name in names:
        if name in a and name in b:
            out[name] = a[name] - b[name] if a[name] >= b[name] else a[name]
    return out


def wait_for_counters(base_url: str, before_text: str, *, prompt_tokens: int,
                      timeout_s: float = 30.0, poll_s: float = 0.5,
                      api_key: str | None = None) -> tuple[str, float, bool]:
    """Scrape until Δ ``vllm:prefix_cache_queries_total`` reaches ``prompt_tokens``.

    vLLM records the counters at admission and exports them with the engine's next stats
    update, so they can lag the last response (vLLM's own end-to-end test polls up to 30 s).

    Returns:
        (exposition text, scrape time in Unix seconds, settled). ``settled`` is False when the
        timeout passed first (the last scrape is returned anyway) or the server has no such
        counter.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        text, ts = scrape_metrics(base_url, api_key=api_key)
        d = counter_deltas(before_text, text, ("vllm:prefix_cache_queries_total",))
        q = d.get("vllm:prefix_cache_queries_total")
        if q is not None and q >= prompt_tokens:
            return text, ts, True
        if q is None or time.monotonic() >= deadline:
            return text, ts, False
        time.sleep(poll_s)


# ----------------------------------------------------------------------------- outputs


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
            relative to the first send).

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
        out.append(TraceRequest(
            request_id=r.request_id, arrival_s=max(0.0, arrival),
            num_prompt_tokens=len(r.prompt_token_ids or ()),
            prompt_token_ids=tuple(r.prompt_token_ids or ()),
            output_tokens=len(r.output_token_ids or ()),
            output_token_ids=tuple(r.output_token_ids or ()),
            model=r.model, cache_salt=r.cache_salt, attrs=dict(r.attrs),
        ))
    return out


def with_salt(requests: Iterable[TraceRequest], salt: str | None) -> list[TraceRequest]:
    """The same requests with ``cache_salt`` set to ``salt`` (helper for salted scenarios)."""
    return [replace(r, cache_salt=salt) for r in requests]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` in [0, 100] of ``values`` (None when empty)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    k = max(0, min(len(vals) - 1, math.ceil(q / 100 * len(vals)) - 1))
    return vals[k]


# ----------------------------------------------------------------------------- a whole run


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


def new_run_id(prefix: str = "live") -> str:
    """``<prefix>-YYYYmmddTHHMMSSZ-<6 hex>`` (UTC; unique enough for concurrent runs)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{prefix}-{stamp}-{random.getrandbits(24):06x}"


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
    ``ingest.live_run.ingest_live_run``.

    With other traffic on the server the deltas include it; the counters are server-wide.

    Args:
        requests: the trace, in trace order.
        config: see :class:`LiveConfig`.
        out_dir: directory to create (must not hold a previous run).
        run_id: default :func:`new_run_id`.
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
    run_id = run_id or new_run_id()
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
        deltas = counter_deltas(before_text, after_text)
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


def write_token_trace(results: Iterable[LiveResult], path: Any, *,
                      order: Sequence[str] | None = None) -> int:
    """Write answered requests as a ``token-ids`` trace (``replay.traces`` reads it back).

    One line per request, in ``order`` (trace request ids) or send order: ``request_id``,
    ``arrival_s`` (seconds after the first send), ``prompt_token_ids`` (as sent),
    ``output_token_ids`` (as generated), ``output_tokens``, ``cache_salt``, ``model``.

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
            }) + "\n")
    return len(trace)
