"""Run ids and run directories of every replay (``replay sim``, ``replay compare``, ``replay
live``): minted here once, in one format, under one output folder.

- Run id: ``<kind>-<label slug>-<UTC yyyymmddThhmmssZ>-<6 hex>`` (``sim-conversation-
  20261129T101500Z-3fa2c1``); the slug (lower-case ``[a-z0-9-]``, at most 32 characters) is
  left out when there is no label (``live-20261129T101500Z-3fa2c1``). 24 random bits keep
  concurrent runs of the same second apart.
- Run directory: ``out/replay/<run id>`` relative to the working directory, unless ``--out``.
"""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

#: Where run directories go when no ``--out`` is given (relative to the working directory).
RUNS_DIR = Path("out") / "replay"


def new_run_id(kind: str, label: str | None = None, *, now_unix_s: float | None = None) -> str:
    """A fresh run id of ``kind`` (``sim``, ``compare``, ``live``) and an optional label."""
    now = time.time() if now_unix_s is None else now_unix_s
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    slug = re.sub(r"[^a-z0-9]+", "-", (label or "").lower()).strip("-")[:32].strip("-")
    return "-".join(p for p in (kind, slug, stamp, secrets.token_hex(3)) if p)


def default_run_dir(run_id: str) -> Path:
    """``out/replay/<run id>``."""
    return RUNS_DIR / run_id
