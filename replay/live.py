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

The live replayer is four modules, one responsibility each (none touches DuckDB;
:mod:`prefixscope.cli.commands.replay_live` calls the ingest path):

- ``prefixscope.replay.live`` (this one): the async client: :class:`LiveConfig`, :class:`LiveResult`,
  :func:`replay_live` / :func:`replay_live_async`, synthetic prompts;
- ``prefixscope.replay.live_metrics``: ``/metrics`` scrapes and run-scoped counter deltas;
- ``prefixscope.replay.live_outputs``: results as usage JSONL lines and as exact token-id traces;
- ``prefixscope.replay.live_run``: a whole run (scrape, send, settle, scrape, write the run directory).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from prefixscope.core.errors import SourceUnavailable, UsageError
from prefixscope.replay.types import TraceRequest

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


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



def with_salt(requests: Iterable[TraceRequest], salt: str | None) -> list[TraceRequest]:
    """The same requests with ``cache_salt`` set to ``salt`` (helper for salted scenarios)."""
    return [replace(r, cache_salt=salt) for r in requests]

