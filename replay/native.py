"""The compiled hot loops of sequential replay, when they are built (``replay/_native.c``).

Two loops dominate an exact replay, and both run in C when the extension is there:

- the chained SHA-256 of vLLM's pickled blocks (``BlockHasher.extend`` with ``sha256``:
  ``sha256(pickle.dumps((parent, tuple(tokens), None), 5))``, vLLM 0.32.0
  ``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``), one call per request;
- ``BlockPool.run_alone``, one call per request, on the pool's own lists and dicts.

The miss ledger and the capacity sweep (issue 26) add four: the ledger's content index
(``ContentIndex``) and its run of blocks stored before (``stored_run``), Belady's MIN
(``min_hits``) and the sweep's key interning (``intern_keys``), each with its Python reference
(``replay/ledger.py``, ``replay/belady.py``).

They compute exactly what the Python code computes (``tests/test_replay_native.py`` compares
digests with ``pickle.dumps`` + ``hashlib`` and the whole pool state with the Python
``run_alone`` after random traces); only the speed differs (docs/benchmarks.md). Without a C
compiler or OpenSSL's headers at install time the extension is not built and the Python code
runs. ``PREFIXSCOPE_NATIVE=0`` in the environment turns it off (benchmarks compare both).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("PREFIXSCOPE_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        from prefixscope.replay import _native
    except ImportError:
        return None
    return _native


#: The extension module, or None when it is not built or turned off.
NATIVE: ModuleType | None = _load()


def native_status() -> str:
    """``"native"`` when the compiled loops are in use, else ``"python"`` (same results)."""
    return "native" if NATIVE is not None else "python"
