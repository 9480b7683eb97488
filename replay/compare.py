"""A/B comparison of two simulated runs of one trace (prompt layouts, or cache sizes).

:func:`compare_runs` reports, for runs A and B and their difference B - A:

- ``hit_rate`` = Σ cached_tokens / Σ prompt_tokens over counted requests (fraction);
- ``prompt_tokens``, ``cached_tokens``, ``created_cache_tokens``, ``completion_tokens`` (tokens);
- with a :class:`Price`: ``cost_without_cache``, ``cost_with_cache`` and ``saved`` in the price's
  currency (see :func:`run_cost`).

A layout can change the prompt length too (moved lines are tokenised in a new context), so
compare cached tokens *and* cost, not the hit rate alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from prefixscope.replay.sim import SimSummary

MTOK = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class Price:
    """Per-million-token prices of one model (exact decimals) and where they came from.

    Attributes:
        model: the price-table entry.
        currency: ISO 4217 code.
        input_per_mtok, cached_input_per_mtok, cache_write_per_mtok, output_per_mtok: prices per
            million tokens (cache write = input price means no write premium).
        shadow: True for a self-hosted model's shadow price (label it so wherever shown).
        price_source: the label shown with every number.
    """

    model: str
    currency: str
    input_per_mtok: Decimal
    cached_input_per_mtok: Decimal
    cache_write_per_mtok: Decimal
    output_per_mtok: Decimal
    shadow: bool = False
    price_source: str = ""


def run_cost(summary: SimSummary, price: Price) -> dict[str, Decimal]:
    """Cost of a simulated run at ``price`` (currency units, exact decimals).

    With P = prompt tokens, C = cached tokens, W = created_cache_tokens (written to the cache),
    O = completion tokens, of the non-rejected requests::

        cost_without_cache = (P * input + O * output) / 1e6
        cost_with_cache    = ((P - C - W) * input + C * cached_input + W * cache_write
                              + O * output) / 1e6
        saved              = cost_without_cache - cost_with_cache
                           = (C * (input - cached_input) - W * (cache_write - input)) / 1e6

    (the formula of ``docs/metrics.md`` "Cost and savings": cached tokens times the discount,
    minus the write premium).
    """
    p = Decimal(summary.all_prompt_tokens)
    c = Decimal(summary.cached_tokens)
    w = Decimal(summary.created_cache_tokens)
    o = Decimal(summary.completion_tokens)
    without = (p * price.input_per_mtok + o * price.output_per_mtok) / MTOK
    with_cache = ((p - c - w) * price.input_per_mtok + c * price.cached_input_per_mtok
                  + w * price.cache_write_per_mtok + o * price.output_per_mtok) / MTOK
    return {"cost_without_cache": without, "cost_with_cache": with_cache,
            "saved": without - with_cache}


def _side(summary: SimSummary, price: Price | None, extra: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = {
        "requests": summary.requests,
        "rejected_requests": summary.rejected_requests,
        "prompt_tokens": summary.prompt_tokens,
        "cached_tokens": summary.cached_tokens,
        "hit_rate": summary.hit_rate,
        "created_cache_tokens": summary.created_cache_tokens,
        "completion_tokens": summary.completion_tokens,
        "capacity_blocks": summary.num_gpu_blocks,
        "block_size": summary.block_size,
    }
    if price is not None:
        d.update({k: float(v) for k, v in run_cost(summary, price).items()})
    d.update(extra)
    return d


def compare_runs(a: SimSummary, b: SimSummary, *, price: Price | None = None,
                 a_extra: dict[str, Any] | None = None,
                 b_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"a": {...}, "b": {...}, "delta": {...}, "price": {...} | None}``; ``delta`` holds
    B - A for every number both sides have (``hit_rate`` None when either side has none)."""
    side_a = _side(a, price, a_extra or {})
    side_b = _side(b, price, b_extra or {})
    delta: dict[str, Any] = {}
    for key in ("prompt_tokens", "cached_tokens", "created_cache_tokens", "completion_tokens",
                "cost_without_cache", "cost_with_cache", "saved"):
        if key in side_a and key in side_b:
            delta[key] = side_b[key] - side_a[key]
    delta["hit_rate"] = (None if a.hit_rate is None or b.hit_rate is None
                         else b.hit_rate - a.hit_rate)
    return {"a": side_a, "b": side_b, "delta": delta,
            "price": None if price is None else {k: (str(v) if isinstance(v, Decimal) else v)
                                                  for k, v in asdict(price).items()}}
