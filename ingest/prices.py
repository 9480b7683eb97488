"""Price table: a TOML file (``docs/pricing.md``) loaded into the DuckDB ``prices`` table.

Every price is per **million** tokens in the entry's currency, read as an exact decimal (TOML
floats are parsed with :class:`decimal.Decimal`, never binary floats). A self-hosted model has no
token price: give it a *shadow* price (``shadow = true``) whose ``source`` says where the number
comes from; that label is shown wherever a cost computed from it appears.

Loading replaces the whole table in one transaction, so readers see the old table or the new
one, never a mix.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import duckdb
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prefixscope.core.documents import load_config_file
from prefixscope.core.errors import ConfigError


#: Largest price per million tokens read (currency units): far above any real price, and
#: within the store's DECIMAL(18, 6) price columns (1e400 or 1e30 was a DuckDB conversion
#: traceback).
MAX_PRICE_PER_MTOK = Decimal(1_000_000)


class PriceEntry(BaseModel):
    """One ``[models."<name>"]`` table of the price file (prices per million tokens).

    ``cache_write`` defaults to ``input`` (no write premium, as on vLLM); ``cache_write_1h``
    defaults to ``cache_write``. ``cached_input`` is required: a provider without a cache
    discount states ``cached_input = input`` explicitly.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: str = Field(pattern=r"^[A-Z]{3}$")
    input: Decimal | None = Field(default=None, ge=0, le=MAX_PRICE_PER_MTOK)
    cached_input: Decimal | None = Field(default=None, ge=0, le=MAX_PRICE_PER_MTOK)
    cache_write: Decimal | None = Field(default=None, ge=0, le=MAX_PRICE_PER_MTOK)
    cache_write_1h: Decimal | None = Field(default=None, ge=0, le=MAX_PRICE_PER_MTOK)
    output: Decimal | None = Field(default=None, ge=0, le=MAX_PRICE_PER_MTOK)
    shadow: bool = False
    source: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    #: GPU-time shadow price (self-hosted): currency per GPU-hour, and the prefill (and
    #: optionally decode) throughput in tokens per second, or "measured" (from the store).
    gpu_hour_price: Decimal | None = Field(default=None, gt=0)
    prefill_tokens_per_s: Decimal | Literal["measured"] | None = None
    decode_tokens_per_s: Decimal | None = Field(default=None, gt=0)

    @field_validator("input", "cached_input", "cache_write", "cache_write_1h", "output",
                     "gpu_hour_price", "decode_tokens_per_s", mode="before")
    @classmethod
    def _no_bool(cls, v):
        if isinstance(v, bool):
            raise ValueError("a price must be a number")
        return v

    @field_validator("prefill_tokens_per_s", mode="before")
    @classmethod
    def _rate(cls, v):
        if isinstance(v, bool) or (not isinstance(v, str) and v is not None and v <= 0):
            raise ValueError('a throughput must be a positive number or "measured"')
        return v

    @model_validator(mode="after")
    def _complete(self):
        if self.gpu_hour_price is not None:
            if self.prefill_tokens_per_s is None:
                raise ValueError("prefill_tokens_per_s|needed with gpu_hour_price (a number "
                                 'or "measured")')
            if self.output is None and self.decode_tokens_per_s is None:
                raise ValueError("output|needed with gpu_hour_price, or give "
                                 "decode_tokens_per_s")
        else:
            for name in ("input", "cached_input", "output"):
                if getattr(self, name) is None:
                    raise ValueError(f"{name}|Field required (or give gpu_hour_price and "
                                     "prefill_tokens_per_s for a GPU-time shadow price)")
        return self


