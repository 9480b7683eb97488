"""Configuration: one TOML file plus environment variables, validated by pydantic.

Lookup order for the file: ``--config`` (where a command has it), ``$PREFIXSCOPE_CONFIG``,
``./prefixscope.toml``; no file means defaults. Environment variables override the file for the
values that name one (``PREFIXSCOPE_DB``, ``PREFIXSCOPE_HMAC_KEY_FILE``, ``PREFIXSCOPE_HMAC_KEY``,
``PREFIXSCOPE_SMTP_PASSWORD``...). Secrets are never read from the repository.

Sections (see ``docs/config.md``): ``[store]``, ``[pricing]``, ``[alerts]``, ``[identity]``,
``[dashboard]``, ``[retention]``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prefixscope.core.documents import DocumentError, parse_toml, read_document
from prefixscope.core.errors import ConfigError, UsageError

DEFAULT_DB_PATH = "data/prefixscope.duckdb"


def default_db_path() -> str:
    """The database path used when ``--db`` is not given: ``$PREFIXSCOPE_DB`` or
    ``data/prefixscope.duckdb`` (relative to the working directory)."""
    return os.environ.get("PREFIXSCOPE_DB") or DEFAULT_DB_PATH


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreConfig(_Section):
    """``[store]``: where the DuckDB file lives and how long to wait for its lock."""

    db: str = Field(default_factory=default_db_path)
    lock_timeout_s: float = 30.0


class PricingConfig(_Section):
    """``[pricing]``: the price table file (TOML, see ``docs/metrics.md#cost``)."""

    prices_file: str = "data/prices.toml"


class WebhookConfig(_Section):
    """One ``[[alerts.webhooks]]`` table: where the daily report is also POSTed
    (``docs/alerts.md#webhooks``; ``prefixscope.alerts.webhook``).

    ``name`` identifies it in the sends log (``webhook:NAME``: letters, digits, ``._-``); the
    URL comes from exactly one of ``url``, ``url_file`` (a file holding it) or ``url_env`` (an
    environment variable): a Slack webhook URL holds its token, so prefer the file or the
    variable. ``format``: ``slack`` (``{"text": ...}``, also taken by Mattermost and
    Rocket.Chat) or ``json`` (the report's figures). ``attempts``, ``backoff_s``, ``timeout_s``
    default to the email's ``smtp_attempts``, ``smtp_backoff_s``, ``smtp_timeout_s``."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")  # Rust regex: $ ends the text
    url: str | None = None
    url_file: str | None = None
    url_env: str | None = None
    format: str = Field("slack", pattern=r"^(slack|json)$")
    attempts: int | None = Field(None, ge=1, le=20)
    backoff_s: float | None = Field(None, ge=0.0, le=3600.0)
    timeout_s: float | None = Field(None, gt=0.0, le=600.0)


class AlertsConfig(_Section):
    """``[alerts]``: thresholds and delivery of the daily report (see ``docs/alerts.md``).

    ``hit_rate_threshold`` is a fraction in [0, 1]; ``min_query_tokens`` is the volume (prompt
    tokens per day) under which a day reads NO DATA instead of OK/ALERT. A metrics source is
    STALE when its last scrape of the day is older than ``max(stale_min_s, stale_after_scrapes
    x its median scrape interval)`` at the end of the day. SMTP delivery makes ``smtp_attempts``
    attempts, waiting ``smtp_backoff_s`` doubled each time. ``timezone`` and the values of
    ``per_model_threshold`` are checked when the report runs (``prefixscope.core.report.threshold_for``).
    """

    hit_rate_threshold: float = Field(0.5, ge=0.0, le=1.0)
    per_model_threshold: dict[str, float] = Field(default_factory=dict)
    min_query_tokens: int = Field(1000, ge=0)
    timezone: str = "UTC"
    dashboard_url: str = "http://localhost:8501"
    stale_after_scrapes: float = Field(4.0, gt=0.0)
    stale_min_s: float = Field(900.0, ge=0.0)
    top_changes: int = Field(5, ge=0)
    smtp_host: str = "localhost"
    smtp_port: int = 25
    smtp_security: str = Field("none", pattern="^(none|starttls|ssl)$")
    smtp_user: str | None = None
    smtp_password_file: str | None = None
    smtp_ca_file: str | None = None
    smtp_timeout_s: float = Field(30.0, gt=0.0)
    smtp_attempts: int = Field(5, ge=1)
    smtp_backoff_s: float = Field(2.0, ge=0.0)
    mail_from: str = "prefixscope@localhost"
    recipients: list[str] = Field(default_factory=list)
    recipients_by_model: dict[str, list[str]] = Field(default_factory=dict)
    recipients_by_scope: dict[str, list[str]] = Field(default_factory=dict)
    webhooks: list[WebhookConfig] = Field(default_factory=list)


class IdentityConfig(_Section):
    """``[identity]``: the server-side HMAC key (a file path; never the key itself)."""

    hmac_key_file: str | None = None
    public_inventory_file: str | None = None


class DashboardConfig(_Section):
    """``[dashboard]``: refresh interval of cached query results (seconds; the pages also
    re-run on their own at this interval while **Live** is on), ``live``: whether the sidebar's
    **Live** toggle starts on (default true; false for a dashboard on a large database whose
    pages take longer than the interval, or for measuring it) and ``public_url``, the URL users
    open the served dashboard at (the daily email links there; default
    ``[alerts] dashboard_url``)."""

    cache_ttl_s: float = 15.0
    live: bool = True
    public_url: str | None = None


class RetentionConfig(_Section):
    """``[retention]``: how long raw rows and rollups stay in the DuckDB file, and where
    ``prefixscope archive`` writes the raw rows it removes (``docs/retention.md``).

    ``raw_days``: production ``requests`` and ``metric_samples`` older than this many whole
    UTC days are archived, then deleted (never deleted without an archive).
    ``decision_days``: the same for ``gateway_decisions`` (None = ``raw_days``). ``rollup_days``
    (at least ``raw_days``): rollup rows older than this are deleted. ``archive``: a local
    folder, or ``s3://``, ``gs://``, ``r2://`` or ``https://`` (read and written through
    DuckDB's ``httpfs`` extension); None = no archive, nothing raw is deleted. The ``s3_*``
    keys configure the DuckDB secret for object storage (key id and secret only from the
    environment: ``PREFIXSCOPE_S3_KEY_ID`` / ``PREFIXSCOPE_S3_SECRET``, else DuckDB's
    ``credential_chain``). ``extension_directory``: where DuckDB looks for (and installs)
    ``httpfs``; ``extension_repository``: a local folder or URL mirroring DuckDB's
    extension repository (``INSTALL httpfs FROM ...``), for machines without network access
    to DuckDB's own.
    """

    raw_days: int = Field(14, ge=1)
    rollup_days: int = Field(400, ge=1)
    decision_days: int | None = Field(None, ge=1)
    archive: str | None = None
    s3_region: str | None = None
    s3_endpoint: str | None = None
    s3_url_style: str | None = Field(None, pattern="^(vhost|path)$")
    s3_use_ssl: bool = True
    extension_directory: str | None = None
    extension_repository: str | None = None

    def model_post_init(self, __context) -> None:  # noqa: D401 - pydantic hook
        if self.rollup_days < self.raw_days:
            raise ValueError(
                f"rollup_days ({self.rollup_days}) must be at least raw_days ({self.raw_days}):"
                " the rollups answer the ranges the raw rows no longer hold")


class Settings(_Section):
    """All settings. Build with :func:`load_settings`."""

    store: StoreConfig = Field(default_factory=StoreConfig)
    pricing: PricingConfig = Field(default_factory=PricingConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    dashboard: DashboardConfig = Field(default_factory=DashboardConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Load settings from a TOML file and the environment.

    Args:
        path: explicit file; else ``$PREFIXSCOPE_CONFIG``; else ``./prefixscope.toml`` if present.

    Returns:
        Validated, immutable :class:`Settings`.

    Raises:
        ConfigError: the file is unreadable, not TOML, or has an unknown key or a bad value
            (the message names the file and the key).
    """
    candidate = path or os.environ.get("PREFIXSCOPE_CONFIG")
    data: dict = {}
    source = "<defaults>"
    if candidate is None and Path("prefixscope.toml").is_file():
        candidate = "prefixscope.toml"
    if candidate is not None:
        source = str(candidate)
        try:
            data = parse_toml(read_document(candidate))
        except DocumentError as exc:
            if exc.missing:
                raise ConfigError(f"{source}: config file not found") from None
            raise ConfigError(f"{source}: {exc}") from None
    env_db = os.environ.get("PREFIXSCOPE_DB")
    if env_db:
        data.setdefault("store", {})["db"] = env_db
    env_url = os.environ.get("PREFIXSCOPE_DASHBOARD_URL")
    if env_url:
        data.setdefault("dashboard", {})["public_url"] = env_url
    env_key = os.environ.get("PREFIXSCOPE_HMAC_KEY_FILE")
    if env_key:
        data.setdefault("identity", {})["hmac_key_file"] = env_key
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{source}: {key}: {first['msg']}") from exc


#: Set by ``prefixscope dashboard`` for its server: the address it serves at
#: (``http://localhost:PORT``), the email preview's link when no URL is configured.
SERVED_URL_ENV = "PREFIXSCOPE_SERVED_URL"


def checked_url(url: str, key: str, error: type[Exception] = ConfigError) -> str:
    """``url`` when it is an ``http://`` or ``https://`` URL with a host (the dashboard link of
    the daily email).

    Raises:
        ``error`` (ConfigError by default, UsageError for a flag or env variable): another
        scheme (``javascript:``, ``file:``, ``data:``...), no host, spaces or control
        characters; ``key`` names the flag, env variable or config key.
    """
    from urllib.parse import urlsplit

    from prefixscope.core.bounds import escape_line

    try:
        parts = urlsplit(url)
        ok = (parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
              and not any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url))
        _ = parts.port  # ValueError: a port that is not a number
    except ValueError:
        ok = False
    if not ok:
        shown = escape_line(url if len(url) <= 80 else url[:80] + "...")
        raise error(f"{key}: '{shown}' is not an http:// or https:// URL with a host")
    return url


