"""The inputs of a diagnosis: the trace read with its rendered structure, and the exact cache
model driven one request at a time (:mod:`prefixscope.replay.diagnose` attributes, this module
reads and replays).

- :func:`open_trace`: chat request logs are read as ``replay/traces.py`` reads them (same request
  ids, arrivals, salts, outputs, token ids) and rendered with an offset map
  (``replay/diagnose_render.py``); other formats go through ``read_trace``.
- :class:`ExactCache`: the request factory, ``KVCacheManager`` and sequential replay of
  ``replay/sim.py``, one request at a time; :func:`replay_totals` replays a whole trace (a
  counterfactual) and equals ``replay sim`` of the same trace, layout and options.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefixscope.replay.diagnose_render import PieceEncoder, Rendered, render_map
from prefixscope.replay.kv_cache_manager import KVCacheManager, SimRequest
from prefixscope.replay.scheduler import EngineStats, run_sequential
from prefixscope.replay.sim import SimSummary, _Accumulator, _RequestFactory
from prefixscope.replay.trace_common import TraceProblem, _Bad, _Reader
from prefixscope.replay.types import SimConfig, TraceRequest

@dataclass
class DiagnoseSpec:
    """What to diagnose and with which cache (the options of ``replay sim``).

    Attributes:
        trace, format, block_size, capacity_blocks, algo, hash_id_block_size, output_tokens,
            max_model_len, tokenizer_dir, limit, hash_seed, strict: as :class:`SimRunSpec`.
        layout: a :class:`~prefixscope.replay.layouts.Layout` applied before rendering.
        scope_by_model: the request's model name enters every block hash as a LoRA adapter's
            name does (one engine serving several models as adapters); off: one shared cache,
            exactly as ``replay sim``.
    """

    trace: str
    format: str = "auto"
    block_size: int = 16
    capacity_blocks: int | None = None
    algo: str = "sha256"
    hash_id_block_size: int = 512
    output_tokens: str = "trace"
    max_model_len: int | None = None
    tokenizer_dir: str | None = None
    layout: Any = None
    limit: int | None = None
    hash_seed: str | None = None
    strict: bool = False
    scope_by_model: bool = False

    def sim_config(self, *, capacity_blocks: Any = "same") -> SimConfig:
        """The exact model's configuration (sequential replay)."""
        cap = self.capacity_blocks if capacity_blocks == "same" else capacity_blocks
        return SimConfig(block_size=self.block_size, num_gpu_blocks=cap,
                         hash_algo=self.algo, hash_seed=self.hash_seed,
                         simulate_output=self.output_tokens == "trace",
                         max_model_len=self.max_model_len)



# --------------------------------------------------------------------------------------------
# reading: chat requests with their rendered structure, or any trace without
# --------------------------------------------------------------------------------------------


@dataclass
class TraceSource:
    """A trace opened for diagnosis: ``items`` yields ``(TraceRequest, Rendered | None)``;
    ``problems`` fills while reading (unrenderable requests named ``file:line``)."""

    items: Iterator[tuple[TraceRequest, Rendered | None]]
    problems: list[TraceProblem]
    format: str
    stats: dict[str, int]


