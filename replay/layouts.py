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

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from prefixscope.core.documents import load_config_file, parse_toml, parse_yaml
from prefixscope.core.errors import ConfigError
from prefixscope.core.patterns import MULTILINE, PatternTimeout, compile_pattern, search, sub


#: Message selectors of layout v2 (``in:`` / ``from:``): a role group, one message by role and
#: order, ``all``, or a 0-based message index.
SELECTORS = ("system", "developer", "user", "assistant", "tool", "all", "first_user", "last_user",
             "first_system", "first_message", "last_message")

Selector = str | int


def select_messages(messages: list[dict[str, Any]], sel: Selector) -> list[int]:
    """Indexes of the messages ``sel`` names (see :data:`SELECTORS`; ``system`` includes
    ``developer`` messages; an int is a 0-based index, negative from the end)."""
    n = len(messages)
    if isinstance(sel, int):
        i = sel if sel >= 0 else n + sel
        return [i] if 0 <= i < n else []
    roles = [m.get("role") for m in messages]
    if sel == "all":
        return list(range(n))
    if sel == "system":
        return [i for i, r in enumerate(roles) if r in ("system", "developer")]
    if sel in ("developer", "user", "assistant", "tool"):
        return [i for i, r in enumerate(roles) if r == sel]
    if sel in ("first_user", "last_user"):
        users = [i for i, r in enumerate(roles) if r == "user"]
        return users[:1] if sel == "first_user" else users[-1:]
    if sel == "first_system":
        return [i for i, r in enumerate(roles) if r in ("system", "developer")][:1]
    if sel == "first_message":
        return [0] if n else []
    if sel == "last_message":
        return [n - 1] if n else []
    return []


def _check_selector(value: Selector) -> Selector:
    if isinstance(value, bool) or not (isinstance(value, int) or value in SELECTORS):
        raise ValueError(f"unknown message selector {value!r}: use one of "
                         f"{', '.join(SELECTORS)} or a message index")
    return value


def _compile(value: str) -> str:
    compile_pattern(value)  # ValueError: not a valid regular expression (the engine's reason)
    return value


#: Destinations of ``move_lines``: the start or end of the first/last user message, the end of
#: the (first) system message, the end of the last message.
MOVE_TARGETS = ("last_user_end", "first_user_end", "last_user_start", "first_user_start",
                "system_end", "last_message_end")


class MoveLines(BaseModel):
    """Move every line of the ``from`` message(s) (default the system and developer messages)
    that matches ``pattern`` to a destination ``to`` (:data:`MOVE_TARGETS`, default
    ``last_user_end``, the usual advice "volatile content last"; ``first_user_end`` keeps the
    moved text at the same place in every later turn of a conversation, so the history,
    including cached replies, remains a prefix), joined by newlines with ``separator`` between
    the destination text and the moved lines. No match, or no destination: unchanged. Lines
    keep their order; the source text loses them (and their line breaks)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["move_lines"]
    pattern: str
    to: Literal["last_user_end", "first_user_end", "last_user_start", "first_user_start",
                "system_end", "last_message_end"] = "last_user_end"
    source: Selector = Field("system", alias="from")
    separator: str = "\n"

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: Any) -> Any:
        return _compile(value)
    @field_validator("source")
    @classmethod
    def _source_ok(cls, value: Any) -> Any:
        return _check_selector(value)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        rx = compile_pattern(self.pattern)
        messages = [dict(m) for m in body.get("messages", [])]
        moved: list[str] = []
        for i in select_messages(messages, self.source):
            m = messages[i]
            text = _text_of(m.get("content"))
            if text is None:
                continue
            kept, taken = [], []
            for line in text.split("\n"):
                (taken if search(rx, line) else kept).append(line)
            if taken:
                moved.extend(taken)
                m["content"] = "\n".join(kept)
        if not moved:
            return body
        dest_sel = {"last_user_end": "last_user", "first_user_end": "first_user",
                    "last_user_start": "last_user", "first_user_start": "first_user",
                    "system_end": "first_system", "last_message_end": "last_message"}[self.to]
        dest = select_messages(messages, dest_sel)
        if not dest:
            return body  # nowhere to move them: leave the request as recorded
        m = messages[dest[0]]
        text = _text_of(m.get("content")) or ""
        block = "\n".join(moved)
        m["content"] = (block + self.separator + text) if self.to.endswith("_start") \
            else (text + self.separator + block)
        out = dict(body)
        out["messages"] = messages
        return out


class _PerMessage(BaseModel):
    """A transform of the text of the selected messages (``in``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    within: Selector = Field("all", alias="in")

    @field_validator("within")
    @classmethod
    def _within_ok(cls, value: Any) -> Any:
        return _check_selector(value)

    def edit(self, text: str) -> str:  # pragma: no cover - overridden
        return text

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = [dict(m) for m in body.get("messages", [])]
        changed = False
        for i in select_messages(messages, self.within):
            text = _text_of(messages[i].get("content"))
            if text is None:
                continue
            new = self.edit(text)
            if new != text:
                messages[i]["content"] = new
                changed = True
        if not changed:
            return body
        out = dict(body)
        out["messages"] = messages
        return out


class RemoveLines(_PerMessage):
    """Remove every line matching ``pattern`` from the selected messages (default the system
    and developer messages)."""

    type: Literal["remove_lines"]
    pattern: str
    within: Selector = Field("system", alias="in")

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: Any) -> Any:
        return _compile(value)

    def edit(self, text: str) -> str:
        rx = compile_pattern(self.pattern)
        return "\n".join(line for line in text.split("\n") if not search(rx, line))


