"""``prefixscope inventory digest``: the lines of the gateway's approved public inventory
(``inventory_file``, docs/gateway.md#public-inventory) for system prompts, messages and tool
sets, printed or appended to the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from prefixscope.cli.common import JsonOption, out, print_json


def _entries(path: str, role: str) -> list[dict[str, Any]]:
    """What one input file approves: ``{"kind", "index", "role", "digest"}`` per message or
    tool set, digests as the gateway computes them (``gateway/prompt.py``).

    A ``.json`` file is a request body (``messages``, ``tools``, and ``system`` of
    ``/v1/messages``), a list of messages, a list of tool definitions, or one message; any other
    file is the exact text of one message of ``role`` (a system prompt).

    Raises:
        UsageError: unreadable file, not UTF-8, or JSON of none of these shapes.
    """
    from prefixscope.core.documents import DocumentError, read_document
    from prefixscope.core.errors import UsageError
    from prefixscope.core.identity import message_digest, render_digest, toolset_digest

    try:
        text = read_document(path)
    except DocumentError as exc:
        raise UsageError(f"{path}: {exc}") from None
    if not path.endswith(".json"):
        return [{"kind": "message", "index": 0, "role": role,
                 "digest": message_digest({"role": role, "content": text})}]
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise UsageError(f"{path}: not valid JSON") from None
    messages: list = []
    tools: list = []
    render = ""
    if isinstance(doc, dict) and isinstance(doc.get("role"), str):
        messages = [doc]
    elif isinstance(doc, dict):
        messages = list(doc.get("messages") or [])
        tools = list(doc.get("tools") or [])
        render = render_digest(doc)  # documents, chat_template_kwargs... (RENDER_FIELDS)
        if doc.get("system") is not None:  # /v1/messages: system becomes the first message
            messages.insert(0, {"role": "system", "content": doc["system"]})
    elif isinstance(doc, list) and doc and all(isinstance(m, dict) for m in doc):
        if all(isinstance(m.get("role"), str) for m in doc):
            messages = doc
        elif not any("role" in m for m in doc):
            tools = doc
    if (not messages and not tools) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages) or not all(
            isinstance(t, dict) for t in tools):
        raise UsageError(f"{path}: expected a request body (messages, tools, system), a list of "
                         "messages (each with a string role), a list of tool definitions or one "
                         "message")
    found = [{"kind": "message", "index": i, "role": m["role"], "digest": message_digest(m)}
             for i, m in enumerate(messages)]
    if tools:
        found.append({"kind": "toolset", "index": 0, "role": None,
                      "digest": toolset_digest(tools)})
    if render:
        found.append({"kind": "render", "index": 0, "role": None, "digest": render})
    return found


def digest_cmd(
    files: Annotated[list[str], typer.Argument(
        help="System-prompt text files (the exact text, final newline included), or .json "
        "files: a request body, a list of messages, a list of tools, or one message.")],
    append: Annotated[str | None, typer.Option(
        "--append", help="Inventory file to append the new lines to (created if missing; "
        "digests already in it are not added twice).")] = None,
    role: Annotated[str, typer.Option(
        "--role", help="Role of the message a text file holds.")] = "system",
    label: Annotated[str | None, typer.Option(
        "--label", help="Label after each digest (default: the file, message index and role).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Print the public-inventory lines (sha256:<digest> label) for prompts and tool sets.

    The digests are the gateway's: SHA-256 of each canonicalised message and of the tool list
    (prefixscope.core.identity message_digest / toolset_digest) and, for a request body that
    sets documents, chat_template_kwargs or another field that changes the rendering, of
    those render options (render_digest), with the sha256: prefix the inventory file needs.
    A request is PUBLIC only when every message, its tool set and its render options are on
    the inventory, so approve the questions too, not only the system prompt. Restart the
    gateway to load the new file. Prompt text is never printed.

    Examples:

      prefixscope inventory digest system-prompt.txt --append /etc/prefixscope/inventory.txt

      prefixscope inventory digest request.json --json
    """
    from prefixscope.core.errors import UsageError
    from prefixscope.core.identity import PublicInventory

    if not role or any(c.isspace() for c in role):
        raise UsageError("--role must be a word, e.g. system")
    if label is not None and ("\n" in label or "#" in label):
        raise UsageError("--label must be one line without '#'")
    rows = []
    for f in files:
        for e in _entries(f, role):
            what = {"message": e["role"], "toolset": "tools"}.get(e["kind"], "render options")
            text = label or f"{Path(f).name} {e['kind']} {e['index']} ({what})"
            rows.append({**e, "source": f, "line": f"sha256:{e['digest']} {text}"})
    known: set[str] = set()
    if append is not None and Path(append).exists():
        known = set(PublicInventory.from_file(append).digests)  # a bad file: ConfigError
    new_lines = []
    for r in rows:
        r["added"] = append is not None and r["digest"] not in known
        if r["added"]:
            known.add(r["digest"])
            new_lines.append(r["line"])
    if append is not None and new_lines:
        p = Path(append)
        head = b""
        if p.exists() and p.stat().st_size and not p.read_bytes().endswith(b"\n"):
            head = b"\n"
        with p.open("ab") as fh:
            fh.write(head + "".join(x + "\n" for x in new_lines).encode())
    if as_json:
        print_json([{"digest": f"sha256:{r['digest']}", "kind": r["kind"], "source": r["source"],
                     "index": r["index"], "role": r["role"], "line": r["line"],
                     "added": r["added"]} for r in rows])
        return
    for r in rows:
        out.print(r["line"], markup=False, highlight=False)
    if append is not None:
        out.print(f"{append}: {len(new_lines)} line(s) added, "
                  f"{len(rows) - len(new_lines)} already there", markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``inventory digest`` (its own group, ``prefixscope inventory``)."""
    inventory_app = typer.Typer(help="The gateway's approved public inventory (PUBLIC scope).",
                                no_args_is_help=True)
    inventory_app.command("digest")(digest_cmd)
    groups["app"].add_typer(inventory_app, name="inventory")
