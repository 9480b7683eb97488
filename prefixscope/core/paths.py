"""Where prefixscope finds its bundled data and its source checkout.

The bundled data (real captures, traces, the tiny tokenizer, layouts, prices) is the repository's
``data/`` folder, installed as the package data of ``prefixscope.data``; a wheel carries it, so
the demo and chat replay run outside the repository. ``$PREFIXSCOPE_DATA_DIR`` points elsewhere
(a folder of the same layout).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The source checkout when running from one (``pip install -e .``); None for a wheel.
_PKG = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The bundled data folder: ``$PREFIXSCOPE_DATA_DIR`` if set, else the installed
    ``prefixscope.data`` package's folder (the repository's ``data/`` in a checkout).

    Returns:
        An absolute path (it may not exist if ``$PREFIXSCOPE_DATA_DIR`` names a missing folder).
    """
    env = os.environ.get("PREFIXSCOPE_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    import prefixscope.data as data_pkg

    return Path(data_pkg.__file__).resolve().parent


def data_file(*parts: str) -> Path:
    """A path inside :func:`data_dir` (``data_file("tiny-tokenizer")``)."""
    return data_dir().joinpath(*parts)


def source_root() -> Path | None:
    """The repository root when prefixscope runs from a source checkout (it has ``pyproject.toml``
    beside ``prefixscope/``), else None."""
    root = _PKG.parent
    if (root / "pyproject.toml").is_file() and (root / "store").is_dir():
        return root
    return None


#: The manifest file of a replay run directory: written by ``prefixscope.replay.runner``, read by
#: ``prefixscope.ingest.runs`` (the run re-enters through ingest, docs/replay.md).
RUN_MANIFEST = "run.json"