def open_trace(spec: DiagnoseSpec, *, layout: Any = "spec") -> TraceSource:
    """Open ``spec.trace`` (``layout`` overrides ``spec.layout``; None = as recorded).

    Chat traces are read as ``replay/traces.py`` reads them (same request ids, arrivals,
    salts, outputs and token ids: ``replay sim`` replays the same requests), rendered with an
    offset map. Other formats go through :func:`prefixscope.replay.traces.read_trace`.

    Raises:
        SourceUnavailable, UsageError, ConfigError, ParseError: as ``read_trace``.
    """
    from prefixscope.replay.traces import detect_format, read_trace

    lay = spec.layout if layout == "spec" else layout
    p = Path(spec.trace)
    fmt = spec.format
    if fmt == "auto" and p.exists():
        fmt = detect_format(p)
    if fmt != "chat":
        read = read_trace(spec.trace, format=spec.format, hash_id_block_size=spec.hash_id_block_size,
                          block_size=spec.block_size, output_tokens=spec.output_tokens,
                          strict=spec.strict, layout=lay, limit=spec.limit)
        return TraceSource(items=((tr, None) for tr in read.requests), problems=read.problems,
                           format=read.format, stats=read.stats)
    # Validate as read_trace does (missing file, bad options), then read ourselves.
    read_trace(spec.trace, format="chat", block_size=spec.block_size,
               tokenizer_dir=spec.tokenizer_dir, output_tokens=spec.output_tokens, limit=0)
    r = _Reader(p, strict=spec.strict, output_tokens=spec.output_tokens, limit=spec.limit)
    return TraceSource(items=_read_chat_rendered(r, spec.tokenizer_dir, lay), problems=r.problems,
                       format="chat", stats=r.stats)


_ENCODERS: dict[str, Any] = {}


def _encoder(tokenizer_dir: str | os.PathLike[str] | None) -> tuple[Any, PieceEncoder]:
    from prefixscope.replay.tokenization import load_chat_tokenizer

    tok = load_chat_tokenizer(tokenizer_dir)
    key = str(tok.directory)
    enc = _ENCODERS.get(key)
    if enc is None:
        enc = _ENCODERS[key] = PieceEncoder(tok)
    return tok, enc


def _read_chat_rendered(r: _Reader, tokenizer_dir: Any, layout: Any
                        ) -> Iterator[tuple[TraceRequest, Rendered]]:
    from prefixscope.core.errors import ConfigError
    from prefixscope.replay.chat_requests import chat_body, output_tokens_of
    from prefixscope.replay.traces import _arrival, _cache_salt

    tok, enc = _encoder(tokenizer_dir)
    end_of_turn = tok.end_of_turn
    stem = r.stem
    previous = 0.0
    for lineno, obj in r.jsonl():
        if r.done():
            return
        try:
            body = chat_body(obj)
            if layout is not None:
                body = layout.apply(body)
            arrival = _arrival(obj, previous)
            salt = _cache_salt(body) or _cache_salt(obj)
            out = output_tokens_of(obj, body)
            out_ids = None
            response_text = obj.get("response_text")
            if response_text is not None:
                if not isinstance(response_text, str):
                    raise _Bad("$.response_text", "not a string")
                out_ids = enc.encode_with_offsets(response_text + end_of_turn)[0]
                if "output_tokens" not in obj:
                    out = len(out_ids)
            try:
                rendered = render_map(tok, enc, body)
            except ConfigError as exc:
                raise _Bad("$.messages", f"cannot be rendered: {str(exc).split(': ', 1)[-1]}")
            if not rendered.ids:
                raise _Bad("$.messages", "renders to an empty prompt")
        except _Bad as exc:
            r.bad(r.location, lineno, exc)
            continue
        except (ValueError, TypeError, AttributeError) as exc:
            r.bad(r.location, lineno, _Bad(getattr(exc, "field", None),
                                           str(exc) or type(exc).__name__))
            continue
        previous = arrival
        rid = obj.get("request_id")
        attrs = {"trace": stem}
        if obj.get("conversation") is not None:
            attrs["conversation"] = str(obj["conversation"])
        if layout is not None:
            attrs["layout"] = layout.name
        model = body.get("model")
        logprobs = body.get("prompt_logprobs") is not None or (
            bool(body.get("echo")) and body.get("logprobs") not in (None, False))
        r.stats["requests"] += 1
        ids = rendered.ids
        yield TraceRequest(
            request_id=str(rid) if rid is not None else f"{stem}:{lineno}",
            arrival_s=arrival, num_prompt_tokens=len(ids), prompt_token_ids=ids,
            output_tokens=out if r.keep_output else 0,
            output_token_ids=out_ids if r.keep_output else None,
            model=model if isinstance(model, str) else None, cache_salt=salt,
            skip_reading=logprobs, source=f"{r.location}:{lineno}", attrs=attrs,
        ), rendered