class PriceFile(BaseModel):
    """The whole file: optional ``dated`` and ``note``, and ``models``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dated: str | None = None
    note: str | None = None
    models: dict[str, PriceEntry] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class PriceRow:
    """A row of the ``prices`` table (per-million-token prices)."""

    model: str
    priced_as: str
    currency: str
    input_per_mtok: Decimal
    cached_input_per_mtok: Decimal
    cache_write_per_mtok: Decimal
    cache_write_1h_per_mtok: Decimal
    output_per_mtok: Decimal
    shadow: bool
    price_source: str


def gpu_time_prices(gpu_hour_price: Decimal, prefill_tokens_per_s: Decimal,
                    decode_tokens_per_s: Decimal | None) -> tuple[Decimal, Decimal | None]:
    """GPU-time shadow prices per million tokens: ``(input, output)``.

    input = GPU-hour price / 3600 / prefill tokens per second x 1e6 (the GPU time a computed
    prompt token costs; a cache hit skips it, so cached input is 0 and a vLLM write carries no
    premium, ``usage-shapes.md`` section 6); output likewise with the decode rate (None when
    no decode rate is given). Rounded to 6 decimals (the ``prices`` columns).
    """
    q = Decimal("0.000001")
    inp = (gpu_hour_price / Decimal(3600) / prefill_tokens_per_s * Decimal(1_000_000)).quantize(q)
    out = None
    if decode_tokens_per_s is not None:
        out = (gpu_hour_price / Decimal(3600) / decode_tokens_per_s
               * Decimal(1_000_000)).quantize(q)
    return inp, out


def read_price_file(path: str | os.PathLike[str], *,
                    measured_prefill_tokens_per_s=None) -> list[PriceRow]:
    """Parse and validate a price file (pure: no DuckDB).

    ``measured_prefill_tokens_per_s(model) -> float | None`` answers
    ``prefill_tokens_per_s = "measured"`` (the loader passes one that reads the store); without
    it, or when it has no measurement, such an entry is a ConfigError.

    Returns:
        One :class:`PriceRow` per model and per alias, in file order.

    Raises:
        SourceUnavailable: the file cannot be read.
        ConfigError: not TOML, an unknown key, a missing or negative price, a bad currency
            code, or a name given twice (the message names the file and the key).
    """
    p = Path(path)
    data = load_config_file(p, what="price file", parse_float=Decimal)
    try:
        parsed = PriceFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        msg = first["msg"]
        if msg.startswith("Value error, ") and "|" in msg:  # an entry-level check names its key
            field, _, msg = msg[len("Value error, "):].partition("|")
            loc = (*loc, field)
        key = ".".join(f'"{x}"' if i == 1 and loc[0] == "models" else str(x)
                       for i, x in enumerate(loc))
        raise ConfigError(f"{p}: {key}: {msg}") from exc
    rows: list[PriceRow] = []
    seen: set[str] = set()
    for name, e in parsed.models.items():
        inp, cached, output, shadow, source = e.input, e.cached_input, e.output, e.shadow, e.source
        if e.gpu_hour_price is not None:
            rate, how = e.prefill_tokens_per_s, "given"
            if rate == "measured":
                got = (measured_prefill_tokens_per_s(name)
                       if measured_prefill_tokens_per_s is not None else None)
                if not got:
                    raise ConfigError(
                        f'{p}: models."{name}".prefill_tokens_per_s: "measured" but the store '
                        "has no vllm:request_prefill_time_seconds and "
                        "vllm:request_prefill_kv_computed_tokens samples for it (ingest "
                        "metrics first, or give a number)")
                rate, how = Decimal(str(round(got, 1))), "measured from vllm:request_prefill_*"
            try:
                inp, decode_out = gpu_time_prices(e.gpu_hour_price, rate, e.decode_tokens_per_s)
            except InvalidOperation:  # past Decimal's precision when quantized: far too big
                inp = decode_out = MAX_PRICE_PER_MTOK + 1
            if any(x is not None and not x <= MAX_PRICE_PER_MTOK for x in (inp, decode_out)):
                raise ConfigError(
                    f'{p}: models."{name}".gpu_hour_price: gives a price over '
                    f"{MAX_PRICE_PER_MTOK:,} {e.currency} per million tokens at this throughput")
            output = output if output is not None else decode_out
            cached = cached if cached is not None else Decimal(0)
            shadow = True
            source = (f"GPU-time estimate: {e.currency} {e.gpu_hour_price} per GPU-hour at "
                      f"{rate:,} prefill tokens/s ({how})"
                      + (f", {e.decode_tokens_per_s:,} decode tokens/s" if
                         e.decode_tokens_per_s is not None and e.output is None else "")
                      + f"; {e.source}")
        write = e.cache_write if e.cache_write is not None else inp
        write_1h = e.cache_write_1h if e.cache_write_1h is not None else write
        if shadow and not source.lower().startswith(("shadow", "gpu-time")):
            source = f"shadow price: {source}"
        if parsed.dated and parsed.dated not in source:
            source = f"{source} (table dated {parsed.dated})"
        for alias in [name, *e.aliases]:
            if alias in seen:
                raise ConfigError(f'{p}: models."{name}": name {alias!r} is given twice')
            seen.add(alias)
            rows.append(PriceRow(alias, name, e.currency, inp, cached, write,
                                 write_1h, output, shadow, source))
    return rows


def load_prices(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str]) -> int:
    """Replace the ``prices`` table with the file's contents, atomically.

    Args:
        con: a read-write, migrated connection, not inside a transaction.
        path: the TOML price file.

    Returns:
        Number of model entries loaded (aliases not counted).

    Raises:
        SourceUnavailable, ConfigError: see :func:`read_price_file` (the table is unchanged).
    """
    from prefixscope.store.queries.savings import measured_prefill_tokens_per_s, replace_prices

    rows = read_price_file(
        path, measured_prefill_tokens_per_s=lambda m: measured_prefill_tokens_per_s(con, m))
    replace_prices(con, rows, price_file=str(Path(path).resolve()), loaded_unix_s=time.time())
    return len({r.priced_as for r in rows})
