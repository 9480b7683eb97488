"""Packaging: every bundled data folder whose name Python could import is listed in
pyproject's ``[tool.setuptools] packages``, so an install (``make demo``'s ``pip install -e``)
ships it as data without setuptools' "Package would be ignored" warning (issue 14, f)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Folders under data/ that are build output, never shipped (exclude-package-data).
GENERATED = {"demo"}


def test_every_importable_data_folder_is_a_listed_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = set(config["tool"]["setuptools"]["packages"])
    expected = set()
    for folder in sorted((ROOT / "data").rglob("*")):
        rel = folder.relative_to(ROOT / "data")
        if not folder.is_dir() or rel.parts[0] in GENERATED or "__pycache__" in rel.parts:
            continue
        if all(p.isidentifier() for p in rel.parts):  # setuptools warns only for these
            expected.add("prefixscope.data." + ".".join(rel.parts))
    assert expected, "no data folders found"
    assert expected <= packages, sorted(expected - packages)
    assert {"prefixscope.data.captures.aider", "prefixscope.data.layouts"} <= expected


def test_the_license_file_is_the_license_pyproject_declares():
    """Issue 30 item 7: a LICENSE file at the root whose text is the license ``pyproject.toml``
    names (Apache-2.0), so the wheel's metadata and the repository say the same."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