class Replace(_PerMessage):
    """Replace every match of ``pattern`` (multi-line mode: ``^``/``$`` match at line breaks)
    in the selected messages (default all) with the fixed text ``with`` (Python ``re.sub``
    replacement: ``\\1`` refers to a group)."""

    type: Literal["replace"]
    pattern: str
    replacement: str = Field(alias="with")

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: Any) -> Any:
        return _compile(value)

    def edit(self, text: str) -> str:
        return sub(compile_pattern(self.pattern, MULTILINE), self.replacement, text)


_GRANULARITY = re.compile(r"^(\d+)([smhd])$")
_DATETIME = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})(?:(?P<sep>[T ])(?P<h>\d{2}):(?P<m>\d{2})"
    r"(?::(?P<s>\d{2})(?P<frac>\.\d+)?)?(?P<tz>Z|[+-]\d{2}:?\d{2})?)?")
_TIME = re.compile(r"(?<![\d:])(?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}))?(?![\d:])")


def granularity_seconds(value: str) -> int:
    """``30s``, ``15m``, ``1h``, ``1d`` -> seconds.

    Raises:
        ValueError: another form.
    """
    m = _GRANULARITY.match(value.strip())
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"granularity {value!r}: use a number and s, m, h or d (15m, 1h, 1d)")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


class RoundTimes(_PerMessage):
    """Round every time value in the selected messages (default all) down to ``granularity``
    (``15m``, ``1h``, ``1d``...), keeping its format: ISO dates with a time
    (``2024-08-05T13:47:12Z`` -> ``2024-08-05T13:00:00Z`` at ``1h``) and clock times
    (``13:47`` -> ``13:45`` at ``15m``). A date alone changes only at ``1d`` or coarser,
    where it stays as it is (days are the unit of a date)."""

    type: Literal["round_times"]
    granularity: str = "1h"

    @field_validator("granularity")
    @classmethod
    def _g(cls, value: str) -> str:
        granularity_seconds(value)
        return value

    def edit(self, text: str) -> str:
        g = granularity_seconds(self.granularity)

        def clock(h: int, mi: int, s: int) -> tuple[int, int, int]:
            t = (h * 3600 + mi * 60 + s) // g * g if g < 86400 else 0
            return t // 3600 % 24, t // 60 % 60, t % 60

        def dt(m: re.Match[str]) -> str:
            if m.group("h") is None:
                return m.group(0)
            h, mi, s = clock(int(m.group("h")), int(m.group("m")), int(m.group("s") or 0))
            out = f"{m.group('date')}{m.group('sep')}{h:02d}:{mi:02d}"
            if m.group("s") is not None:
                out += f":{s:02d}"
                if m.group("frac"):
                    out += "." + "0" * (len(m.group("frac")) - 1)
            return out + (m.group("tz") or "")

        def tm(m: re.Match[str]) -> str:
            h, mi, s = clock(int(m.group("h")), int(m.group("m")), int(m.group("s") or 0))
            width = len(m.group("h"))
            out = f"{h:0{width}d}:{mi:02d}"
            return out + (f":{s:02d}" if m.group("s") is not None else "")

        parts = []
        pos = 0
        for m in _DATETIME.finditer(text):  # datetimes first, then clock times elsewhere
            parts.append(_TIME.sub(tm, text[pos:m.start()]))
            parts.append(dt(m))
            pos = m.end()
        parts.append(_TIME.sub(tm, text[pos:]))
        return "".join(parts)


