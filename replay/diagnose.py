"""Why the cache misses: per-request attribution of prefix-cache misses (``prefixscope diagnose``).

One pass over a trace, in trace order, with two models side by side:

1. **The exact cache model** (``replay/sim.py``'s request factory, ``KVCacheManager`` and
   sequential replay, the same objects ``replay sim`` runs): each request's ``cached_tokens``
   as vLLM would report it at this block size and capacity.
2. **A prefix index** of every block key ever cached (prompt and decode blocks, the same
   chained keys the model computes, so salts and LoRA identities keep requests apart as in
   vLLM), each key with its block's tokens and the structure of the request that first wrote
   it. Memory grows with the unique blocks (unique prefixes), not with requests x length, and
   is bounded: past :func:`index_capacity` blocks the least recently used ones are pruned
   (:meth:`Attributor.prune`), so a prefix last seen long ago counts as not seen before.

For each request the index gives ``L``, the number of its leading prompt blocks that some
earlier request had (the longest common prefix by the block-hash chain, capped at vLLM's
lookup limit ``floor((n - 1) / B)`` blocks), and the first divergent token: inside block ``L``,
against the earlier request whose block ``L`` shares the most leading tokens (the last
:data:`MAX_CHILDREN` children of the parent key are compared). That token is mapped back to the
rendered prompt (``replay/diagnose_render.py``): message index and role, line and column, or
the tools list (tool, schema key), or the template's own text; and classified
(:data:`KINDS`). When the exact model cached less than ``L`` blocks the prefix existed but was
evicted at this capacity (kind ``evicted``).

``replay/diagnose_fix.py`` groups the attributions into breakers, measures their lost tokens by
counterfactual replay, and suggests and verifies a layout. Never writes prompt text anywhere:
values are kept as digests; the text context of ``--request`` is produced on demand.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from prefixscope.replay.diagnose_render import Position, Rendered, contents_of
from prefixscope.replay.diagnose_replay import (  # noqa: F401  (re-exported)
    DiagnoseSpec,
    ExactCache,
    TraceSource,
    open_trace,
    replay_totals,
)
from prefixscope.replay.kv_cache_manager import SimRequest
from prefixscope.replay.sim import SimSummary
from prefixscope.replay.trace_common import TraceProblem
from prefixscope.replay.types import TraceRequest

#: Kinds of divergence. The first group are breakers (a later request lost tokens it could
#: have been served from cache); ``new_content`` and ``short`` are not (nothing earlier to
#: match, or nothing cacheable).
KINDS = (
    "timestamp", "id", "number", "name", "value", "fields", "whitespace", "changing_region",
    "reply_resent", "tools_reordered", "tools_added", "tools_removed", "tool_key_order",
    "tool_description", "tool_schema", "template_text", "reordered_content",
    "history_rewritten", "edited_text", "different_salt", "model_switch", "evicted",
    "divergent_block", "new_content", "short",
)
#: Every kind in plain words (``--json`` ``what``; the terminal's breaker lines).
KIND_WORDS = {
    "timestamp": "a date or time that changes",
    "id": "an id that changes (session, request, UUID)",
    "number": "a number that changes",
    "name": "a name that changes",
    "value": "a value that changes (a handle, a code)",
    "fields": "several values on one line that change",
    "whitespace": "only whitespace changes",
    "changing_region": "a block of lines that changes (retrieved documents, a pasted file, "
                       "a list)",
    "reply_resent": "an earlier reply re-sent differently from what the model generated",
    "tools_reordered": "the same tools in another order",
    "tools_added": "tools added to the list",
    "tools_removed": "tools removed from the list",
    "tool_key_order": "a tool's JSON keys in another order",
    "tool_description": "a tool's description changes",
    "tool_schema": "a tool's schema changes",
    "template_text": "the chat template's own text changes",
    "reordered_content": "the same lines in another order",
    "history_rewritten": "older turns rewritten (summarised or truncated)",
    "edited_text": "the text was edited",
    "different_salt": "another cache_salt",
    "model_switch": "another model",
    "evicted": "the prefix was cached but evicted",
    "divergent_block": "requests part at this block (no text in the trace)",
    "new_content": "new content (not a breaker)",
    "short": "shorter than one block (not a breaker)",
}
NOT_BREAKERS = ("new_content", "short")
#: Children of a block key compared for the first divergent token.
MAX_CHILDREN = 16
#: Distinct message texts kept interned at most (then the table starts again).
MAX_INTERNED = 200_000
#: Fewest blocks the prefix index keeps before it prunes (a node with its 16 token ids is about
#: 600 bytes: 1,500,000 blocks is about 1 GB; unpruned, a 12,000-request Mooncake trace needed
#: about 10 GB). See :func:`index_capacity`.
MIN_INDEX_BLOCKS = 1_500_000
#: A prune keeps this share of the capacity, the most recently used blocks.
PRUNE_KEEP = 0.75


def index_capacity(capacity_blocks: int | None) -> int:
    """Most blocks the prefix index holds: ``max(MIN_INDEX_BLOCKS, 2 * capacity_blocks)``
    (``capacity_blocks``: the exact model's ``num_gpu_blocks``).

    A prune keeps the ``PRUNE_KEEP`` (3/4) most recently used, so the index always holds at
    least 1.5 times the exact cache's capacity: every block the cache model can still hold (it
    evicts the least recently used free blocks too, ``vllm/v1/core/block_pool.py``) and at least
    half a capacity of blocks it has evicted, which is what kind ``evicted`` needs. A prefix
    used less recently than that is diagnosed as if never seen (``new_content`` or a divergence
    where the kept part ends), never a stop. ``capacity_blocks`` None (an unbounded cache):
    :data:`MIN_INDEX_BLOCKS`."""
    return max(MIN_INDEX_BLOCKS, 2 * (capacity_blocks or 0))

_DATE = re.compile(
    r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}(:\d{2})?|\b\d{1,2}/\d{1,2}/\d{2,4}\b|"
    r"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\b|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
    r"[a-z]*\b|\b1[5-9]\d{8}(\.\d+)?\b")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEXID = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", re.I)
_TOKENID = re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{10,}\b")
_NUMBER = re.compile(r"^[+-]?\d[\d,._]*$")
_NAME = re.compile(r"^[A-Z][a-z'’-]+(?: [A-Z][a-z'’-]+){0,2}$")
_WORDCH = re.compile(r"[\w:.\-/+]")


@dataclass(frozen=True, slots=True)
class Struct:
    """What the index keeps of a request that wrote blocks: ids and text parts (interned)."""

    request_id: str
    messages: tuple[tuple[str, str], ...] | None
    tool_json: tuple[str, ...]
    tool_names: tuple[str, ...]
    model: str | None
    scope: tuple[Any, ...]
    num_tokens: int
    #: The reply the model generated (token ids, with the end-of-turn), when the trace has it.
    reply_ids: tuple[int, ...] = ()


class _Node:
    __slots__ = ("tokens", "struct", "children", "decode", "used")

    def __init__(self, tokens: tuple[int, ...] | None, struct: Struct, decode: bool,
                 used: int) -> None:
        self.tokens = tokens
        self.struct = struct
        self.children: list[Hashable] = []  # keys; a pruned one is skipped where read
        self.decode = decode
        self.used = used  # the number of the last request that wrote or passed this block


@dataclass(slots=True)
class Attribution:
    """Why one request missed (or ``kind`` None: it hit everything it could).

    Attributes:
        request_id, source: the request and its ``file:line``.
        prompt_tokens, cached_tokens: the exact model's counts (tokens).
        matchable_tokens: tokens of the longest prefix some earlier request had, in full blocks,
            capped at vLLM's lookup limit (what an unbounded cache would have served).
        limit_tokens: vLLM's lookup limit ``floor((n - 1) / B) * B``.
        divergence_token: index of the first token no earlier request shares (None: none).
        kind: see :data:`KINDS`.
        position: where in the rendered prompt.
        earlier_request_id: the request the prefix was matched against.
        detail: a short structural note (``"tool read_file, key description"``...), no text.
        value_digest: 16-hex SHA-256 of the diverging value (never the value itself).
        group: the breaker this attribution counts towards (see :func:`group_key`).
    """

    request_id: str
    source: str | None
    prompt_tokens: int
    cached_tokens: int
    matchable_tokens: int
    limit_tokens: int
    divergence_token: int | None = None
    kind: str | None = None
    position: Position | None = None
    earlier_request_id: str | None = None
    detail: str | None = None
    value_digest: str | None = None
    group: tuple[Any, ...] | None = None
    # Terminal-only context (never stored): filled when the caller asks for it.
    context: dict[str, str] | None = None
    # In memory only, for the fix of replay/diagnose_fix.py (never stored or printed):
    # (stable text before the value on its line, new line, old line).
    fix_hint: tuple[str, str, str] | None = None
    #: In memory only: the changing lines of a text divergence (a ``changing_region``, or one
    #: line): message index, role, the stable line before them and after them (None: the
    #: content's start / end), the earlier request's lines there (the fixed value of the
    #: counterfactual), this request's lines, and their first and last line numbers here.
    region: tuple[int, str, str | None, str | None, str, str, int, int] | None = None
    #: The kinds of the changing fields of a line (``fields``; one entry for one field).
    fields: tuple[str, ...] | None = None
    #: In memory only (``reply_resent``): (the re-sent content, the model's reply).
    reply: tuple[str, str] | None = None
    #: In memory only (tool kinds): (tool name, the earlier request's JSON of that tool).
    tool_fix: tuple[str, str] | None = None


# --------------------------------------------------------------------------------------------
# attribution
# --------------------------------------------------------------------------------------------


def digest(value: str) -> str:
    """16 hex digits of SHA-256 of ``value`` (what is stored instead of text)."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]