# --------------------------------------------------------------------------------------------
# the exact model, one request at a time
# --------------------------------------------------------------------------------------------


class ExactCache:
    """The exact sequential cache model of ``replay sim`` driven one request at a time.

    :meth:`run` returns the finished :class:`SimRequest` (its ``block_keys`` and tokens still
    held: call :meth:`release` after reading them) or None for a rejected request.
    ``summary()`` equals ``simulate(...).summary()`` of the same requests.
    """

    def __init__(self, config: SimConfig, *, scope_by_model: bool = False) -> None:
        self.config = config
        self.factory = _RequestFactory(config)
        self.manager = KVCacheManager(num_gpu_blocks=config.num_gpu_blocks,
                                      block_size=config.block_size,
                                      enable_caching=config.enable_prefix_caching,
                                      max_model_len=config.max_model_len)
        self.stats = EngineStats()
        self.acc = _Accumulator()
        self.scope_by_model = scope_by_model

    def prepare(self, tr: TraceRequest) -> TraceRequest:
        """The request as the model sees it (the model name as an adapter name when
        ``scope_by_model``)."""
        if self.scope_by_model and tr.lora_name is None and tr.model:
            return replace(tr, lora_name=tr.model, lora_path=tr.model)
        return tr

    def run(self, tr: TraceRequest) -> tuple[SimRequest | None, Any]:
        """Replay one request; (finished request or None, its :class:`RequestResult`)."""
        from prefixscope.replay.types import RequestResult

        tr = self.prepare(tr)
        f = self.factory
        reason = f.reject_reason(tr)
        if reason is not None:
            res = RequestResult(request_id=tr.request_id, arrival_s=tr.arrival_s,
                                prompt_tokens=tr.num_prompt_tokens, cached_tokens=0,
                                created_cache_tokens=0, completion_tokens=0, counted=False,
                                rejected_reason=reason)
            self.acc.add(res)
            return None, res
        req = f.build(tr)
        for _ in run_sequential(iter([(req, tr)]), self.manager, self.stats):
            pass
        bs = self.config.block_size
        cached = max(req.cached_tokens, 0)
        caching = self.config.enable_prefix_caching
        res = RequestResult(
            request_id=tr.request_id, arrival_s=tr.arrival_s, prompt_tokens=req.num_prompt_tokens,
            cached_tokens=cached,
            created_cache_tokens=max(0, (req.num_prompt_tokens // bs) * bs - cached) if caching else 0,
            completion_tokens=req.max_tokens, counted=caching and not req.skip_reading)
        self.acc.add(res)
        return req, res

    @staticmethod
    def release(req: SimRequest | None) -> None:
        """Drop the finished request's tokens and keys."""
        if req is not None:
            req.release_tokens()

    def summary(self) -> SimSummary:
        """Totals so far, as ``SimRun.summary()``."""
        return self.acc.build(self.config,
                              evicted_blocks=self.manager.block_pool.num_evicted_blocks,
                              num_preemptions=self.stats.num_preemptions)


def replay_totals(spec: DiagnoseSpec, *, layout: Any = "spec",
                  capacity_blocks: Any = "same") -> SimSummary:
    """Replay the trace through the exact model only (a counterfactual); its summary.

    Equals ``replay sim`` of the same trace, layout and options (sequential)."""
    src = open_trace(spec, layout=layout)
    cache = ExactCache(spec.sim_config(capacity_blocks=capacity_blocks),
                       scope_by_model=spec.scope_by_model)
    for tr, _ in src.items:
        req, _res = cache.run(tr)
        cache.release(req)
    return cache.summary()
