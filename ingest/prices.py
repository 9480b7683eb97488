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
import tomllib
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prefixscope.core.errors import ConfigError, SourceUnavailable


class PriceEntry(BaseModel):
    """One ``[models."<name>"]`` table of the price file (prices per million tokens).

    ``cache_write`` defaults to ``input`` (no write premium, as on vLLM); ``cache_write_1h``
    defaults to ``cache_write``. ``cached_input`` is required: a provider without a cache
    discount states ``cached_input = input`` explicitly.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: str = Field(pattern=r"^[A-Z]{3}$")
    input: Decimal = Field(ge=0)
    cached_input: Decimal = Field(ge=0)
    cache_write: Decimal | None = Field(default=None, ge=0)
    cache_write_1h: Decimal | None = Field(default=None, ge=0)
    output: Decimal = Field(ge=0)
    shadow: bool = False
    source: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)

    @field_validator("input", "cached_input", "cache_write", "cache_write_1h", "output",
                     mode="before")
    @classmethod
    def _no_bool(cls, v):
        if isinstance(v, bool):
            raise ValueError("a price must be a number")
        return v


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


def read_price_file(path: str | os.PathLike[str]) -> list[PriceRow]:
    """Parse and validate a price file (pure: no DuckDB).

    Returns:
        One :class:`PriceRow` per model and per alias, in file order.

    Raises:
        SourceUnavailable: the file cannot be read.
        ConfigError: not TOML, an unknown key, a missing or negative price, a bad currency
            code, or a name given twice (the message names the file and the key).
    """
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            data = tomllib.load(fh, parse_float=Decimal)
    except FileNotFoundError as exc:
        raise SourceUnavailable(f"{p}: price file not found") from exc
    except OSError as exc:
        raise SourceUnavailable(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    try:
        parsed = PriceFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first["loc"]
        key = ".".join(f'"{x}"' if i == 1 and loc[0] == "models" else str(x)
                       for i, x in enumerate(loc))
        raise ConfigError(f"{p}: {key}: {first['msg']}") from exc
    rows: list[PriceRow] = []
    seen: set[str] = set()
    for name, e in parsed.models.items():
        write = e.cache_write if e.cache_write is not None else e.input
        write_1h = e.cache_write_1h if e.cache_write_1h is not None else write
        source = e.source
        if e.shadow and not source.lower().startswith("shadow"):
            source = f"shadow price: {source}"
        if parsed.dated and parsed.dated not in source:
            source = f"{source} (table dated {parsed.dated})"
        for alias in [name, *e.aliases]:
            if alias in seen:
                raise ConfigError(f'{p}: models."{name}": name {alias!r} is given twice')
            seen.add(alias)
            rows.append(PriceRow(alias, name, e.currency, e.input, e.cached_input, write,
                                 write_1h, e.output, e.shadow, source))
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
    from prefixscope.store.queries.savings import replace_prices

    rows = read_price_file(path)
    replace_prices(con, rows, price_file=str(Path(path).resolve()), loaded_unix_s=time.time())
    return len({r.priced_as for r in rows})