def _word_span(line: str, start: int, end: int) -> str:
    while start > 0 and _WORDCH.match(line[start - 1]):
        start -= 1
    while end < len(line) and _WORDCH.match(line[end]):
        end += 1
    return line[start:end]


def _diff_span(a: str, b: str) -> tuple[int, int, int]:
    """(common prefix length, end of a's differing part, end of b's differing part)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    j = 0
    while j < n - i and a[len(a) - 1 - j] == b[len(b) - 1 - j]:
        j += 1
    return i, len(a) - j, len(b) - j


def classify_text(new_line: str, old_line: str, new_content: str, old_content: str
                  ) -> tuple[str, str]:
    """Kind of a text divergence between two versions of one line (and their messages);
    returns (kind, the new version's diverging value)."""
    if re.sub(r"\s+", "", new_content) == re.sub(r"\s+", "", old_content):
        return "whitespace", new_line
    i, ea, eb = _diff_span(new_line, old_line)
    va, vb = _word_span(new_line, i, ea), _word_span(old_line, i, eb)
    for v in (va, vb):
        if _DATE.search(v):
            return "timestamp", va
    for v in (va, vb):
        if _UUID.search(v) or _HEXID.search(v) or _TOKENID.search(v):
            return "id", va
    if va and vb and _NUMBER.match(va) and _NUMBER.match(vb):
        return "number", va
    new_lines, old_lines = new_content.split("\n"), old_content.split("\n")
    if new_line.strip() and old_line.strip() and new_line in old_lines and old_line in new_lines:
        return "reordered_content", new_line
    # One name-like word (or two) swapped: a per-user value.
    wa = new_line[i:ea].strip() or va
    wb = old_line[i:eb].strip() or vb
    if _NAME.match(_word_span(new_line, i, ea) or wa) and _NAME.match(_word_span(old_line, i, eb) or wb):
        return "name", va
    if _VALUE.match(va) and _VALUE.match(vb):
        return "value", va
    return "edited_text", va or new_line


#: A value-like word: no spaces, at most 40 characters, with a digit or one of ``._@/-``
#: between letters ("dana.k", "eu-west-3", "A-1042").
_VALUE = re.compile(r"^(?=\S*[\d._@/-])[\w.@/+:-]{1,40}$")
_FIELD_TOKEN = re.compile(r"[\w][\w.@/+:-]*|\S")


def line_fields(new_line: str, old_line: str) -> list[tuple[str, str]]:
    """The changing fields of one line: ``[(kind, new value), ...]`` in line order, one per
    run of words that differs (difflib on words; the punctuation between them is stable). A
    line can hold several ("Account: 71810 (seat dana.k)": a number and a value). The kind of
    each is :func:`classify_text`'s for that field alone (``edited_text`` when it is prose)."""
    import difflib

    a, b = _FIELD_TOKEN.findall(new_line), _FIELD_TOKEN.findall(old_line)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        va, vb = " ".join(a[i1:i2]), " ".join(b[j1:j2])
        kind, _ = classify_text(va, vb, va, vb) if va and vb else ("edited_text", va)
        out.append((kind, va))
    return out


def group_key(kind: str, pos: Position | None) -> tuple[Any, ...]:
    """The breaker an attribution counts towards: its kind and structural position
    (message role and index and line; tools; template header), never text."""
    if kind in ("evicted", "different_salt", "model_switch"):
        return (kind,)
    if pos is None:
        return (kind,)
    if kind in ("tools_reordered", "tools_added", "tools_removed"):
        return (kind, "tools")
    if kind in ("tool_schema", "tool_key_order", "tool_description"):
        return (kind, "tools", pos.tool_name, pos.schema_key)
    if pos.segment == "message":
        return (kind, "message", pos.role, pos.message_index, pos.line)
    if pos.segment in ("tokens", "blocks"):
        return (kind, pos.segment, pos.block)
    return (kind, pos.segment, pos.role, pos.message_index)


class Attributor:
    """The prefix index and the per-request attribution (see the module docstring)."""

    def __init__(self, block_size: int, *, with_context: str | None = None,
                 capacity: int = MIN_INDEX_BLOCKS,
                 decode: Callable[[tuple[int, ...]], str] | None = None) -> None:
        self.bs = block_size
        self.decode = decode  # reply token ids -> text (chat traces), for reply_resent
        self.capacity = capacity  # most blocks in the index (index_capacity)
        self.pruned_blocks = 0  # blocks pruned so far
        self.index: dict[Hashable, _Node] = {}
        self.roots: dict[tuple[Any, ...], list[Hashable]] = {}
        self.first_blocks: dict[tuple[int, ...], set[tuple[Any, ...]]] = {}
        self.scopes: set[tuple[Any, ...]] = set()
        self._texts: dict[str, str] = {}
        self.with_context = with_context  # a request id: fill its terminal context
        self.requests_seen = 0  # requests that reached the index (the recency clock)

    def _intern(self, s: str) -> str:
        # One copy of each text (a system prompt is shared by many structs); bounded: clearing
        # only costs duplicates, never correctness.
        if len(self._texts) > MAX_INTERNED:
            self._texts.clear()
        return self._texts.setdefault(s, s)

    def _struct(self, tr: TraceRequest, rendered: Rendered | None, scope: tuple[Any, ...],
                num_tokens: int) -> Struct:
        if rendered is None:
            return Struct(tr.request_id, None, (), (), tr.model, scope, num_tokens)
        msgs = tuple((self._intern(str(m.get("role"))), self._intern(str(m.get("content") or "")))
                     for m in rendered.messages)
        reply = tuple(tr.output_token_ids or ()) if self.decode is not None else ()
        return Struct(tr.request_id, msgs, tuple(self._intern(t) for t in rendered.tool_json),
                      tuple(rendered.tool_names()), tr.model, scope, num_tokens, reply)

    def attribute(self, tr: TraceRequest, rendered: Rendered | None, req: SimRequest | None,
                  cached_tokens: int) -> Attribution:
        """Attribute one request (after the exact model ran it) and add its blocks."""
        bs = self.bs
        n = tr.num_prompt_tokens
        limit_blocks = max(n - 1, 0) // bs
        a = Attribution(tr.request_id, tr.source, n, cached_tokens, 0, limit_blocks * bs)
        if req is None:  # rejected: never ran
            return a
        keys = req.block_keys
        n_prompt_blocks = n // bs
        tokens = req.prompt if req.prompt is not None else None
        outputs = req.outputs
        scope = (tr.cache_salt, tr.lora_name, tr.lora_path)
        self.scopes.add(scope)
        index = self.index
        L = 0
        passed: list[_Node] = []
        while L < n_prompt_blocks:
            node = index.get(keys[L])
            if node is None:
                break
            passed.append(node)
            L += 1
        a.matchable_tokens = min(L, limit_blocks) * bs
        if limit_blocks == 0:
            a.kind = "short"
        elif cached_tokens < a.matchable_tokens:
            a.kind = "evicted"
            a.divergence_token = cached_tokens
            a.earlier_request_id = index[keys[cached_tokens // bs]].struct.request_id
            a.group = ("evicted",)
            a.detail = f"{(a.matchable_tokens - cached_tokens) // bs} blocks were cached earlier"
            if rendered is not None:
                a.position = rendered.locate(rendered.char_of_token(cached_tokens))
        elif L < limit_blocks:
            self._divergence(a, tr, rendered, keys, tokens, L, scope)
        # Register this request's blocks (prompt, then decode blocks).
        new_from = L
        # Blocks the cache holds after the request: full prompt blocks and the decode blocks
        # filled by fed-back tokens (the last sampled token is never fed back).
        cacheable = min(len(keys), (n + max(req.max_tokens, 1) - 1) // bs)
        struct = self._struct(tr, rendered, scope, n + len(outputs))
        # Every block this request passed through now names it: the earlier request of a
        # later divergence is the most recent one with that prefix (memory stays bounded:
        # a struct lives while a block names it).
        now = self.requests_seen
        for node in passed:
            node.struct = struct
            node.used = now
        if new_from < cacheable:
            for i in range(new_from, cacheable):
                k = keys[i]
                if k in index:
                    continue
                if tokens is not None:
                    lo, hi = i * bs, (i + 1) * bs
                    if hi <= n:
                        blk = tuple(tokens[lo:hi])
                    else:
                        blk = tuple([*tokens[lo:n], *outputs[max(0, lo - n):hi - n]])
                else:
                    blk = None
                node = _Node(blk, struct, i >= n_prompt_blocks, now)
                index[k] = node
                parent = self.roots.setdefault(scope, []) if i == 0 else index[keys[i - 1]].children
                parent.append(k)
                if len(parent) > MAX_CHILDREN:
                    del parent[0]
            if tokens is not None and L == 0 and n >= bs:
                self.first_blocks.setdefault(tuple(tokens[:bs]), set()).add(scope)
            if len(index) > self.capacity:
                self.prune()
        self.requests_seen += 1
        if a.kind is not None and a.kind not in NOT_BREAKERS and a.group is None:
            a.group = group_key(a.kind, a.position)
        return a

    def prune(self) -> None:
        """Keep the :data:`PRUNE_KEEP` share of :attr:`capacity`, the blocks used by the most
        recent requests (ties: all of a request's blocks go or stay together, so the index may
        pass its capacity by one request's blocks, a few thousand); the first-block
        table keeps its newer half when it passes the capacity too. A pruned block's children
        stay until they age out as well: no walk reaches them (a lookup stops at the first
        missing key of the chain)."""
        index = self.index
        keep = int(self.capacity * PRUNE_KEEP)
        if len(index) <= keep:
            return
        used = sorted(node.used for node in index.values())
        cut = used[len(used) - keep]  # blocks used before request `cut` go
        gone = [k for k, node in index.items() if node.used < cut]
        if not gone:  # one request's blocks fill the kept share: drop the oldest of all
            cut += 1
            gone = [k for k, node in index.items() if node.used < cut]
        for k in gone:
            del index[k]
        self.pruned_blocks += len(gone)
        if len(self.first_blocks) > self.capacity:
            old = list(self.first_blocks)[:len(self.first_blocks) // 2]  # insertion order
            for k in old:
                del self.first_blocks[k]

    def _divergence(self, a: Attribution, tr: TraceRequest, rendered: Rendered | None,
                    keys: list[Hashable], tokens: Any, L: int, scope: tuple[Any, ...]) -> None:
        bs = self.bs
        index = self.index
        children = index[keys[L - 1]].children if L else self.roots.get(scope, [])
        best_j, best = -1, None
        if tokens is not None:
            mine = tokens[L * bs:(L + 1) * bs]
            for k in reversed(children):
                node = index.get(k)
                if node is None or node.tokens is None:
                    continue
                theirs = node.tokens
                j = 0
                m = min(len(mine), len(theirs))
                while j < m and mine[j] == theirs[j]:
                    j += 1
                if j > best_j:
                    best_j, best = j, node
        else:
            for k in reversed(children):  # the newest child still in the index
                best = index.get(k)
                if best is not None:
                    best_j = 0
                    break
        if best is None:
            # Nothing earlier continues this prefix: new content (cold), or a scope apart.
            if L == 0 and tokens is not None and len(self.scopes) > 1:
                others = self.first_blocks.get(tuple(tokens[:bs]), set()) - {scope}
                if others:
                    other = next(iter(others))
                    a.kind = "model_switch" if other[0] == scope[0] and other[1] != scope[1] \
                        else "different_salt"
                    a.divergence_token = 0
                    a.detail = ("the same prompt start was cached under another "
                                + ("model" if a.kind == "model_switch" else "cache_salt"))
                    if rendered is not None:
                        a.position = rendered.locate(0)
                    return
            a.kind = "new_content"
            a.divergence_token = L * bs
            if L:
                a.earlier_request_id = index[keys[L - 1]].struct.request_id
            if rendered is not None:
                a.position = rendered.locate(rendered.char_of_token(L * bs))
            return
        d = L * bs + max(best_j, 0)
        a.divergence_token = d
        earlier = best.struct
        a.earlier_request_id = earlier.request_id
        if rendered is None or earlier.messages is None:
            # No text: a span was edited when the rest of the divergent block lines up again
            # (at least 4 equal tokens at its end, shifted by at most 4); otherwise the request
            # goes on with its own content. Hash-id traces: block level only.
            a.position = Position("tokens" if tokens is not None else "blocks", block=L)
            a.kind = "edited_text" if tokens is not None else "divergent_block"
            if best.decode or (tokens is not None and not _realigns(
                    list(tokens[L * bs:(L + 1) * bs]), list(best.tokens or ()), best_j)):
                a.kind = "new_content"
            return
        self._classify(a, rendered, earlier, best.decode)

    def _classify(self, a: Attribution, r: Rendered, e: Struct, decode: bool) -> None:
        char = r.char_of_token(a.divergence_token or 0)
        pos = r.locate(char)
        new_names = r.tool_names()
        old_names = list(e.tool_names)
        tools_differ = tuple(r.tool_json) != e.tool_json
        if pos.segment == "tools" or (tools_differ and pos.segment == "template"
                                      and pos.message_index in (0, 1) and char < _tools_end(r)):
            if sorted(new_names) == sorted(old_names) and new_names != old_names:
                kind = "tools_reordered"
                i = next(k for k, (x, y) in enumerate(zip(new_names, old_names)) if x != y)
                a.detail = f"tool {i + 1} is {new_names[i]} (was {old_names[i]})"
            elif set(new_names) > set(old_names) or (len(new_names) > len(old_names)
                                                     and new_names[:len(old_names)] == old_names):
                kind = "tools_added"
                a.detail = "added " + ", ".join(sorted(set(new_names) - set(old_names)) or ["a tool"])
            elif set(new_names) < set(old_names) or (len(new_names) < len(old_names)
                                                     and old_names[:len(new_names)] == new_names):
                kind = "tools_removed"
                a.detail = "removed " + ", ".join(sorted(set(old_names) - set(new_names)) or ["a tool"])
            else:
                kind = _tool_change(r, e, pos)
                a.detail = f"tool {pos.tool_name}, key {pos.schema_key}"
                if pos.tool_name in e.tool_names:
                    a.tool_fix = (str(pos.tool_name),
                                  e.tool_json[list(e.tool_names).index(pos.tool_name)])
            a.kind, a.position = kind, pos
            a.value_digest = digest("\n".join(r.tool_json))
            return
        a.position = pos
        i = pos.message_index
        n_old = len(e.messages or ())
        if decode and self.decode is not None and e.reply_ids:
            ai = _reply_index(r, pos)
            if ai is not None and ai == n_old:
                self._reply_resent(a, r, e, ai)
                return
        if i is None or i >= n_old or decode:
            a.kind = "new_content"
            return
        old_role, old_content = e.messages[i]
        new_content = str(r.messages[i].get("content") or "")
        if pos.segment != "message":
            if old_role != r.messages[i].get("role"):
                a.kind = "edited_text"
                a.detail = f"message {i} is {r.messages[i].get('role')} (was {old_role})"
            elif new_content == old_content and i == n_old - 1:
                a.kind = "new_content"
            elif new_content == old_content and e.messages[:i] == contents_of(r)[:i]:
                a.kind = "template_text"  # the same messages: the template rendered otherwise
                a.group = ("template_text", "template", pos.role, i)
            else:
                a.kind = "history_rewritten" if _rewritten(r, e, i) else "edited_text"
            return
        new_line = r.line_text(i, pos.line or 1)
        old_lines = old_content.split("\n")
        old_line = old_lines[pos.line - 1] if pos.line and pos.line <= len(old_lines) else ""
        region = None if _rewritten(r, e, i) else _region(new_content, old_content)
        if region is not None and _region_goes_on(r, e, i, region):
            before, after, new_block, old_block = region
            a.kind = "changing_region"
            a.value_digest = digest(new_block)
            role = str(r.messages[i].get("role"))
            n_lines = new_block.count("\n") + 1
            a.region = (i, role, before, after, old_block, new_block, pos.line or 1,
                        (pos.line or 1) + n_lines - 1)
            a.group = ("changing_region", "message", role, i, digest(before or ""),
                       digest(after or ""))
            a.detail = f"{n_lines} changing lines from line {pos.line}"
            if self.with_context is not None and a.request_id == self.with_context:
                a.context = _context(r, char, new_line, old_line)
            return
        fields: list[tuple[str, str]] = []
        if _rewritten(r, e, i):
            kind, value = "history_rewritten", new_line
        else:
            kind, value = classify_text(new_line, old_line, new_content, old_content)
            if kind not in ("whitespace", "reordered_content"):
                fields = line_fields(new_line, old_line)
                if len(fields) > 1 and all(k != "edited_text" for k, _ in fields):
                    kind, value = "fields", new_line
                    a.fields = tuple(k for k, _ in fields)
                    a.detail = f"{len(fields)} changing values on the line: " + ", ".join(
                        k for k, _ in fields)
            if kind not in ("whitespace", "reordered_content") and not _same_after(
                    r, e, i, char - _content_start(r, i), self.bs):
                kind = "new_content"  # the request's own content: nothing after it matches
        a.kind = kind
        a.value_digest = digest(value)
        if pos.line:
            lines = new_content.split("\n")
            a.region = (i, str(r.messages[i].get("role")),
                        lines[pos.line - 2] if pos.line > 1 else None,
                        lines[pos.line] if pos.line < len(lines) else None, old_line, new_line,
                        pos.line, pos.line)
        ci, _, _ = _diff_span(new_line, old_line)
        start = ci
        while start > 0 and _WORDCH.match(new_line[start - 1]):
            start -= 1
        a.fix_hint = (_stable_prefix(new_line[:start]), new_line, old_line)
        if a.kind == "reordered_content":
            a.detail = "lines present in both versions, in another order"
        if self.with_context is not None and a.request_id == self.with_context:
            a.context = _context(r, char, new_line, old_line)


    def _reply_resent(self, a: Attribution, r: Rendered, e: Struct, ai: int) -> None:
        """The assistant message ``ai`` is the reply the earlier request generated, re-sent
        otherwise (``reply_resent``): fixable only by the client."""
        assert self.decode is not None
        sent = str(r.messages[ai].get("content") or "")
        reply = self.decode(e.reply_ids)
        a.kind = "reply_resent"
        a.group = ("reply_resent",)
        a.reply = (sent, reply)
        a.value_digest = digest(sent)
        a.detail = "the client re-sent the model's reply " + reply_change(sent, reply)


def reply_change(sent: str, reply: str) -> str:
    """How a re-sent reply ``sent`` differs from the model's ``reply``, in words:
    ``with its whitespace collapsed``, ``with its reasoning stripped``, ``truncated``,
    ``with its markdown re-rendered``, or ``edited``."""
    squash = re.compile(r"\s+")
    if squash.sub("", sent) == squash.sub("", reply):
        return "with its whitespace collapsed"
    bare = re.sub(r"<think>.*?</think>\s*", "", reply, flags=re.S)
    if bare != reply and squash.sub("", bare) == squash.sub("", sent):
        return "with its reasoning stripped"
    if sent.strip() and reply.startswith(sent.rstrip()):
        return "truncated"
    marks = re.compile(r"[\s*_`#>|-]+")
    if marks.sub("", sent) == marks.sub("", reply):
        return "with its markdown re-rendered"
    return "edited"


def _reply_index(r: Rendered, pos: Position) -> int | None:
    """The assistant message a divergence at ``pos`` is in: its content or tool calls, or the
    template text right after it (a truncated reply ends early)."""
    i = pos.message_index
    if i is None:
        return None
    if pos.segment in ("message", "tool_calls") and pos.role == "assistant":
        return i
    if pos.segment == "template" and 0 < i <= len(r.messages) \
            and r.messages[i - 1].get("role") == "assistant":
        return i - 1
    return None


def _tool_change(r: Rendered, e: Struct, pos: Position) -> str:
    """``tool_key_order`` (the same tool with its keys in another order: canonical JSON fixes
    it), ``tool_description`` (a description differs) or ``tool_schema`` (the schema
    changed), for a divergence inside tool ``pos.tool_index``."""
    import json

    k = pos.tool_index
    names = list(e.tool_names)
    if k is None or k >= len(r.tool_json) or pos.tool_name not in names:
        return "tool_schema"
    new = json.loads(r.tool_json[k])
    old = json.loads(e.tool_json[names.index(pos.tool_name)])
    if new == old:
        return "tool_key_order"

    def bare(t: Any) -> Any:
        if isinstance(t, dict):
            return {x: bare(v) for x, v in t.items() if x != "description"}
        if isinstance(t, list):
            return [bare(v) for v in t]
        return t

    return "tool_description" if bare(new) == bare(old) else "tool_schema"


def _region(new: str, old: str) -> tuple[str | None, str | None, str, str] | None:
    """The changing block of two versions of a message, when it spans more than one line in
    either: (the stable line before it or None, the stable line after it or None, its lines in
    ``new``, its lines in ``old``); None for a one-line change, the same lines in another
    order, or whitespace only."""
    import difflib

    a, b = new.split("\n"), old.split("\n")
    hunks = [o for o in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
             if o[0] != "equal"]
    if not hunks:
        return None
    _, i1, i2, j1, j2 = hunks[0]  # the first changing block: where the prefix breaks
    ra, rb = a[i1:i2], b[j1:j2]
    if max(len(ra), len(rb)) < 2 or sorted(ra) == sorted(rb):
        return None
    if re.sub(r"\s+", "", "".join(ra)) == re.sub(r"\s+", "", "".join(rb)):
        return None
    return (a[i1 - 1] if i1 else None, a[i2] if i2 < len(a) else None, "\n".join(ra),
            "\n".join(rb))


def _region_goes_on(r: Rendered, e: Struct, i: int,
                    region: tuple[str | None, str | None, str, str]) -> bool:
    """A changing block is a breaker when it is part of a message (a stable line before or
    after it: a whole message that differs is another prompt) and the content goes on after
    it: a stable line after it in the message, or the next message the same in both
    requests."""
    if region[0] is None and region[1] is None:
        return False
    if region[1] is not None and region[1].strip():
        return True
    if e.messages and i + 1 < len(e.messages) and i + 1 < len(r.messages):
        nxt = r.messages[i + 1]
        return (str(nxt.get("role")), str(nxt.get("content") or "")) == e.messages[i + 1]
    return False


def _realigns(mine: list[int], theirs: list[int], j: int, *, run: int = 4, shift: int = 4
              ) -> bool:
    """Whether two blocks that first differ at token ``j`` share ``run`` equal tokens after it
    at offsets differing by at most ``shift`` (a substituted span, not new content)."""
    for s in range(-shift, shift + 1):
        for p in range(j + 1, len(mine) - run + 1):
            q = p + s
            if q <= j or q + run > len(theirs):
                continue
            if mine[p:p + run] == theirs[q:q + run]:
                return True
    return False


def _content_start(r: Rendered, i: int) -> int:
    for s in r.spans:
        if s.segment == "message" and s.index == i:
            return s.start
    return 0


def _same_after(r: Rendered, e: Struct, i: int, col: int, block_size: int) -> bool:
    """Whether the prompt goes on the same after a divergence at character ``col`` of message
    ``i``: the two contents share a common ending of at least one block of tokens and a fifth
    of the shorter remainder, or the next message is the same in both. When nothing after the
    divergence matches, the divergence is the request's own content (a new question, another
    conversation), not a breaker: making it match could not give one more cached block."""
    from bisect import bisect_left

    new = str(r.messages[i].get("content") or "")
    old = e.messages[i][1] if e.messages and i < len(e.messages) else ""
    ra, rb = new[col:], old[col:]
    n = min(len(ra), len(rb))
    j = 0
    while j < n and ra[len(ra) - 1 - j] == rb[len(rb) - 1 - j]:
        j += 1
    if n and j >= 0.2 * n:
        start = _content_start(r, i)
        lo = bisect_left(r.offsets, start + len(new) - j)
        hi = bisect_left(r.offsets, start + len(new))
        if hi - lo >= block_size:
            return True
    # The lines after the divergent one are still there (a document edited near its start,
    # followed by a question that differs): the content goes on.
    line = new[:col].count("\n") + 1
    new_after = set(new.split("\n")[line:])
    following = [x for x in old.split("\n")[line:] if x.strip()][:3]
    if following and all(x in new_after for x in following) \
            and sum(map(len, following)) >= 4 * block_size:
        return True
    if e.messages and i + 1 < len(e.messages) and i + 1 < len(r.messages):
        nxt = r.messages[i + 1]
        return (str(nxt.get("role")), str(nxt.get("content") or "")) == e.messages[i + 1] \
            and bool(e.messages[i + 1][1])
    return False


_WEEKDAY = r"(?:Mon|Tues?|Wed(?:nes)?|Thu(?:rs)?|Fri|Sat(?:ur)?|Sun)(?:day)?"
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
          r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_VOLATILE_TAIL = re.compile(rf"(?:\b{_WEEKDAY}\b|\b{_MONTH}\b|\b\d[\d:./T-]*)[\s,:./T-]*$")


def _stable_prefix(prefix: str) -> str:
    """``prefix`` (the text of a line before its differing word) without the date, time or
    number parts at its end: "Current time: 2026-11-30 " becomes "Current time: " when only the
    seconds differed in this log, so that the suggested pattern still matches tomorrow."""
    while True:
        m = _VOLATILE_TAIL.search(prefix)
        if m is None or m.start() == len(prefix):
            return prefix
        prefix = prefix[:m.start()]


def _common_prefix(a: str, b: str) -> str:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return a[:i]


def _tools_end(r: Rendered) -> int:
    """Where the rendered tool list ends (plus a little template text after it); when the
    template renders tools in a form that was not located (e.g. indented JSON), the whole
    template text before the first located message content counts."""
    ends = [s.end for s in r.spans if s.segment == "tools"]
    if ends:
        return max(ends) + 16
    if r.tools:
        starts = [s.start for s in r.spans if s.segment == "message"]
        return len(r.text) if not starts else max(starts)
    return -1


def _rewritten(r: Rendered, e: Struct, i: int) -> bool:
    """An earlier turn of the conversation was replaced (summarised, truncated): the
    divergence is in a non-system message before the last user message, and the new request
    has no more messages than the earlier one had."""
    roles = [m.get("role") for m in r.messages]
    if roles[i] in ("system", "developer"):
        return False
    users = [k for k, x in enumerate(roles) if x == "user"]
    if not users or i >= users[-1]:
        return False
    return len(r.messages) <= len(e.messages or ())


def _context(r: Rendered, char: int, new_line: str, old_line: str, width: int = 24
             ) -> dict[str, str]:
    i, _, _ = _diff_span(new_line, old_line)
    return {"new": new_line[max(0, i - width):i + width], "old": old_line[max(0, i - width):i + width],
            "offset": str(min(i, width))}


# --------------------------------------------------------------------------------------------
# one pass
# --------------------------------------------------------------------------------------------


@dataclass
class Pass:
    """One attribution pass: the exact model's totals and the attributions (``records`` only
    when kept), breakers by group, problems."""

    summary: SimSummary
    groups: dict[tuple[Any, ...], dict[str, Any]]
    problems: list[TraceProblem]
    format: str
    cold_requests: int = 0
    short_requests: int = 0
    full_hit_requests: int = 0
    shared_prefix_requests: int = 0
    records: list[Attribution] | None = None
    explained: Attribution | None = None
    unique_blocks: int = 0  # blocks added to the index (one pruned and seen again: twice)
    pruned_blocks: int = 0  # of them, pruned (least recently used; Attributor.prune)


#: Re-sent replies a ``reply_resent`` breaker keeps (their counterfactual restores them).
MAX_REPLIES = 20_000
#: Request ids a breaker keeps (what the ``requests`` count and a client fix refer to).
MAX_GROUP_IDS = 100_000


def _reply_decoder(spec: DiagnoseSpec) -> Callable[[tuple[int, ...]], str]:
    """Token ids of a recorded reply (with the template's end of turn) -> its text."""
    from prefixscope.replay.tokenization import load_chat_tokenizer

    tok = load_chat_tokenizer(spec.tokenizer_dir)
    end = tok.end_of_turn

    def decode(ids: tuple[int, ...]) -> str:
        text = tok._tokenizer.decode(list(ids), skip_special_tokens=False)
        return text[:-len(end)] if end and text.endswith(end) else text

    return decode


#: Kinds of a text divergence that a changing block of lines next to it absorbs.
REGION_PARTS = ("changing_region", "edited_text", "reordered_content", "value", "number", "id")


def merge_regions(groups: dict[tuple[Any, ...], dict[str, Any]]) -> None:
    """Merge, in place, the breakers of one message whose changing lines overlap or touch a
    ``changing_region``'s into one ``changing_region``: a block of retrieved documents that
    changes every turn parts from an earlier request at whichever of its lines differs first
    (line 1 in one request, line 3 or a single line in another); it is one region. The merged
    region runs from the first line of any part to the last, between the stable line before
    the first part and the one after the last; counts, lost-token bounds, values and request
    ids are summed (united)."""
    by_msg: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for key, g in groups.items():
        if g["kind"] in REGION_PARTS and g.get("region") is not None:
            by_msg.setdefault(g["region"][:2], []).append(key)
    for keys in by_msg.values():
        if not any(groups[k]["kind"] == "changing_region" for k in keys):
            continue
        keys.sort(key=lambda k: (groups[k]["region"][6], -groups[k]["region"][7]))
        runs: list[list[tuple[Any, ...]]] = []
        end = -1
        for k in keys:
            lo, hi = groups[k]["region"][6:8]
            if runs and lo <= end + 1:
                runs[-1].append(k)
                end = max(end, hi)
            else:
                runs.append([k])
                end = hi
        for run in runs:
            if len(run) < 2 or not any(groups[k]["kind"] == "changing_region" for k in run):
                continue
            parts = [groups.pop(k) for k in run]
            first = parts[0]
            last = max(parts, key=lambda g: g["region"][7])
            main = max((g for g in parts if g["kind"] == "changing_region"),
                       key=lambda g: g["requests"])
            i, role, before = first["region"][:3]
            after, hi = last["region"][3], last["region"][7]
            merged = dict(main)
            merged["region"] = (i, role, before, after, main["region"][4], main["region"][5],
                                first["region"][6], hi)
            merged["requests"] = sum(g["requests"] for g in parts)
            merged["tokens_after"] = sum(g["tokens_after"] for g in parts)
            merged["distinct"] = set().union(*(g["distinct"] for g in parts))
            merged["request_ids"] = set().union(*(g["request_ids"] for g in parts))
            merged["position"] = first["position"]
            merged["detail"] = f"lines {first['region'][6]} to {hi} change"
            groups[("changing_region", "message", role, i, digest(before or ""),
                    digest(after or ""))] = merged


def attribution_pass(spec: DiagnoseSpec, *, layout: Any = "spec", keep_records: bool = False,
                     explain: str | None = None) -> Pass:
    """Run the exact model and the attribution over the whole trace once.

    Args:
        spec: trace and cache options.
        layout: override ``spec.layout`` (None: as recorded).
        keep_records: keep every :class:`Attribution` (tests; memory grows with requests).
        explain: a request id whose attribution is kept with its terminal context.

    Returns:
        :class:`Pass`; ``groups`` maps a group key to ``{kind, position, requests,
        matchable_lost, distinct (set of value digests), example}``.
    """
    src = open_trace(spec, layout=layout)
    config = spec.sim_config()
    cache = ExactCache(config, scope_by_model=spec.scope_by_model)
    att = Attributor(spec.block_size, with_context=explain,
                     capacity=index_capacity(config.num_gpu_blocks),
                     decode=_reply_decoder(spec) if src.format == "chat" else None)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    records: list[Attribution] | None = [] if keep_records else None
    p = Pass(summary=cache.summary(), groups=groups, problems=src.problems, format=src.format)
    for tr, rendered in src.items:
        req, res = cache.run(tr)
        a = att.attribute(cache.prepare(tr), rendered, req, res.cached_tokens)
        cache.release(req)
        if records is not None:
            records.append(a)
        if explain is not None and a.request_id == explain:
            p.explained = a
        if a.matchable_tokens > 0:
            p.shared_prefix_requests += 1
        if a.kind is None:
            p.full_hit_requests += 1
            continue
        if a.kind == "new_content":
            p.cold_requests += 1
            continue
        if a.kind == "short":
            p.short_requests += 1
            continue
        g = groups.get(a.group)
        if g is None:
            g = groups[a.group] = {"kind": a.kind, "position": a.position, "requests": 0,
                                   "distinct": set(), "example": a.request_id,
                                   "earlier": a.earlier_request_id, "detail": a.detail,
                                   "tokens_after": 0, "prefix": None, "pairs": [],
                                   "region": a.region, "fields": a.fields, "replies": {},
                                   "tool_fix": a.tool_fix,
                                   "request_ids": set()}
        g["requests"] += 1
        if len(g["request_ids"]) < MAX_GROUP_IDS:
            g["request_ids"].add(a.request_id)
        if a.reply is not None and len(g["replies"]) < MAX_REPLIES:
            g["replies"].setdefault(a.reply[0], a.reply[1])
        if a.fields is not None and len(a.fields) > len(g["fields"] or ()):
            g["fields"] = a.fields
        if a.fix_hint is not None:
            pre, new_line, old_line = a.fix_hint
            g["prefix"] = pre if g["prefix"] is None else _common_prefix(g["prefix"], pre)
            if len(g["pairs"]) < 8 and (new_line, old_line) not in g["pairs"]:
                g["pairs"].append((new_line, old_line))
        g["tokens_after"] += max(0, a.limit_tokens - (a.divergence_token or 0))
        if a.value_digest and len(g["distinct"]) < 100_000:
            g["distinct"].add(a.value_digest)
    merge_regions(groups)
    p.summary = cache.summary()
    p.records = records
    p.unique_blocks = len(att.index) + att.pruned_blocks
    p.pruned_blocks = att.pruned_blocks
    return p
