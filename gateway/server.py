"""Build a :class:`~prefixscope.gateway.app.Gateway` from its configuration and serve it with
uvicorn (graceful shutdown: on SIGTERM/SIGINT uvicorn stops accepting connections, lets
in-flight requests and streams finish for up to ``shutdown_grace_s``, then the app's lifespan
flushes and fsyncs the logs and saves the in-process state)."""

from __future__ import annotations


from prefixscope.core.documents import DocumentError, read_document
from prefixscope.core.errors import ConfigError
from prefixscope.core.identity import PublicInventory, load_hmac_key
from prefixscope.gateway.app import Faults, Gateway
from prefixscope.gateway.auth import Authenticator, load_api_keys
from prefixscope.gateway.config import GatewayConfig
from prefixscope.gateway.store import open_store


def read_admin_token(path: str | None) -> str | None:
    """The admin bearer token from its file (None: admin endpoints off).

    Raises:
        ConfigError: unreadable, or shorter than 16 characters.
    """
    if path is None:
        return None
    try:
        token = read_document(path, limit=4096).strip()
    except DocumentError as exc:
        raise ConfigError(f"{path}: cannot read the admin token file: {exc}") from None
    if len(token) < 16:
        raise ConfigError(f"{path}: the admin token needs at least 16 characters")
    return token


def build_gateway(cfg: GatewayConfig, *, faults: Faults | None = None) -> Gateway:
    """A gateway with its key, API keys, inventory, admin token and store from ``cfg``.

    Raises:
        ConfigError: a file named by the configuration is missing or invalid.
    """
    key = load_hmac_key(cfg.hmac_key_file)
    if cfg.api_keys_file is None and not cfg.trusted_proxies:
        raise ConfigError("[gateway] needs api_keys_file or trusted_proxies: the gateway only "
                          "serves requests with a trusted identity")
    auth = Authenticator(api_keys=load_api_keys(cfg.api_keys_file),
                         trusted_proxies=cfg.trusted_proxies, tenant_header=cfg.tenant_header,
                         principal_header=cfg.principal_header, scope_header=cfg.scope_header,
                         epoch_header=cfg.epoch_header)
    inventory = (PublicInventory.from_file(cfg.inventory_file) if cfg.inventory_file
                 else PublicInventory())
    return Gateway(cfg, key, store=open_store(cfg.store, cfg.state_file, max_entries=cfg.registry_max_entries,
                                    entry_ttl_s=cfg.registry_ttl_s), inventory=inventory,
                   authenticator=auth, admin_token=read_admin_token(cfg.admin_token_file),
                   faults=faults)


def serve(cfg: GatewayConfig) -> None:
    """Run the gateway in the foreground until SIGTERM/SIGINT (graceful, see module)."""
    import uvicorn

    gw = build_gateway(cfg)
    config = uvicorn.Config(gw.app, host=cfg.host, port=cfg.port, log_level="warning",
                            access_log=False, lifespan="on",
                            timeout_graceful_shutdown=int(cfg.shutdown_grace_s) or None)
    uvicorn.Server(config).run()
