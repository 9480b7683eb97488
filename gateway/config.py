"""Gateway configuration: the ``[gateway]`` table of a TOML file, validated by pydantic.

Every key has a default except ``upstreams``; ``docs/gateway.md#configuration`` lists them.
Secrets (the HMAC key, the admin token, API keys) are never in this file: it names files that
hold them (the API key file holds only SHA-256 digests of keys).
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from prefixscope.core.documents import DocumentError, parse_toml, read_document
from prefixscope.core.errors import ConfigError

MODES = ("shadow", "tenant", "public")


class Declared(BaseModel):
    """Digests declared by the operator; each one wins over what discovery finds.

    ``adapters`` maps a served adapter name (a LoRA module of ``/v1/models``) to its digest.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_digest: str | None = None
    tokenizer_digest: str | None = None
    runtime_digest: str | None = None
    prompt_bundle_digest: str | None = None
    adapters: dict[str, str] = Field(default_factory=dict)


class GatewayConfig(BaseModel):
    """``[gateway]``: where to listen, which upstreams, identity, rollout mode and logs.

    Times are seconds, sizes bytes. ``store`` is ``memory`` (one gateway) or a ``redis://``
    URL (several replicas share the registry and the permit gate).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    upstreams: list[str] = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    instance: str = Field("gateway", pattern=r"^[A-Za-z0-9._:/@+-]{1,200}$")
    mode: Literal["shadow", "tenant", "public"] = "shadow"
    hmac_key_file: str | None = None
    api_keys_file: str | None = None
    trusted_proxies: list[str] = Field(default_factory=list)
    tenant_header: str = "x-prefixscope-tenant"
    principal_header: str = "x-prefixscope-principal"
    scope_header: str = "x-prefixscope-scope"
    epoch_header: str = "x-prefixscope-auth-epoch"
    inventory_file: str | None = None
    policy_revision: int = Field(1, ge=0)
    declared: Declared = Field(default_factory=Declared)
    block_size: int | None = Field(None, ge=1)
    store: str = "memory"
    state_file: str | None = None
    registry_max_entries: int = Field(1_000_000, ge=1)
    registry_ttl_s: int = Field(7 * 86400, ge=60)
    log_dir: str = "logs/gateway"
    rotate_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    rotate_keep: int = Field(10, ge=1)
    fsync_interval_s: float = Field(0.2, gt=0.0)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    connect_timeout_s: float = Field(5.0, gt=0.0)
    read_timeout_s: float = Field(120.0, gt=0.0)
    pool_size: int = Field(256, ge=1)
    admin_token_file: str | None = None
    admin_allow_remote: bool = False
    metrics_namespace_labels: int = Field(0, ge=0, le=1000)
    shutdown_grace_s: float = Field(30.0, ge=0.0)
    client_header_timeout_s: float = Field(10.0, gt=0.0)
    client_body_timeout_s: float = Field(30.0, gt=0.0)
    max_connections: int = Field(2048, ge=1)
    max_header_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    max_inflight_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    retry_after_s: int = Field(1, ge=0, le=3600)
    workers: int = Field(1, ge=1, le=64)
    tokenize: Literal["off", "upstream"] = "off"

    @model_validator(mode="after")
    def _inflight_holds_one_body(self) -> GatewayConfig:
        """``max_inflight_body_bytes`` is at least ``max_body_bytes`` (else no request of the
        largest allowed size could ever be read)."""
        if self.max_inflight_body_bytes < self.max_body_bytes:
            raise ValueError(f"max_inflight_body_bytes ({self.max_inflight_body_bytes}) must be "
                             f"at least max_body_bytes ({self.max_body_bytes})")
        return self

    @field_validator("upstreams")
    @classmethod
    def _upstream_urls(cls, v: list[str]) -> list[str]:
        """Each upstream is an ``http://`` or ``https://`` URL with a host (a vLLM base URL)."""
        from urllib.parse import urlsplit

        for u in v:
            try:
                parts = urlsplit(u)
                parts.port  # noqa: B018 (raises ValueError on a bad port)
            except ValueError:
                parts = None
            if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
                    or any(ch.isspace() for ch in u)):
                raise ValueError(f"{u[:200]!r} is not an http:// or https:// URL with a host "
                                 "(e.g. http://127.0.0.1:8000)")
        return v


def load_gateway_config(path: str | os.PathLike[str] | None = None, **overrides: object
                        ) -> GatewayConfig:
    """Read ``[gateway]`` from a TOML file (None: only ``overrides``), apply non-None overrides.

    Raises:
        ConfigError: unreadable file, invalid TOML, or a key that fails validation (the message
            names the key).
    """
    data: dict = {}
    if path is not None:
        try:
            doc = parse_toml(read_document(path))
        except DocumentError as exc:
            prefix = "cannot read: " if exc.unreadable else ""
            raise ConfigError(f"{path}: {prefix}{exc}") from None
        section = doc.get("gateway", {})
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: gateway: not a table")
        data = dict(section)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return GatewayConfig(**data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "gateway"
        raise ConfigError(f"{path or 'gateway config'}: [gateway] {where}: "
                          f"{first['msg'].removeprefix('Value error, ')}") from None