class CanonicalJson(_PerMessage):
    """Re-serialise, with sorted keys, every selected message (default ``tool`` messages) whose
    whole content is a JSON object or array, and the arguments of every assistant tool call:
    equal data then renders to equal tokens whatever key order the client produced."""

    type: Literal["canonical_json"]
    within: Selector = Field("tool", alias="in")

    def edit(self, text: str) -> str:
        s = text.strip()
        if not s or s[0] not in "[{":
            return text
        try:
            value = json.loads(s)
        except json.JSONDecodeError:
            return text
        return json.dumps(_sorted_keys(value), ensure_ascii=False)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        out = super().apply(body)
        messages = out.get("messages", [])
        if not any(isinstance(m.get("tool_calls"), list) for m in messages):
            return out
        new_messages = []
        for m in messages:
            calls = m.get("tool_calls")
            if isinstance(calls, list):
                m = dict(m)
                m["tool_calls"] = [_canonical_call(c) for c in calls]
            new_messages.append(m)
        out = dict(out)
        out["messages"] = new_messages
        return out


def _canonical_call(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    fn = dict(call["function"])
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.dumps(_sorted_keys(json.loads(args)), ensure_ascii=False)
        except json.JSONDecodeError:
            pass
    elif isinstance(args, Mapping):
        fn["arguments"] = _sorted_keys(args)
    out = dict(call)
    out["function"] = fn
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


Transform = Annotated[MoveLines | SortTools | CanonicalToolJson | RemoveLines | Replace | RoundTimes
                      | CanonicalJson, Field(discriminator="type")]


class Layout(BaseModel):
    """A named list of transforms (see the module docstring for the file schema)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    transforms: list[Transform] = Field(default_factory=list)
    _source: str = PrivateAttr("")  # the file it was read from (load_layout), for errors

    def as_dict(self) -> dict[str, Any]:
        """The layout as a file would hold it (field aliases: ``from``, ``in``, ``with``)."""
        return self.model_dump(by_alias=True, exclude_none=True)

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The request body with every transform applied in order (the input is not changed)."""
        out = dict(body)
        for i, t in enumerate(self.transforms):
            try:
                out = t.apply(out)
            except PatternTimeout as exc:
                where = self._source or f"layout {self.name!r}"
                raise ConfigError(f"{where}: transforms.{i}.pattern: {exc}") from None
        return out


#: Transform types that rewrite values (what the model reads changes): ``diagnose`` suggests
#: them only when asked (``--allow-rewrites``). The others move lines or normalise what the
#: model reads the same either way (tool order, JSON key order).
REWRITING_TYPES = frozenset({"replace", "remove_lines", "round_times"})


def rewrites(layout: Layout | None) -> bool:
    """Whether ``layout`` has a transform of :data:`REWRITING_TYPES`."""
    return layout is not None and any(t.type in REWRITING_TYPES for t in layout.transforms)


def content_lines(body: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """What a request says, regardless of order and place: the sorted non-empty lines of all
    its message contents, the sorted tools as JSON with sorted keys, the sorted tool calls
    likewise (each a tuple; ``same_content`` compares them)."""
    lines: list[str] = []
    calls: list[str] = []
    for m in body.get("messages") or []:
        text = _text_of(m.get("content")) if isinstance(m, Mapping) else None
        if text:
            lines.extend(x for x in text.split("\n") if x.strip())
        for c in (m.get("tool_calls") or []) if isinstance(m, Mapping) else []:
            calls.append(json.dumps(_canonical_call(c), sort_keys=True, ensure_ascii=False))
    tools = [json.dumps(t, sort_keys=True, ensure_ascii=False) for t in body.get("tools") or []]
    return [tuple(sorted(lines)), tuple(sorted(tools)), tuple(sorted(calls))]


def same_content(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether ``after`` (a request with a layout applied) keeps the content of ``before``:
    the same multiset of message lines, tools and tool calls, only in another order or place
    (:func:`content_lines`). A move or a sort keeps it; a placeholder, rounding or removal
    does not."""
    return content_lines(before) == content_lines(after)


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
        ConfigError: unreadable file or invalid schema (names the file and the field). Applying
            the layout raises ConfigError naming the file and ``transforms.N.pattern`` when a
            pattern runs past ``prefixscope.core.patterns.MATCH_TIMEOUT_S`` on one message.
    """
    p = Path(path)
    if p.suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"{p}: layout files are .yaml, .yml or .toml")
    data = load_config_file(p, what="layout file",
                            parse=parse_toml if p.suffix.lower() == ".toml" else parse_yaml)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a layout file holds a mapping with name and transforms")
    try:
        layout = Layout.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{p}: {where}: {first['msg']}") from exc
    layout._source = str(p)
    return layout
