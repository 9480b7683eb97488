"""Shared helpers of the replay I/O tests: bundled data paths and small file writers."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
MOONCAKE_CONVERSATION = DATA / "traces" / "mooncake" / "conversation_trace.jsonl.gz"
MOONCAKE_SYNTHETIC = DATA / "traces" / "mooncake" / "synthetic_trace.jsonl.gz"
KV_CACHE_TESTER = DATA / "traces" / "kv-cache-tester"
KV_SELECTION = KV_CACHE_TESTER / "SELECTION.tsv"
AIDER_TRACE = DATA / "captures" / "aider" / "chat-requests.jsonl"
AIDER_EXCERPT = DATA / "captures" / "aider" / "chat-history-excerpt.md"
SWE_PYDICOM = DATA / "captures" / "swe-agent" / "pydicom__pydicom-1458.traj"
SWE_FUNCTION_CALLING = DATA / "captures" / "swe-agent" / "function_calling_simple.traj"
LAYOUT_DATE_AT_END = DATA / "layouts" / "date-at-end.yaml"
LAYOUT_DATE_FIRST_USER = DATA / "layouts" / "date-in-first-user.yaml"
LAYOUT_TOOLS = DATA / "layouts" / "tools-canonical.toml"
TOKENIZER = DATA / "tiny-tokenizer"


def write_lines(path: Path, lines: list) -> Path:
    """Write ``lines`` (dicts are JSON-encoded, strings written as they are) one per line."""
    with open(path, "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def selection_rows() -> list[dict[str, str]]:
    """The rows of the kv-cache-tester ``SELECTION.tsv`` (one per conversation file)."""
    text = KV_SELECTION.read_text(encoding="utf-8").splitlines()
    head = text[0].split("\t")
    return [dict(zip(head, line.split("\t"))) for line in text[1:] if line.strip()]
