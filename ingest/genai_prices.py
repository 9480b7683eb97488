"""Hosted-model prices from the maintained ``genai-prices`` package (pydantic/genai-prices, MIT).

For every (model, provider) in ``requests`` that the TOML price table (``ingest/prices.py``,
self-hosted shadow prices and overrides) does not price, the package's model entry is expanded
into ``price_tiers`` rows (migration 61) that the savings queries join in SQL
(``store/queries/savings.py``), so a price is applied per request in the store, never per row in
pandas:

1. **Price changes over time**: a model whose prices are a list of conditional prices gets one
   row set per period between their start dates (``valid_from_unix_s``, ``valid_to_unix_s``),
   and per daily interval of a time-of-day price (DeepSeek off-peak: ``day_from_s``,
   ``day_to_s``, UTC seconds of the day). Each period's prices are the package's own choice
   (``ModelInfo.get_prices`` at the period's first instant: the last active conditional price).
2. **Tiers by prompt size**: a tiered price applies its tier rate to *every* token once the
   request's inclusive input exceeds the tier start (``calc_unit_price``: ``total_input_tokens >
   tier.start``). One row per interval of ``prompt_tokens`` between tier starts
   (``min_prompt_tokens`` exclusive, ``max_prompt_tokens`` inclusive), every price at its
   interval's rate: a 300,000-token Claude Sonnet 4.5 request is priced at the >200k rates.
3. **Cache read and write**: ``cache_read_mtok``, ``cache_write_mtok`` and ``cache_write_1h_mtok``.
   A missing cache-read price falls back to the input price (conservative: no saving claimed,
   ``usage-shapes.md`` section 5), a missing write price to the input price (no premium), a
   missing 1 h write price to the 5 min one.
4. The label shown with every cost names the package version:
   ``genai-prices 0.2.3: anthropic claude-sonnet-4-5 (prompt > 200,000 tokens)``.

Model lookup: the request's ``model`` with its ``provider`` (OTLP ``gen_ai.provider.name`` and
LiteLLM ``custom_llm_provider`` names mapped to the package's ids, :data:`PROVIDER_IDS`), then
without a provider; a ``provider/`` prefix of the model name is dropped when it names a
provider. A model the package does not know keeps no price (the report says so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import date, datetime, time as dtime, timedelta, timezone
from decimal import Decimal
from importlib.metadata import version as _dist_version

import duckdb

#: Provider names as sources write them -> genai-prices provider ids.
PROVIDER_IDS = {
    "aws.bedrock": "aws", "aws_bedrock": "aws", "bedrock": "aws", "bedrock_converse": "aws",
    "gcp.gemini": "google", "gcp.vertex_ai": "google", "gemini": "google",
    "vertex_ai": "google", "google": "google", "azure.ai.openai": "azure",
    "azure.ai.inference": "azure", "azure": "azure", "mistral_ai": "mistral",
    "x_ai": "x-ai", "xai": "x-ai", "moonshot": "moonshotai", "together_ai": "together",
    "fireworks_ai": "fireworks", "openai": "openai", "anthropic": "anthropic", "groq": "groq",
    "deepseek": "deepseek", "cohere": "cohere", "perplexity": "perplexity",
}
_OPEN_END = 1e300
_NO_MAX = 9_000_000_000_000_000_000


def package_version() -> str:
    """``genai-prices <version>``: shown wherever a price from the package appears."""
    return f"genai-prices {_dist_version('genai-prices')}"


@dataclass(frozen=True, slots=True)
class TierRow:
    """One ``price_tiers`` row (prices in USD per million tokens, exact decimals)."""

    model: str
    provider_key: str
    valid_from_unix_s: float
    valid_to_unix_s: float
    day_from_s: float
    day_to_s: float
    min_prompt_tokens: int
    max_prompt_tokens: int
    input_per_mtok: Decimal
    cached_input_per_mtok: Decimal
    cache_write_per_mtok: Decimal
    cache_write_1h_per_mtok: Decimal
    output_per_mtok: Decimal
    price_source: str
    genai_provider_id: str
    genai_model_id: str


def _lookup(model: str, provider: str | None):
    """(Provider, ModelInfo) of the package for a stored model name, or None."""
    from genai_prices import data_snapshot

    snap = data_snapshot.get_snapshot()
    known = {p.id for p in snap.providers}
    pid = PROVIDER_IDS.get((provider or "").lower(), (provider or "").lower() or None)
    if pid not in known:
        pid = None
    refs = [model]
    if "/" in model:
        head, tail = model.split("/", 1)
        hid = PROVIDER_IDS.get(head.lower(), head.lower())
        if hid in known:
            refs.insert(0, tail)
            pid = pid or hid
    for ref in refs:
        for p in ([pid, None] if pid else [None]):
            try:
                return snap.find_provider_model(ref, None, p, None)
            except LookupError:
                continue
    return None


def _thresholds(mp) -> list[int]:
    from genai_prices.types import TieredPrices

    starts: set[int] = set()
    for key in ("input_mtok", "cache_read_mtok", "cache_write_mtok", "cache_write_1h_mtok",
                "output_mtok"):
        v = getattr(mp, key, None)
        if isinstance(v, TieredPrices):
            starts.update(t.start for t in v.tiers)
    return sorted(starts)


def _at(v, prompt_tokens: int) -> Decimal | None:
    """The rate of a price at a request of ``prompt_tokens`` inclusive input tokens."""
    from genai_prices.types import TieredPrices

    if v is None:
        return None
    if isinstance(v, TieredPrices):
        rate = v.base
        for tier in reversed(v.tiers):
            if prompt_tokens > tier.start:
                rate = tier.price
                break
        return rate
    return v


def _periods(info) -> list[tuple[float, float, float, float, datetime]]:
    """(valid_from, valid_to, day_from_s, day_to_s, a sample instant) for each distinct
    price period of a model (rule 1)."""
    from genai_prices.types import StartDateConstraint, TimeOfDateConstraint

    if not isinstance(info.prices, list):
        return [(-_OPEN_END, _OPEN_END, 0.0, 86400.0, datetime(2000, 1, 1, tzinfo=timezone.utc))]
    dates: set[date] = set()
    day_cuts: set[float] = {0.0, 86400.0}
    for cp in info.prices:
        c = cp.constraint
        if isinstance(c, StartDateConstraint):
            dates.add(c.start_date)
        elif isinstance(c, TimeOfDateConstraint):
            for t in (c.start_time, c.end_time):
                u = datetime.combine(date(1970, 1, 1), t)
                u = u.replace(tzinfo=t.tzinfo or timezone.utc).astimezone(timezone.utc)
                day_cuts.add(float(u.hour * 3600 + u.minute * 60 + u.second))
    starts = sorted(dates)
    edges = [-_OPEN_END] + [datetime.combine(d, dtime(0), timezone.utc).timestamp()
                            for d in starts] + [_OPEN_END]
    cuts = sorted(day_cuts)
    out = []
    for lo, hi in zip(edges, edges[1:]):
        base = datetime(2000, 1, 1, tzinfo=timezone.utc) if lo == -_OPEN_END else \
            datetime.fromtimestamp(lo, timezone.utc)
        for dlo, dhi in zip(cuts, cuts[1:]):
            out.append((lo, hi, dlo, dhi, base + timedelta(seconds=dlo)))
    return out


def tier_rows(model: str, provider: str | None) -> list[TierRow]:
    """Every ``price_tiers`` row of one stored (model, provider) (rules 1-4; pure).

    Returns:
        The rows, or [] when the package has no entry (or no input/output price) for it.
    """
    found = _lookup(model, provider)
    if found is None:
        return []
    prov, info = found
    version = package_version()
    rows: list[TierRow] = []
    for lo, hi, dlo, dhi, sample in _periods(info):
        mp = info.get_prices(sample)
        if getattr(mp, "input_mtok", None) is None or getattr(mp, "output_mtok", None) is None:
            continue
        starts = _thresholds(mp)
        bounds = [-1, *starts, _NO_MAX]
        for lo_t, hi_t in zip(bounds, bounds[1:]):
            at = lo_t + 1  # any prompt size in (lo_t, hi_t] has the same rates
            inp = _at(mp.input_mtok, at)
            read = _at(getattr(mp, "cache_read_mtok", None), at)
            write = _at(getattr(mp, "cache_write_mtok", None), at) or \
                _at(getattr(mp, "cache_write_5m_mtok", None), at)
            write_1h = _at(getattr(mp, "cache_write_1h_mtok", None), at)
            label = f"{version}: {prov.id} {info.id}"
            if starts:
                label += (f" (prompt <= {hi_t:,} tokens)" if lo_t < 0 else
                          f" (prompt > {lo_t:,} tokens)")
            if dlo > 0 or dhi < 86400:
                label += f" ({_hhmm(dlo)}-{_hhmm(dhi)} UTC)"
            if lo > -_OPEN_END:
                label += f" (from {datetime.fromtimestamp(lo, timezone.utc):%Y-%m-%d})"
            if read is None:
                label += "; no cache-read price: input price used"
            rows.append(TierRow(
                model=model, provider_key=provider or "", valid_from_unix_s=lo,
                valid_to_unix_s=hi, day_from_s=dlo, day_to_s=dhi, min_prompt_tokens=lo_t,
                max_prompt_tokens=hi_t, input_per_mtok=inp,
                cached_input_per_mtok=read if read is not None else inp,
                cache_write_per_mtok=write if write is not None else inp,
                cache_write_1h_per_mtok=write_1h if write_1h is not None else
                (write if write is not None else inp),
                output_per_mtok=_at(mp.output_mtok, at), price_source=label,
                genai_provider_id=prov.id, genai_model_id=info.id))
    return rows


def _hhmm(s: float) -> str:
    return f"{int(s) // 3600:02d}:{int(s) % 3600 // 60:02d}"


@dataclass(frozen=True, slots=True)
class RefreshSummary:
    """What :func:`refresh_genai_prices` did: ``priced`` (model, provider) pairs with rows,
    ``unknown`` ones the package does not know, ``rows`` written, ``version``."""

    priced: list[tuple[str, str]]
    unknown: list[tuple[str, str]]
    rows: int
    version: str


def refresh_genai_prices(con: duckdb.DuckDBPyConnection) -> RefreshSummary:
    """Rebuild ``price_tiers`` for every (model, provider) in ``requests`` that the TOML table
    does not price, in one transaction (readers see the old rows or the new ones).

    Args:
        con: read-write, migrated connection, not inside a transaction.
    """
    from prefixscope.store.queries.savings import replace_price_tiers, unpriced_model_refs

    refs = unpriced_model_refs(con)
    rows: list[TierRow] = []
    priced, unknown = [], []
    for model, provider in refs:
        got = tier_rows(model, provider)
        (priced if got else unknown).append((model, provider))
        rows.extend(got)
    version = package_version()
    replace_price_tiers(con, rows, source_version=version, loaded_unix_s=time.time())
    return RefreshSummary(priced, unknown, len(rows), version)
