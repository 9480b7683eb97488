"""The inputs of a diagnosis: the trace read with its rendered structure, and the exact cache
model driven one request at a time (:mod:`prefixscope.replay.diagnose` attributes, this module
reads and replays).

- :func:`open_trace`: chat request logs are read by ``replay/traces.py``'s chat reader
  (``chat_records``: the same request ids, arrivals, salts, outputs, token ids and skipped
  records as ``replay sim``) with an encoder that keeps the offset map
  (``replay/diagnose_render.py``); other formats go through ``read_trace``.
- :class:`ExactCache`: the request factory, ``KVCacheManager`` and sequential replay of
  ``replay/sim.py``, one request at a time; :func:`replay_totals` replays a whole trace (a
  counterfactual) and equals ``replay sim`` of the same trace, layout and options.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefixscope.replay.diagnose_render import PieceEncoder, Rendered, render_map
from prefixscope.replay.kv_cache_manager import KVCacheManager, SimRequest
from prefixscope.replay.runner import SimRunSpec
from prefixscope.replay.scheduler import EngineStats, run_sequential
from prefixscope.replay.sim import SimSummary, _Accumulator, _RequestFactory
from prefixscope.replay.trace_common import TraceProblem, _Bad, _Reader
from prefixscope.replay.traces import ChatEncoder, chat_records, detect_format, read_trace
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

    @classmethod
    def of(cls, run: SimRunSpec, **more: Any) -> DiagnoseSpec:
        """The diagnosis of the trace and cache of ``run`` (its :data:`RUN_FIELDS`; ``more``:
        ``layout``, ``scope_by_model``)."""
        return cls(**{f: getattr(run, f) for f in RUN_FIELDS}, **more)

    def run_spec(self, **overrides: Any) -> SimRunSpec:
        """The ``replay sim`` run of this trace and cache (sequential, as recorded; ``overrides``
        for the other :class:`SimRunSpec` fields: ``model``, ``label``...)."""
        return SimRunSpec(**({f: getattr(self, f) for f in RUN_FIELDS} | overrides))

    def sim_config(self, *, capacity_blocks: Any = "same") -> SimConfig:
        """The exact model's configuration (sequential replay: :meth:`SimRunSpec.sim_config`;
        ``capacity_blocks`` other than ``"same"`` replaces the spec's)."""
        if capacity_blocks == "same":
            return self.run_spec().sim_config()
        return self.run_spec(capacity_blocks=capacity_blocks).sim_config()


#: The fields a :class:`DiagnoseSpec` shares with :class:`SimRunSpec` (same names, meanings).
RUN_FIELDS = ("trace", "format", "block_size", "capacity_blocks", "algo", "hash_id_block_size",
              "output_tokens", "max_model_len", "tokenizer_dir", "limit", "hash_seed", "strict")



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

    Chat traces are read by :func:`prefixscope.replay.traces.chat_records` (``replay sim``'s
    reader: the same requests), rendered with an offset map. Other formats go through :func:`prefixscope.replay.traces.read_trace`.

    Raises:
        SourceUnavailable, UsageError, ConfigError, ParseError: as ``read_trace``.
    """
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
    # Validate as read_trace does (missing file, bad options), then read with the offset map.
    read_trace(spec.trace, format="chat", block_size=spec.block_size,
               tokenizer_dir=spec.tokenizer_dir, output_tokens=spec.output_tokens, limit=0)
    r = _Reader(p, strict=spec.strict, output_tokens=spec.output_tokens, limit=spec.limit)
    items = chat_records(r, tokenizer_dir=spec.tokenizer_dir, layout=lay,
                         encoder=_RenderingEncoder)
    return TraceSource(items=items, problems=r.problems, format="chat", stats=r.stats)


_ENCODERS: dict[str, PieceEncoder] = {}


class _RenderingEncoder(ChatEncoder):
    """The chat reader's encoder with the rendered prompt's offset map (``render_map``, the same
    ids as the tokenizer's chat template)."""

    def __init__(self, tok: Any) -> None:
        super().__init__(tok)
        key = str(tok.directory)
        enc = _ENCODERS.get(key)
        if enc is None:
            enc = _ENCODERS[key] = PieceEncoder(tok)
        self.pieces = enc

    def encode(self, text: str) -> list[int]:
        return self.pieces.encode_with_offsets(text)[0]

    def render(self, body: Any) -> tuple[list[int], Rendered]:
        try:
            rendered = render_map(self.tok, self.pieces, body)
        except (TypeError, AttributeError) as exc:  # a message or tool of the wrong shape
            raise _Bad(getattr(exc, "field", None), str(exc) or type(exc).__name__) from exc
        return rendered.ids, rendered


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
