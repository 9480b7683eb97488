"""The breaker summary of a diagnosis as a file (``breakers.json``) that
``prefixscope.ingest.breakers`` reads into DuckDB: replay writes files, ingest stores them.

Only structure, kinds, counts, lost tokens and value digests: no prompt text, no regular
expressions (they may quote the prompt), no request text context.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from prefixscope.replay.diagnose import digest

#: ``breakers.json`` format version.
FORMAT_VERSION = 1


def breakers_doc(d: Any, doc: dict[str, Any], *, run_id: str, model: str | None) -> dict[str, Any]:
    """The stored summary of a diagnosis ``d`` and its ``--json`` document ``doc``."""
    w = doc.get("what_if") or {}
    rows = []
    for b in d.breakers:
        pos = b.position
        rows.append({
            "rank": b.rank, "level": b.level, "kind": b.kind,
            "segment": pos.segment if pos else None,
            "message_index": pos.message_index if pos else None,
            "role": pos.role if pos else None, "line": pos.line if pos else None,
            "schema_key_digest": digest(pos.schema_key) if pos and pos.schema_key else None,
            "requests": b.requests, "distinct_values": b.distinct_values,
            "lost_tokens": b.lost_tokens, "lost_tokens_measured": b.measured, "share": b.share,
            "fixable": b.fixable,
            "transform_types": ",".join(t["type"] for t in b.transforms) or None,
            "what_if_hit_rate": (b.what_if or {}).get("hit_rate"),
            "what_if_cached_tokens": (b.what_if or {}).get("cached_tokens"),
            "value_digests": list(b.value_digests),
        })
    return {
        "format_version": FORMAT_VERSION, "kind": "diagnosis", "diagnosis_id": run_id,
        "run_id": run_id, "model": model, "created_unix_s": time.time(),
        "block_size": doc["block_size"], "capacity_blocks": doc["capacity_blocks"],
        "requests": doc["requests"], "prompt_tokens": doc["prompt_tokens"],
        "cached_tokens": doc["cached_tokens"], "hit_rate": doc["hit_rate"],
        "what_if_hit_rate": w.get("hit_rate"), "what_if_cached_tokens": w.get("cached_tokens"),
        "what_if_cost_delta": w.get("cost_delta"),
        "currency": (doc.get("cost") or {}).get("currency"),
        "cold_requests": doc["cold_requests"], "levels": doc["levels"], "breakers": rows,
    }


def write_breakers_file(path: str | os.PathLike[str], d: Any, doc: dict[str, Any], *,
                        run_id: str, model: str | None) -> Path:
    """Write ``breakers.json`` (see :func:`breakers_doc`); returns its path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(breakers_doc(d, doc, run_id=run_id, model=model), indent=1) + "\n",
                 encoding="utf-8")
    return p
