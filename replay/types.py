"""Value types shared by the trace readers, the simulator and the output writers.

Ownership: the simulator core defines the semantics; readers fill these records and writers
consume :class:`RequestResult`. New fields are added last, with defaults.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace, as the simulator sees it.

    Attributes:
        request_id: unique within the trace (readers derive it from the line or the trace id).
        arrival_s: seconds since the start of the trace (>= 0); the order of the trace is the
            order of ``arrival_s`` then file order.
        num_prompt_tokens: prompt length in tokens (> 0).
        prompt_token_ids: the exact prompt token ids (length ``num_prompt_tokens``), or None when
            the reader only provides ``block_keys``.
        block_keys: for fast mode: one hashable key per *full* engine block of the prompt, chained
            semantics already applied (equal keys at position i imply equal prefixes up to the end
            of block i). None when only token ids are known.
        output_tokens: number of tokens to generate (>= 0).
        output_token_ids: the real generated ids when known (decode blocks then hash exactly).
        model: served model name, if the trace says.
        cache_salt: vLLM ``cache_salt`` (enters the first block's hash only).
        lora_name, lora_path: LoRA adapter identity (enters every block's hash).
        skip_reading: the request asks for prompt logprobs: it writes blocks but never reads and
            is not counted in ``prefix_cache_queries``/``hits`` (vLLM 0.33 ``vllm/v1/request.py``).
        source: ``file:line`` the request came from (for error messages).
        attrs: free-form string attributes carried to the outputs (tenant digest, scope,
            conversation id, layout name...). Never raw tenant ids or prompt text.
        finished_s: when the recorded answer ended, seconds on the ``arrival_s`` clock (a
            trace recorded from a server: ``replay live``'s ``trace.jsonl``); used only by the
            observed clock (``ConcurrencyConfig.observed_clock``).
    """

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    prompt_token_ids: Sequence[int] | None = None
    block_keys: Sequence[Hashable] | None = None
    output_tokens: int = 0
    output_token_ids: Sequence[int] | None = None
    model: str | None = None
    cache_salt: str | None = None
    lora_name: str | None = None
    lora_path: str | None = None
    skip_reading: bool = False
    source: str | None = None
    attrs: Mapping[str, str] = field(default_factory=dict)
    finished_s: float | None = None


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What the simulator says vLLM would have reported for one request.

    Attributes:
        request_id, arrival_s: copied from the :class:`TraceRequest`.
        prompt_tokens: the prompt length (``usage.prompt_tokens``).
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens``: tokens hit at the first
            admission (a multiple of the block size; 0 for skip-read requests).
        created_cache_tokens: prompt tokens newly written to the cache, in full blocks.
        completion_tokens: output tokens generated.
        counted: True when vLLM counts the request in ``prefix_cache_queries``/``hits``
            (False for skip-read requests).
        admitted_s: simulated time of the first admission (seconds since trace start).
        finished_s: simulated time the request finished.
        num_preemptions: how often it was preempted.
        rejected_reason: None, or why the request could never run (e.g. longer than the cache
            can hold); such requests are reported in the summary, never dropped silently.
        attrs: copied from the trace request.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    cached_tokens: int
    created_cache_tokens: int
    completion_tokens: int
    counted: bool = True
    admitted_s: float | None = None
    finished_s: float | None = None
    num_preemptions: int = 0
    rejected_reason: str | None = None
    attrs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConcurrencyConfig:
    """Step-based scheduler model settings (vLLM ``--max-num-seqs``,
    ``--max-num-batched-tokens``, chunked prefill). Defaults are vLLM 0.33's for a GPU server;
    read the real values from the server when replaying its traffic.

    Attributes:
        max_num_seqs: cap on running requests.
        max_num_batched_tokens: token budget per engine step.
        enable_chunked_prefill: split long prompts across steps.
        step_time_s: simulated seconds per engine step (pacing against arrival times); with
            the two coefficients below, the fixed part of every step.
        step_token_s: seconds added per prefill token scheduled in the step (0 = constant
            step time). A step lasts ``step_time_s + step_token_s * prefill tokens +
            step_decode_s * decodes``; :func:`prefixscope.replay.step_fit.fit_step_time` fits the
            three from a live run's per-request timestamps.
        step_decode_s: seconds added per request decoding (one token) in the step.
        observed_clock: replay on the trace's recorded timeline instead of the step model:
            each request is admitted at its ``arrival_s`` in trace order, decodes evenly until
            its ``finished_s`` and is freed then (``prefixscope.replay.observed_clock``);
            ``max_num_seqs``, the budget and the step times are not used.
        long_prefill_token_threshold: vLLM ``--long-prefill-token-threshold`` (tokens; 0 = no
            cap): a prefill chunk is capped at this many tokens when more than one request is
            eligible (``vllm/v1/core/sched/scheduler.py``, 0.32).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    step_time_s: float = 0.02
    long_prefill_token_threshold: int = 0
    step_token_s: float = 0.0
    step_decode_s: float = 0.0
    observed_clock: bool = False


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How to simulate vLLM's prefix cache.

    Attributes:
        block_size: tokens per KV block (vLLM default 16; CPU backend multiples of 32).
        num_gpu_blocks: vLLM's ``num_gpu_blocks`` including the null block 0, or None for an
            unbounded cache (no eviction).
        hash_algo: ``sha256`` (vLLM default), ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``, or
            ``fast`` (collision-checked keys, same hit counts, no vLLM hash values).
        hash_seed: plays PYTHONHASHSEED (None: vLLM's default seeding).
        enable_prefix_caching: False gives vLLM's caching-off behaviour (no hits).
        simulate_output: generate ``output_tokens`` per request (decode blocks get cached).
        concurrency: None for sequential replay (each request finishes before the next starts,
            exact); else the step-based scheduler model.
        max_model_len: vLLM ``--max-model-len`` in tokens, or None (no limit). A request whose
            prompt reaches it is rejected; output is cut so prompt + output <= max_model_len.
    """

    block_size: int = 16
    num_gpu_blocks: int | None = None
    hash_algo: str = "sha256"
    hash_seed: str | None = None
    enable_prefix_caching: bool = True
    simulate_output: bool = True
    concurrency: ConcurrencyConfig | None = None
    max_model_len: int | None = None