def dashboard_url(settings: Settings, override: str | None = None) -> str:
    """The URL of the served dashboard that the daily email links to, first of:

    1. ``override`` (``prefixscope report daily --dashboard-url``);
    2. ``[dashboard] public_url``, or env ``PREFIXSCOPE_DASHBOARD_URL`` (which overrides the
       file, as the other environment variables do);
    3. ``[alerts] dashboard_url`` when the config file sets it;
    4. env ``PREFIXSCOPE_SERVED_URL``: inside a dashboard started by ``prefixscope dashboard
       --host H --port P``, its own address (``http://localhost:P`` for a loopback or
       wildcard host), so the Alerts page's email preview links to the port it is served on;
    5. ``http://localhost:8501`` (``[alerts] dashboard_url``'s default).

    Raises:
        UsageError: ``override`` or env ``PREFIXSCOPE_DASHBOARD_URL`` is not an http(s) URL
            with a host (:func:`checked_url`). ConfigError: the config file's URL is not.
    """
    if override:
        return checked_url(override, "--dashboard-url", UsageError)
    public = settings.dashboard.public_url
    if public:
        if public == os.environ.get("PREFIXSCOPE_DASHBOARD_URL"):
            return checked_url(public, "PREFIXSCOPE_DASHBOARD_URL", UsageError)
        return checked_url(public, "dashboard.public_url")
    if "dashboard_url" in settings.alerts.model_fields_set:
        return checked_url(settings.alerts.dashboard_url, "alerts.dashboard_url")
    return os.environ.get(SERVED_URL_ENV) or settings.alerts.dashboard_url


def served_url(host: str, port: int) -> str:
    """The address a browser on this machine opens for a server bound to ``host:port``:
    ``localhost`` for loopback and wildcard hosts (``127.0.0.1``, ``0.0.0.0``, ``::``)."""
    h = host.strip("[]")
    if h in ("", "0.0.0.0", "::", "127.0.0.1", "::1", "localhost"):
        h = "localhost"
    elif ":" in h:
        h = f"[{h}]"
    return f"http://{h}:{int(port)}"
