"""Documentation coverage: a command, table, page or config key that is not documented fails.

(The habit of datasette's documentation-coverage tests.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from prefixscope.store import db as store_db

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _all_docs() -> str:
    texts = [p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md"))]
    texts.append((ROOT / "README.md").read_text(encoding="utf-8"))
    return "\n".join(texts)


def _command_paths() -> list[str]:
    from prefixscope.cli import app

    root = typer.main.get_command(app)
    paths: list[str] = []

    def walk(cmd, prefix: list[str]) -> None:
        if getattr(cmd, "commands", None):
            for name, sub in cmd.commands.items():
                walk(sub, prefix + [name])
        else:
            paths.append(" ".join(prefix))

    walk(root, [])
    return sorted(paths)


@pytest.mark.parametrize("path", _command_paths())
def test_every_command_is_documented(path):
    docs = _all_docs()
    assert f"prefixscope {path}" in docs, f"'prefixscope {path}' appears in no docs/*.md or README.md"


def test_the_readme_full_list_names_every_command():
    """README's "The full list:" names every command (it left out `ingest query-range` and
    `diagnose`, session 7 finding 11)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    full = readme[readme.index("The full list:"):]
    full = full[:full.index("\n\n")]
    listed = set(re.findall(r"`prefixscope ([a-z][a-z -]*?)`", full))
    missing = [p for p in _command_paths() if p not in listed]
    assert missing == []
    assert {"ingest query-range", "diagnose"} <= listed


@pytest.mark.parametrize("path", _command_paths())
def test_every_command_has_help_with_an_example(path, cli):
    code, out, _ = cli(path.split() + ["--help"])
    assert code == 0
    assert "Example" in out or "example" in out, f"'prefixscope {path} --help' shows no example"


def _tables() -> list[str]:
    con = store_db.memory()
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
        "ORDER BY table_name").fetchall()
    con.close()
    return [r[0] for r in rows]


@pytest.mark.parametrize("table", _tables())
def test_every_table_is_in_schema_doc(table):
    text = (DOCS / "schema.md").read_text(encoding="utf-8")
    assert re.search(rf"`{re.escape(table)}`", text), f"table {table} is not in docs/schema.md"


def test_every_dashboard_page_is_documented():
    app_py = (ROOT / "dashboard" / "app.py").read_text(encoding="utf-8")
    pages = re.findall(r"\(\s*\"views/([a-z_]+)\.py\"\s*,\s*\"([^\"]+)\"", app_py)
    assert pages, "no PAGES entries found in dashboard/app.py"
    text = (DOCS / "dashboard.md").read_text(encoding="utf-8")
    for _file, title in pages:
        assert f"## {title}" in text, f"dashboard page {title!r} has no '## {title}' section in docs/dashboard.md"


def test_every_config_key_is_documented():
    from prefixscope.core.config import Settings

    text = (DOCS / "config.md").read_text(encoding="utf-8")
    for section_name, section_field in Settings.model_fields.items():
        assert f"[{section_name}]" in text, f"config section [{section_name}] not in docs/config.md"
        for key in section_field.annotation.model_fields:
            assert f"`{key}`" in text, f"config key {section_name}.{key} not in docs/config.md"
