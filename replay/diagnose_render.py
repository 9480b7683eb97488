"""Chat requests rendered with an offset map, for :mod:`prefixscope.replay.diagnose`.

A diagnosis needs two things the plain chat reader (``replay/traces.py``) does not keep: where
each rendered character came from (which message and line, which tool and schema key, or the
template's own text), and a cheap way to tokenise the same text many times (the counterfactual
replays of ``replay/diagnose_fix.py`` re-render every request once per breaker).

- :class:`PieceEncoder` tokenises a rendered prompt piece by piece: the text is cut at the
  tokenizer's added (special) tokens, which HF ``tokenizers`` splits out before normalising and
  pre-tokenising (``AddedVocabulary::extract_and_normalize``), so the ids of a prompt are the
  concatenation of the pieces' ids. Pieces (a message between ``<|im_start|>`` and
  ``<|im_end|>``) repeat across requests and turns and are cached (bounded LRU). The ids equal
  :meth:`ChatTokenizer.encode` (``tests/test_diagnose.py`` checks every request of the bundled
  aider capture).
- :func:`render_map` renders a normalised body and finds each message's content and each
  tool's JSON in the text, in order; everything else is template text.
- :class:`Rendered.locate` maps a character offset to a :class:`Position`.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixscope.replay.tokenization import ChatTokenizer, normalise_message, normalise_tool

#: Pieces kept by :class:`PieceEncoder` (each holds its ids and character offsets).
PIECE_CACHE_SIZE = 20_000


class PieceEncoder:
    """Encode prompt text as ``ChatTokenizer.encode`` does, caching pieces between special
    tokens. :meth:`encode` returns ids; :meth:`offsets` the character start of every token."""

    def __init__(self, tok: ChatTokenizer, *, cache_size: int = PIECE_CACHE_SIZE) -> None:
        self.tok = tok
        inner = tok._tokenizer
        added = inner.get_added_tokens_decoder()
        self._special: dict[str, int] = {}
        for tid, t in added.items():
            # lstrip/rstrip tokens eat neighbouring whitespace: splitting there is not exact.
            if not (t.lstrip or t.rstrip or t.single_word):
                self._special[t.content] = int(tid)
        names = sorted(self._special, key=len, reverse=True)
        self._rx = re.compile("|".join(map(re.escape, names))) if names else None
        self._cache: OrderedDict[str, tuple[list[int], list[int]]] = OrderedDict()
        self._size = cache_size
        self._inner = inner

    def _piece(self, text: str) -> tuple[list[int], list[int]]:
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        enc = self._inner.encode(text, add_special_tokens=False)
        value = (list(enc.ids), [o[0] for o in enc.offsets])
        self._cache[text] = value
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return value

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """(token ids, character start offset of each token) of ``text``."""
        if self._rx is None:
            return self._piece(text)
        ids: list[int] = []
        offs: list[int] = []
        pos = 0
        for m in self._rx.finditer(text):
            if m.start() > pos:
                pid, poff = self._piece(text[pos:m.start()])
                ids.extend(pid)
                offs.extend(o + pos for o in poff)
            ids.append(self._special[m.group(0)])
            offs.append(m.start())
            pos = m.end()
        if pos < len(text):
            pid, poff = self._piece(text[pos:])
            ids.extend(pid)
            offs.extend(o + pos for o in poff)
        return ids, offs


@dataclass(frozen=True, slots=True)
class Span:
    """A located part of the rendered text: ``[start, end)`` characters.

    ``segment`` is ``message`` (a message's content), ``tools`` (one tool's JSON) or
    ``tool_calls`` (the calls rendered after an assistant message's content)."""

    start: int
    end: int
    segment: str
    index: int  # message index, or tool index for ``tools``


@dataclass(frozen=True, slots=True)
class Position:
    """Where a character of the rendered prompt came from.

    Attributes:
        segment: ``message``, ``tools``, ``tool_calls`` or ``template`` (the template's own
            text: role headers, separators, the generation prompt), or ``tokens``/``blocks``
            for traces without text.
        message_index: 0-based message index (for ``template``: the message whose header or
            footer it is), None for tools.
        role: that message's role.
        line: 1-based line inside the message content (``message`` only).
        column: 1-based character column in that line.
        tool_index, tool_name, schema_key: the tool (``tools``), and the last JSON key before
            the position inside its schema.
        block: the 0-based block index of the divergence (``tokens``/``blocks`` positions).
    """

    segment: str
    message_index: int | None = None
    role: str | None = None
    line: int | None = None
    column: int | None = None
    tool_index: int | None = None
    tool_name: str | None = None
    schema_key: str | None = None
    block: int | None = None


@dataclass
class Rendered:
    """One chat request rendered: text, token ids with offsets, the normalised messages and
    tools, and the located spans."""

    text: str
    ids: list[int]
    offsets: list[int]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_json: list[str]
    spans: list[Span] = field(default_factory=list)

    def tool_names(self) -> list[str]:
        """Function names of the tools, in order (``""`` when a tool has no name)."""
        return [str(t.get("function", {}).get("name") or "") for t in self.tools]

    def char_of_token(self, token_index: int) -> int:
        """Character offset of a token (the text's end past the last token)."""
        if token_index >= len(self.offsets):
            return len(self.text)
        return self.offsets[token_index]

    def locate(self, char: int) -> Position:
        """The :class:`Position` of character ``char``."""
        prev: Span | None = None
        for s in self.spans:
            if s.start <= char < s.end or (s.start == char == s.end):
                return self._inside(s, char)
            if s.start > char:
                return self._between(prev, s)
            prev = s
        return self._between(prev, None)

    def _inside(self, s: Span, char: int) -> Position:
        if s.segment == "tools":
            tool = self.tools[s.index]
            name = tool.get("function", {}).get("name")
            rel = self.tool_json[s.index][: char - s.start]
            keys = re.findall(r'"([^"\\]+)"\s*:', rel)
            return Position("tools", tool_index=s.index, tool_name=name,
                            schema_key=keys[-1] if keys else None)
        role = self.messages[s.index].get("role")
        if s.segment == "tool_calls":
            return Position("tool_calls", message_index=s.index, role=role)
        before = self.text[s.start:char]
        line = before.count("\n") + 1
        col = len(before) - (before.rfind("\n") + 1) + 1
        return Position("message", message_index=s.index, role=role, line=line, column=col)

    def _between(self, prev: Span | None, nxt: Span | None) -> Position:
        # Template text: the header of the next message, or the footer of the last one.
        if nxt is not None and nxt.segment == "message":
            return Position("template", message_index=nxt.index,
                            role=self.messages[nxt.index].get("role"))
        if prev is not None and prev.segment == "tools" and (nxt is None or nxt.segment != "tools"):
            return Position("tools", tool_index=None)
        if prev is not None and prev.segment in ("message", "tool_calls"):
            i = prev.index
            if i + 1 < len(self.messages):
                return Position("template", message_index=i + 1,
                                role=self.messages[i + 1].get("role"))
            return Position("template", message_index=len(self.messages), role="assistant")
        return Position("template")

    def line_text(self, message_index: int, line: int) -> str:
        """Line ``line`` (1-based) of a message's content (``""`` past its end)."""
        if message_index >= len(self.messages):
            return ""
        lines = str(self.messages[message_index].get("content") or "").split("\n")
        return lines[line - 1] if 0 < line <= len(lines) else ""


def render_map(tok: ChatTokenizer, enc: PieceEncoder, body: Mapping[str, Any]) -> Rendered:
    """Render ``body`` (OpenAI shape) with the chat template, tokenise it and locate its parts.

    Raises:
        ConfigError: the template failed. ValueError: bad tool or message objects.
    """
    messages = [normalise_message(m) for m in body["messages"]]
    tools_in = body.get("tools") or []
    for i, t in enumerate(tools_in):
        if not isinstance(t, Mapping):
            raise ValueError(f"$.tools[{i}]: not an object")
    tools = [normalise_tool(t) for t in tools_in]
    text = tok.render(body["messages"], tools=tools_in or None)
    ids, offsets = enc.encode_with_offsets(text)
    tool_json = [json.dumps(t, ensure_ascii=False) for t in tools]
    spans: list[Span] = []
    cur = 0
    for i, tj in enumerate(tool_json):
        at = text.find(tj, cur)
        if at >= 0:
            spans.append(Span(at, at + len(tj), "tools", i))
            cur = at + len(tj)
    tools_end = cur
    cur = 0
    for i, m in enumerate(messages):
        content = m.get("content") or ""
        if not content:
            continue
        at = text.find(content, cur)
        if at < 0:
            continue
        spans.append(Span(at, at + len(content), "message", i))
        cur = at + len(content)
        if m.get("tool_calls"):
            nxt = text.find("<|im_end|>", cur)
            spans.append(Span(cur, nxt if nxt > cur else cur, "tool_calls", i))
    del tools_end
    spans.sort(key=lambda s: (s.start, s.end))
    return Rendered(text=text, ids=ids, offsets=offsets, messages=messages, tools=tools,
                    tool_json=tool_json, spans=spans)


def contents_of(r: Rendered) -> tuple[tuple[str, str], ...]:
    """(role, content) of every message."""
    return tuple((str(m.get("role")), str(m.get("content") or "")) for m in r.messages)


def tool_names_of(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """Function names of normalised tools."""
    return [str(t.get("function", {}).get("name") or "") for t in tools]
