"""Chat-completions request bodies as the replay reads them (one JSONL line = one request).

:func:`chat_body` finds the body in a line (bare, or under ``request_body``/``body``/``request``)
and returns it in the OpenAI chat-completions shape; an Anthropic ``/v1/messages`` body is
converted (top-level ``system`` -> a system message; ``text`` blocks -> text; ``tool_use`` ->
``tool_calls``; ``tool_result`` -> ``tool`` messages; tools' ``input_schema`` -> ``parameters``;
other block types such as images and thinking are dropped). :func:`output_tokens_of` picks the
output length to simulate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prefixscope.replay.trace_common import MAX_TRACE_TOKENS


class BodyError(ValueError):
    """A line whose request body cannot be used; ``field`` is the JSON path at fault."""

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(reason)
        self.field = field


_WRAPPERS = ("request_body", "body", "request")
#: Message roles a chat request may use (OpenAI chat completions; Anthropic bodies use
#: user/assistant and a top-level system).
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def chat_body(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI-shaped chat request of one trace line (a new dict; the input is not changed).

    Raises:
        BodyError: no ``messages`` list, or a message that is not an object with a role.
    """
    body: Any = obj
    prefix = "$"
    if "messages" not in obj:
        for key in _WRAPPERS:
            if isinstance(obj.get(key), Mapping):
                body, prefix = obj[key], f"$.{key}"
                break
    messages = body.get("messages") if isinstance(body, Mapping) else None
    if not isinstance(messages, list) or not messages:
        raise BodyError(f"{prefix}.messages", "missing, empty or not a list")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise BodyError(f"{prefix}.messages[{i}]", "not an object with a role")
        if m["role"] not in ROLES:
            raise BodyError(f"{prefix}.messages[{i}].role",
                            f"unknown role (use one of {', '.join(ROLES)})")
    if _is_anthropic(body, obj):
        _check_anthropic(body, prefix)
        return _from_anthropic(body)
    out = dict(body)
    out["messages"] = [dict(m) for m in messages]
    if out.get("tools") is not None and not isinstance(out["tools"], list):
        raise BodyError(f"{prefix}.tools", "not a list")
    for i, t in enumerate(out.get("tools") or []):
        fn = t.get("function", t) if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise BodyError(f"{prefix}.tools[{i}]", "not a tool object with a function name")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], Mapping):
            # vLLM 0.32 FunctionDefinition.parameters is dict | None: the server answers 400
            raise BodyError(f"{prefix}.tools[{i}].function.parameters",
                            "not a JSON schema object")
    return out


def _check_anthropic(body: Mapping[str, Any], prefix: str) -> None:
    """Refuse an Anthropic Messages body vLLM 0.32's ``/v1/messages`` would answer 400
    (``AnthropicTool.input_schema`` and a ``tool_use`` block's ``input`` are objects,
    ``vllm/entrypoints/anthropic/protocol.py``), naming the JSON path.

    Raises:
        BodyError: ``tools`` not a list; a tool without a string ``name``; an ``input_schema``
            that is not an object; a ``tool_use`` block whose ``input`` is not an object.
    """
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BodyError(f"{prefix}.tools", "not a list")
    for i, t in enumerate(tools or []):
        if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
            raise BodyError(f"{prefix}.tools[{i}]", "not a tool object with a name")
        if "input_schema" in t and not isinstance(t["input_schema"], Mapping):
            raise BodyError(f"{prefix}.tools[{i}].input_schema", "not a JSON schema object")
    for i, m in enumerate(body.get("messages") or []):
        content = m.get("content") if isinstance(m, Mapping) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if (isinstance(block, Mapping) and block.get("type") == "tool_use"
                    and not isinstance(block.get("input", {}), Mapping)):
                raise BodyError(f"{prefix}.messages[{i}].content[{j}].input", "not an object")


def output_tokens_of(obj: Mapping[str, Any], body: Mapping[str, Any]) -> int:
    """Output tokens to simulate: the line's ``output_tokens``; else the recorded response's
    ``completion_tokens``/``output_tokens`` (``response_usage`` or ``response.usage``); else the
    request's ``max_completion_tokens``/``max_tokens``; else 0.

    Raises:
        BodyError: the line's own ``output_tokens`` is not an integer >= 0, or the count exceeds :data:`~replay.trace_common.MAX_TRACE_TOKENS`."""
    value = obj.get("output_tokens")
    where = "$.output_tokens"
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise BodyError(where, "not an integer >= 0")
    if value is None:
        where = "$.response_usage"
        usage = obj.get("response_usage")
        if not isinstance(usage, Mapping) and isinstance(obj.get("response"), Mapping):
            usage = obj["response"].get("usage")
        if isinstance(usage, Mapping):
            value = usage.get("completion_tokens", usage.get("output_tokens"))
    if value is None:
        value, where = body.get("max_completion_tokens", body.get("max_tokens")), "$.max_tokens"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    if value > MAX_TRACE_TOKENS:
        raise BodyError(where, f"more than {MAX_TRACE_TOKENS:,} tokens")
    return value


def _is_anthropic(body: Mapping[str, Any], line: Mapping[str, Any]) -> bool:
    uri = line.get("uri")
    if isinstance(uri, str) and uri.split("?")[0].endswith("/messages") \
            and not uri.split("?")[0].endswith("/chat/completions"):
        return True
    if "system" in body:
        return True
    tools = body.get("tools")
    if isinstance(tools, list) and any(isinstance(t, Mapping) and "input_schema" in t for t in tools):
        return True
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, list) and any(
                isinstance(b, Mapping) and b.get("type") in ("tool_use", "tool_result")
                for b in content):
            return True
    return False


def _blocks_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, Mapping) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def _from_anthropic(body: Mapping[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _blocks_text(system)})
    for m in body["messages"]:
        role, content = m["role"], m.get("content")
        if isinstance(content, str) or content is None:
            messages.append({"role": role, "content": content or ""})
            continue
        text, calls, results = [], [], []
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text":
                text.append(str(block.get("text", "")))
            elif kind == "tool_use":
                calls.append({"id": block.get("id"), "type": "function", "function": {
                    "name": block.get("name"),
                    "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
            elif kind == "tool_result":
                results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                "content": _blocks_text(block.get("content"))})
        messages.extend(results)
        if text or calls or not results:
            msg: dict[str, Any] = {"role": role, "content": "\n".join(text)}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
    out = {k: v for k, v in body.items() if k not in ("system", "messages", "tools")}
    out["messages"] = messages
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description"),
            "parameters": t.get("input_schema")}} for t in tools if isinstance(t, Mapping)]
    return out
