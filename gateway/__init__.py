"""prefixscope gateway: a cache-identity reverse proxy in front of vLLM (docs/gateway.md)."""
