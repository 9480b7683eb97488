"""``prefixscope gateway``: the cache-identity reverse proxy in front of vLLM (docs/gateway.md)."""

from __future__ import annotations

from typing import Annotated

import typer


def gateway_cmd(
    config: Annotated[str | None, typer.Option(
        "--config", help="TOML file with a [gateway] table (docs/gateway.md).")] = None,
    upstream: Annotated[list[str] | None, typer.Option(
        "--upstream", help="vLLM base URL (repeat for several; overrides the file).")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Listen address.")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Listen port.")] = None,
    mode: Annotated[str | None, typer.Option(
        "--mode", help="shadow, tenant or public (overrides the file).")] = None,
    log_dir: Annotated[str | None, typer.Option(
        "--log-dir", help="Folder of usage.jsonl and decisions.jsonl.")] = None,
    hmac_key_file: Annotated[str | None, typer.Option(
        "--hmac-key-file", help="Server-side HMAC key (outside the repository).")] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", min=1, max=64, help="Worker processes on one port (more than 1 needs "
        "store = redis://...; each writes LOG_DIR/worker-N/).")] = None,
) -> None:
    """Serve an OpenAI-compatible proxy that applies cache scope, salts and acceptance.

    Clients call it instead of vLLM (/v1/chat/completions, /v1/completions, /v1/messages,
    /v1/models); it writes one usage record and one decision record per request
    (ingest them with `ingest requests` and `ingest decisions`) and serves /metrics.

    Example: prefixscope gateway --config /etc/prefixscope/gateway.toml
    """
    from prefixscope.gateway.config import load_gateway_config
    from prefixscope.gateway.server import serve

    cfg = load_gateway_config(config, upstreams=upstream or None, host=host, port=port,
                              mode=mode, log_dir=log_dir, hmac_key_file=hmac_key_file,
                              workers=workers)
    serve(cfg)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``gateway``."""
    groups["app"].command("gateway")(gateway_cmd)
