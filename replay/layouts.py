"""Prompt layouts: declared transforms applied to chat requests before they are tokenised.

A layout file (YAML ``.yaml``/``.yml`` or TOML ``.toml``) names a layout and lists transforms,
applied in order to every request of a chat trace (``replay sim --layout``, ``replay compare
--layout-a/--layout-b``). Schema (documented in ``docs/replay.md#layouts``)::

    name: date-at-end            # required; shown in outputs (attrs "layout", run labels)
    description: ...             # optional
    transforms:
      - type: move_lines         # move matching lines out of the system prompt
        pattern: '^- Current date: .*$'   # Python regex, tested against each line
        to: last_user_end        # or first_user_end (see MoveLines)
        separator: "\\n\\n"      # put between the user text and the moved lines (default "\\n")
      - type: sort_tools         # sort the tool list by function name
      - type: canonical_tool_json  # sort the keys of every tool schema, recursively

Why these: a volatile line (date, time, request id) near the top of the system prompt changes
the first blocks of every prompt, so vLLM's chained block hashes share nothing after it; moving
it to the end of the last user message keeps the long stable part as a common prefix. Tool lists
rendered in a varying order, or schemas whose keys come out in a varying order, break the prefix
the same way (the chat template renders tools with ``tojson``, which keeps key order).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prefixscope.core.errors import ConfigError, SourceUnavailable


class MoveLines(BaseModel):
    """Move every line of the system message(s) that matches ``pattern`` to the end of a user
    message (joined with newlines, after ``separator``): the last one (``to: last_user_end``,
    the usual advice "volatile content last") or the first one (``to: first_user_end``: the
    moved text then stays at the same place in every later turn of the conversation, so the
    history, including cached replies, remains a prefix). No match: the request is unchanged.
    Lines keep their order; the system text loses them (and their line breaks)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["move_lines"]
    pattern: str
    to: Literal["last_user_end", "first_user_end"] = "last_user_end"
    separator: str = "\n"

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        rx = re.compile(self.pattern)
        messages = [dict(m) for m in body.get("messages", [])]
        moved: list[str] = []
        for m in messages:
            if m.get("role") not in ("system", "developer"):
                continue
            text = _text_of(m.get("content"))
            if text is None:
                continue
            kept, taken = [], []
            for line in text.split("\n"):
                (taken if rx.search(line) else kept).append(line)
            if taken:
                moved.extend(taken)
                m["content"] = "\n".join(kept)
        if not moved:
            return body
        order = reversed(messages) if self.to == "last_user_end" else iter(messages)
        for m in order:
            if m.get("role") == "user":
                text = _text_of(m.get("content"))
                m["content"] = (text or "") + self.separator + "\n".join(moved)
                break
        else:
            return body  # nowhere to move them: leave the request as recorded
        out = dict(body)
        out["messages"] = messages
        return out


class SortTools(BaseModel):
    """Sort the ``tools`` list by function name (stable; tools without a name keep their
    relative order at the end)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["sort_tools"]
    key: Literal["name"] = "name"

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = body.get("tools")
        if not isinstance(tools, list) or len(tools) < 2:
            return body

        def name(tool: Any) -> tuple[int, str]:
            if isinstance(tool, Mapping):
                fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
                if isinstance(fn.get("name"), str):
                    return (0, fn["name"])
            return (1, "")

        out = dict(body)
        out["tools"] = sorted(tools, key=name)
        return out


class CanonicalToolJson(BaseModel):
    """Sort the keys of every tool object recursively, so ``tojson`` renders each schema the
    same way whatever key order the client sent."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["canonical_tool_json"]

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = body.get("tools")
        if not isinstance(tools, list):
            return body
        out = dict(body)
        out["tools"] = [_sorted_keys(t) for t in tools]
        return out


Transform = Annotated[MoveLines | SortTools | CanonicalToolJson, Field(discriminator="type")]


class Layout(BaseModel):
    """A named list of transforms (see the module docstring for the file schema)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    transforms: list[Transform] = Field(default_factory=list)

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The request body with every transform applied in order (the input is not changed)."""
        out = dict(body)
        for t in self.transforms:
            out = t.apply(out)
        return out


#: The layout that changes nothing (requests as recorded).
AS_RECORDED = Layout(name="as-recorded", description="requests exactly as recorded")


def _text_of(content: Any) -> str | None:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, Mapping) and p.get("type", "text") == "text")
    return None


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


def load_layout(path: str | os.PathLike[str]) -> Layout:
    """Read a layout file (``.yaml``, ``.yml`` or ``.toml``).

    Raises:
        SourceUnavailable: the file does not exist.
        ConfigError: unreadable file or invalid schema (names the file and the field).
    """
    p = Path(path)
    if not p.is_file():
        raise SourceUnavailable(f"layout file {p} not found")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif p.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise ConfigError(f"{p}: layout files are .yaml, .yml or .toml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: not valid {p.suffix[1:].upper()}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a layout file holds a mapping with name and transforms")
    try:
        return Layout.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{p}: {where}: {first['msg']}") from exc
