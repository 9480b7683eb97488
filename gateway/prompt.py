"""The cacheable prefix of a request body, per endpoint (pure).

- ``/v1/chat/completions``: ``messages`` (list of objects with a string ``role``) and ``tools``.
- ``/v1/messages``: ``system`` (string or blocks) becomes a first ``system`` message, then
  ``messages``; ``tools``.
- ``/v1/completions``: ``prompt`` (string or token-id list) as one ``prompt`` message.

Prefix objects are everything before the last message (one per message boundary,
``replay/gateway.py`` rule); a completions prompt has no boundary, so its one object is the
whole prompt. Errors name the field, never its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from prefixscope.core.identity import canonical_json

_encode = msgspec.json.Encoder().encode


class BadBody(ValueError):
    """The body is not a usable request (``field``: the JSON path at fault)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Prompt:
    """Messages in prompt order, tool definitions, and the prefix boundaries (message counts)."""

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    boundaries: tuple[int, ...]


def extract(endpoint: str, body: Mapping[str, Any]) -> Prompt:
    """The :class:`Prompt` of a body for ``chat``, ``messages`` or ``completions``.

    Raises:
        BadBody: a required field is missing or of the wrong type.
    """
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadBody("tools", "must be a list of objects")
    if endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                            and all(isinstance(t, int) for t in prompt))):
            raise BadBody("prompt", "must be a string or a list of token ids")
        msgs = ({"role": "prompt", "content": prompt},)
        return Prompt(msgs, tuple(tools), (1,))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadBody("messages", "must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadBody(f"messages[{i}].role", "missing or not a string")
    msgs = list(messages)
    if endpoint == "messages" and body.get("system") is not None:
        system = body["system"]
        if not isinstance(system, (str, list)):
            raise BadBody("system", "must be a string or a list of blocks")
        msgs.insert(0, {"role": "system", "content": system})
    return Prompt(tuple(msgs), tuple(tools), tuple(range(1, len(msgs))))


class CanonicalCache:
    """:func:`~prefixscope.core.identity.canonical_json` of messages and tool lists,
    remembered (the same system prompt, tools and earlier turns recur request after request;
    their canonical form costs NFC normalisation, key sorting and ``json.dumps``).

    The key is the value's msgspec JSON encoding: two decoded JSON values with the same
    encoding are the same value (types included: ``1`` / ``1.0`` / ``true`` differ), except
    that msgspec writes a non-finite float as ``null``, so a value whose encoding contains
    ``null`` is never cached (computed each time). At most ``max_bytes`` of keys and forms
    are kept; then the cache starts over.
    """

    def __init__(self, max_bytes: int = 32 << 20) -> None:
        self.max_bytes = max_bytes
        self._forms: dict[bytes, bytes] = {}
        self._bytes = 0

    def __call__(self, value: Any) -> bytes:
        try:
            raw = _encode(value)
        except (TypeError, ValueError, OverflowError):
            return canonical_json(value)
        form = self._forms.get(raw)
        if form is not None:
            return form
        form = canonical_json(value)
        if b"null" not in raw:
            size = len(raw) + len(form)
            if self._bytes + size > self.max_bytes:
                self._forms.clear()
                self._bytes = 0
            self._forms[raw] = form
            self._bytes += size
        return form
