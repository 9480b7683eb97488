"""Upstream discovery: the models an upstream serves and the digests of what shapes its tokens.

From each upstream (``cache-identity.md#identity``), unless declared in ``[gateway.declared]``:

- ``GET /v1/models``: ``id``, ``root`` (the weights' path or hub name), ``parent`` (set for a
  LoRA adapter: the base model's id). ``model_digest`` = SHA-256 of ``model:<base root>``;
  ``tokenizer_digest`` = SHA-256 of ``tokenizer:<base root>`` and ``prompt_bundle_digest`` =
  SHA-256 of ``bundle:<base root>`` (vLLM loads tokenizer and chat template from the model
  folder unless started with others: then declare them); an adapter's ``adapter_digest`` =
  SHA-256 of ``adapter:<id>:<root>``, the base model's is ``""`` (a declared
  ``adapters = {name = digest}`` wins for any served name).
- ``GET /version`` and ``vllm:cache_config_info`` of ``GET /metrics``: ``runtime_digest`` =
  SHA-256 of ``runtime:<version>`` + the cache settings that change block hashes
  (:data:`RUNTIME_LABELS`); ``block_size`` from the same labels.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import httpx

from prefixscope.core.identity import sha256_hex

#: ``vllm:cache_config_info`` labels that change what a block hash means.
RUNTIME_LABELS = ("block_size", "cache_dtype", "prefix_caching_hash_algo", "calculate_kv_scales",
                  "sliding_window", "kv_sharing_fast_prefill")
_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class ModelInfo:
    """One served model (or adapter) and the digests of its versions."""

    model: str
    upstreams: list[str] = field(default_factory=list)
    model_digest: str = ""
    tokenizer_digest: str = ""
    runtime_digest: str = ""
    adapter_digest: str = ""
    prompt_bundle_digest: str = ""
    block_size: int = 16
    runtime: str = ""


def cache_config_labels(metrics_text: str) -> dict[str, str]:
    """Labels of the first ``vllm:cache_config_info`` sample ({} when absent)."""
    m = _INFO.search(metrics_text)
    return dict(_LABEL.findall(m.group(1))) if m else {}


async def discover(client: httpx.AsyncClient, base: str, declared, block_size: int | None
                   ) -> list[ModelInfo]:
    """The models of one upstream with their digests (module docstring).

    Raises:
        httpx.HTTPError: ``/v1/models`` could not be read (``/version`` and ``/metrics`` are
            optional: a non-vLLM upstream gets ``runtime:unknown``).
    """
    r = await client.get(base + "/v1/models")
    r.raise_for_status()
    data = r.json().get("data", [])
    version, labels = "unknown", {}
    try:
        v = await client.get(base + "/version")
        if v.status_code == 200:
            version = str(v.json().get("version", "unknown"))
        m = await client.get(base + "/metrics")
        if m.status_code == 200:
            labels = cache_config_labels(m.text)
    except (httpx.HTTPError, ValueError):
        pass
    runtime = f"vllm {version}"
    runtime_material = json.dumps({k: labels.get(k) for k in RUNTIME_LABELS}, sort_keys=True)
    runtime_digest = declared.runtime_digest or sha256_hex(f"runtime:{runtime}\x00{runtime_material}")
    bsize = block_size or int(labels.get("block_size") or 16)
    roots = {d.get("id"): d.get("root") or d.get("id") for d in data}
    out = []
    for d in data:
        mid = str(d.get("id"))
        parent = d.get("parent")
        base_root = roots.get(parent, parent) if parent else (d.get("root") or mid)
        adapter = declared.adapters.get(mid) or (
            sha256_hex(f"adapter:{mid}:{d.get('root')}") if parent else "")
        out.append(ModelInfo(
            model=mid, upstreams=[base],
            model_digest=declared.model_digest or sha256_hex(f"model:{base_root}"),
            tokenizer_digest=declared.tokenizer_digest or sha256_hex(f"tokenizer:{base_root}"),
            runtime_digest=runtime_digest, adapter_digest=adapter,
            prompt_bundle_digest=declared.prompt_bundle_digest or sha256_hex(f"bundle:{base_root}"),
            block_size=bsize, runtime=runtime))
    return out
