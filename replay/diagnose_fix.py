"""Breakers ranked by lost tokens, levels, the suggested layout and its verification.

From the attribution passes of :mod:`prefixscope.replay.diagnose`:

- **Breakers**: attributions grouped by kind and structural position
  (:func:`prefixscope.replay.diagnose.group_key`).
- **Lost tokens** of a breaker (``docs/diagnose.md#lost-tokens``): the cached tokens the exact
  model gains, summed over every request of the trace, when the breaking span is made to match
  and nothing else changes: ``cached(trace with the span neutralised) - cached(trace)``, both
  replayed through the exact model (same block size, capacity, algorithm, outputs). The
  neutraliser is a layout transform (:func:`neutraliser`: a fixed placeholder for a volatile
  value, the earlier text for an edit, a stable tool order...); an eviction's counterfactual is
  an unbounded cache. Breakers with no neutraliser get an upper bound (``measured`` false): the
  tokens after the divergence up to vLLM's lookup limit, summed over their requests.
- **Levels**: level 1 is the trace as recorded. Level ``k + 1`` is the attribution of the trace
  with every level-``k`` neutraliser applied: what breaks next (a reordered tool list behind a
  timestamp on line 1). A level-``k + 1`` breaker's lost tokens are measured on top of the
  lower levels' neutralisers.
- **Suggested layout**: one fix per fixable breaker (:func:`suggestion`), in level order, replayed
  through the exact model: ``what_if`` (equal to ``replay sim --layout`` of the written file).
  A volatile system-prompt line is moved to the end of the first user message, or of the last
  one when that replay caches more tokens (both replayed; the better is suggested).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from prefixscope.replay.diagnose import (
    KIND_WORDS,
    NOT_BREAKERS,
    DiagnoseSpec,
    Pass,
    attribution_pass,
    replay_totals,
)
from prefixscope.replay.diagnose_render import Position
from prefixscope.replay.layouts import REWRITING_TYPES, Layout
from prefixscope.replay.sim import SimSummary

#: Breakers measured by counterfactual replay per level (the rest get an upper bound).
MAX_MEASURED = 8
#: Levels diagnosed at most.
MAX_LEVELS = 3

_KIND_RX = {
    "timestamp": r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
                 r"|\b\d{1,2}:\d{2}(?::\d{2})?\b",
    "id": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
          r"|\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{8,}\b",
    "number": r"\b\d[\d,._]*\b",
}
_NOT_FIXABLE = {
    "tools_added": "the tool list changes: keep one tool list for every request (or put tools "
                   "that vary after the stable ones)",
    "tools_removed": "the tool list changes: keep one tool list for every request (or put tools "
                     "that vary after the stable ones)",
    "reordered_content": "the client sends the same content in another order: sort documents "
                         "or pages in a stable order before sending them",
    "edited_text": "the text was edited: every version is a new prefix (nothing a layout can "
                   "undo)",
    "different_salt": "requests use different cache_salt values: isolation by design",
    "model_switch": "the model changed: another model never shares cached blocks",
    "divergent_block": "a hash-id trace names blocks, not text: it says where requests part, "
                       "not what changed",
    "evicted": "the cache dropped the prefix before it was reused: a bigger cache "
               "(--capacity-blocks) or less idle time, not a layout",
}


@dataclass
class Breaker:
    """One ranked breaker (see the module docstring); ``as_dict`` is the ``--json`` entry."""

    level: int
    kind: str
    position: Position | None
    requests: int
    distinct_values: int
    lost_tokens: int
    measured: bool
    suggestion: str
    fixable: bool
    transforms: list[dict[str, Any]]
    neutraliser: list[dict[str, Any]] | None
    example_request: str | None
    earlier_request: str | None
    detail: str | None
    what_if: dict[str, Any] | None = None
    value_digests: list[str] = field(default_factory=list)
    #: The counterfactual run's totals (for costs), None when not measured.
    counterfactual: SimSummary | None = None
    rank: int = 0
    share: float | None = None
    #: The kinds of a line's changing values (``fields``), else None.
    fields: tuple[str, ...] | None = None
    #: A fix that needs a client change: ``{"change": words, "measured": bool,
    #: "hit_rate", "cached_tokens", "prompt_tokens", "prefill_saved_tokens"}`` (the trace
    #: replayed with that change applied; None figures when it cannot be replayed).
    client_fix: dict[str, Any] | None = None
    #: The suggested transforms rewrite values (only with ``allow_rewrites``).
    rewrites_prompt: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (never prompt text; transforms hold the regular expressions the user's
        layout file will hold)."""
        pos = self.position
        return {
            "rank": self.rank, "level": self.level, "kind": self.kind,
            "segment": pos.segment if pos else None,
            "message_index": pos.message_index if pos else None,
            "role": pos.role if pos else None,
            "line": pos.line if pos else None,
            "tool": pos.tool_name if pos else None,
            "schema_key": pos.schema_key if pos else None,
            "block": pos.block if pos else None,
            "requests": self.requests, "distinct_values": self.distinct_values,
            "lost_tokens": self.lost_tokens, "lost_tokens_measured": self.measured,
            "share": self.share, "suggestion": self.suggestion, "fixable": self.fixable,
            "transforms": self.transforms, "example_request": self.example_request,
            "earlier_request": self.earlier_request, "detail": self.detail,
            "what_if": self.what_if,
            "what": KIND_WORDS.get(self.kind, self.kind), "fields": list(self.fields or ()) or None,
            "client_fix": self.client_fix, "rewrites_prompt": self.rewrites_prompt,
        }


@dataclass
class Diagnosis:
    """The result of :func:`diagnose`."""

    spec: DiagnoseSpec
    base: Pass
    breakers: list[Breaker]
    suggested_layout: Layout | None
    what_if: SimSummary | None
    neutralised: SimSummary | None
    levels: int
    passes: int = 0
    notes: list[str] = field(default_factory=list)
    allow_rewrites: bool = False

    @property
    def summary(self) -> SimSummary:
        """The exact model's totals as recorded (= ``replay sim``)."""
        return self.base.summary

    @property
    def prefill_saved(self) -> int | None:
        """The headline gain of the suggested layout: prompt tokens computed (prefilled) as
        recorded minus with the layout (tokens; > 0 by construction), None without one."""
        return None if self.what_if is None else prefill_saved(self.base.summary, self.what_if)


def prefill(s: SimSummary) -> int:
    """Prompt tokens computed, not served from cache (tokens)."""
    return s.prompt_tokens - s.cached_tokens


def prefill_saved(before: SimSummary, after: SimSummary) -> int:
    """Net prefill saved from ``before`` to ``after``: ``prefill(before) - prefill(after)``
    (tokens; negative when ``after`` computes more, e.g. a longer prompt)."""
    return prefill(before) - prefill(after)


def _selector(pos: Position) -> Any:
    """A layout selector naming the message at ``pos`` (``first_system``, ``first_user``...,
    else its index)."""
    return pos.message_index if pos.message_index is not None else "all"


def _selector_in(pos: Position, roles_first: dict[str, int] | None = None) -> Any:
    if pos.role in ("system", "developer") and pos.message_index == 0:
        return "first_system"
    if pos.role == "user" and pos.message_index == 1:
        return "first_user"
    return _selector(pos)


class _Counterfactual:
    """A change of the requests that measures a breaker (never suggested: it may rewrite what
    the model reads); ``apply(body)`` as a layout transform's."""

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - overridden
        return body


def _messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(m) for m in body.get("messages") or []]


def _find_region(lines: list[str], before: str | None, after: str | None) -> tuple[int, int] | None:
    """[start, end) of the lines between the stable line ``before`` (None: the start) and the
    first ``after`` below it (None: the end); None when a stable line is missing."""
    start = 0
    if before is not None:
        if before not in lines:
            return None
        start = lines.index(before) + 1
    end = len(lines)
    if after is not None:
        if after not in lines[start:]:
            return None
        end = lines.index(after, start)
    return start, end


class FixRegion(_Counterfactual):
    """The counterfactual of a ``changing_region``: its lines (between the stable lines
    ``before`` and ``after`` of message ``index`` when it has ``role``) replaced by one fixed
    value, the earlier request's, in every request; everything else as recorded."""

    def __init__(self, index: int, role: str, before: str | None, after: str | None,
                 fixed: str) -> None:
        self.index, self.role, self.before, self.after, self.fixed = index, role, before, after, fixed

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = _messages_of(body)
        if self.index >= len(messages) or messages[self.index].get("role") != self.role:
            return body
        text = messages[self.index].get("content")
        if not isinstance(text, str):
            return body
        lines = text.split("\n")
        span = _find_region(lines, self.before, self.after)
        if span is None:
            return body
        messages[self.index]["content"] = "\n".join(
            lines[:span[0]] + self.fixed.split("\n") + lines[span[1]:])
        return dict(body, messages=messages)


class MoveRegionAfterHistory(FixRegion):
    """The client change "put the changing block after the history": its lines move from
    message ``index`` to the end of the last user message (nothing is rewritten)."""

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = _messages_of(body)
        if self.index >= len(messages) or messages[self.index].get("role") != self.role:
            return body
        text = messages[self.index].get("content")
        users = [k for k, m in enumerate(messages) if m.get("role") == "user"]
        if not isinstance(text, str) or not users or users[-1] == self.index:
            return body
        lines = text.split("\n")
        span = _find_region(lines, self.before, self.after)
        if span is None or span[0] == span[1]:
            return body
        block = lines[span[0]:span[1]]
        messages[self.index]["content"] = "\n".join(lines[:span[0]] + lines[span[1]:])
        last = messages[users[-1]]
        last["content"] = str(last.get("content") or "") + "\n\n" + "\n".join(block)
        return dict(body, messages=messages)


class RestoreReplies(_Counterfactual):
    """The client change "send earlier replies back verbatim": every assistant message whose
    content is a re-sent reply of ``replies`` (re-sent text -> the model's reply) becomes the
    model's reply."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = dict(replies)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        if not any(m.get("role") == "assistant" and m.get("content") in self.replies
                   for m in messages):
            return body
        out = _messages_of(body)
        for m in out:
            if m.get("role") == "assistant" and m.get("content") in self.replies:
                m["content"] = self.replies[m["content"]]
        return dict(body, messages=out)


class FixTool(_Counterfactual):
    """A tool held at one version (the earlier request's JSON of tool ``name``)."""

    def __init__(self, name: str, tool_json: str) -> None:
        import json

        self.name, self.tool = name, json.loads(tool_json)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = body.get("tools")
        if not isinstance(tools, list):
            return body
        out = [self.tool if isinstance(t, dict) and isinstance(t.get("function"), dict)
               and t["function"].get("name") == self.name else t for t in tools]
        return dict(body, tools=out)


def neutraliser(g: dict[str, Any]) -> list[Any] | None:
    """What makes a breaker's span match across requests (the counterfactual of its lost
    tokens): layout transforms (dicts) or :class:`_Counterfactual` objects, or None when
    nothing can (new tools, salts, evictions...)."""
    kind, pos = g["kind"], g["position"]
    if kind == "tools_reordered":
        return [{"type": "sort_tools"}]
    if kind == "tool_key_order":
        return [{"type": "canonical_tool_json"}]
    if kind in ("tool_description", "tool_schema") and g.get("tool_fix"):
        return [FixTool(*g["tool_fix"])]
    if kind == "reply_resent" and g.get("replies"):
        return [RestoreReplies(g["replies"])]
    if kind == "changing_region" and g.get("region"):
        i, role, before, after, fixed = g["region"][:5]
        return [FixRegion(i, role, before, after, fixed)]
    if pos is None or pos.segment != "message":
        return None
    sel = _selector_in(pos)
    if kind == "whitespace":
        return [{"type": "replace", "pattern": r"[ \t]+$", "with": "", "in": sel},
                {"type": "replace", "pattern": r"\s+", "with": " ", "in": sel}]
    prefix = (g.get("prefix") or "").rstrip()
    if kind in ("timestamp", "id", "number", "name", "value", "fields"):
        if len(prefix) >= 3:
            # A short line (a label and its value): the rest of the line becomes the
            # placeholder. A long line (a document on one line after a session id): only the
            # value does, the rest of the line is stable content that must stay.
            rest = r".*$" if not _long_line(g) else \
                "(?:" + (_KIND_RX[kind] + "|" if kind in _KIND_RX else "") + r"[\w:.\-/+]+)"
            return [{"type": "replace", "pattern": "^(" + _escape(g["prefix"]) + ")" + rest,
                     "with": r"\g<1>" + f"<{kind}>", "in": sel}]
        if kind in _KIND_RX:
            return [{"type": "replace", "pattern": _KIND_RX[kind], "with": f"<{kind}>", "in": sel}]
    if kind in ("edited_text", "name", "reordered_content", "history_rewritten"):
        pairs = g.get("pairs") or []
        if kind == "edited_text" and pairs:
            return [{"type": "replace", "pattern": "^" + _escape(new) + "$",
                     "with": old.replace("\\", "\\\\"), "in": sel} for new, old in pairs]
    return None


#: What the client can change when no layout can (``Breaker.client_fix``).
CLIENT_FIXES = {
    "reply_resent": "send earlier replies back verbatim, exactly as the model generated them "
                    "(a client change)",
    "history_rewritten": "stop rewriting older turns: keep the history as sent, or rewrite it "
                         "rarely and all at once (a client change)",
    "changing_region": "put the changing block (retrieved documents, a pasted file) after the "
                       "history, at the end of the last user message (a client change)",
    "tool_description": "keep the tool's description fixed; send what changes in it (a date, "
                        "a count) in the user message (a client change)",
    "tool_schema": "keep one version of every tool (a client change)",
    "template_text": "keep the chat template's own text fixed (no date or value rendered by "
                     "the template)",
}
#: Kinds whose fix is a value rewrite (a placeholder, rounding): suggested only with
#: ``allow_rewrites``.
VALUE_KINDS = ("timestamp", "id", "number", "name", "value", "fields")
REWRITE_LABEL = "rewrites the prompt (--allow-rewrites): "


def suggestion(g: dict[str, Any], *, allow_rewrites: bool = False
               ) -> tuple[str, list[dict[str, Any]], bool]:
    """(what to do, layout transforms that do it, fixable by layout) for one breaker.

    A layout fix only moves lines or normalises what the model reads the same either way
    (tool order, JSON key order: :data:`prefixscope.replay.layouts.REWRITING_TYPES` are never
    among them) unless ``allow_rewrites``: then a placeholder or whitespace normalisation is
    suggested too, its text starting with :data:`REWRITE_LABEL`. A changing value or
    whitespace seen in a single request is not worth a transform (fixable False); a tool order
    is (each order is cached once, so it breaks once however often it recurs)."""
    kind, pos = g["kind"], g["position"]
    once = g.get("requests", 0) < 2
    if kind == "tools_reordered":
        return "sort the tool list by name (sort_tools)", [{"type": "sort_tools"}], True
    if kind == "tool_key_order":
        return ("render tool schemas with sorted keys (canonical_tool_json)",
                [{"type": "canonical_tool_json"}], True)
    if kind in VALUE_KINDS and pos is not None and pos.segment == "message" and not once:
        prefix = g.get("prefix") or ""
        where = f"line {pos.line} of the {pos.role} message"
        if len(prefix.rstrip()) >= 3 and not _long_line(g) and pos.role in ("system", "developer"):
            move = {"type": "move_lines", "pattern": "^" + _escape(prefix),
                    "from": _selector_in(pos), "to": "first_user_end", "separator": "\n\n"}
            what = f"{_article(kind)} {kind}" if kind != "fields" else \
                "values: " + ", ".join(g.get("fields") or ())
            return (f"move {where} ({what}) {FIRST_USER_TEXT}", [move], True)
        t = [x for x in neutraliser(g) or [] if isinstance(x, dict)]
        if t and allow_rewrites:
            return (REWRITE_LABEL + f"replace the {kind} on {where} with a fixed placeholder "
                    "(replace)" + (" or round it (round_times)" if kind == "timestamp" else ""),
                    t, True)
        if t:
            return ("not fixable by a layout that keeps the prompt: a fixed placeholder "
                    f"for the {kind} would fix it, which changes what the model reads "
                    "(--allow-rewrites suggests it)", [], False)
    if kind == "whitespace" and not once:
        if allow_rewrites:
            return (REWRITE_LABEL + "normalise whitespace in that message (replace)",
                    [x for x in neutraliser(g) or [] if isinstance(x, dict)], True)
        return ("not fixable by a layout that keeps the prompt: send the text with the same "
                "whitespace every time (--allow-rewrites suggests normalising it)", [], False)
    if once and kind in (*VALUE_KINDS, "whitespace"):
        return "not worth a transform: seen in a single request", [], False
    if kind in CLIENT_FIXES:
        return "not fixable by layout: " + CLIENT_FIXES[kind], [], False
    text = _NOT_FIXABLE.get(kind, "not fixable by layout")
    return "not fixable by layout: " + text, [], False


#: The first-user target of a moved line, and the last-user one :func:`diagnose` switches to
#: when its replay caches more (the suggestion's text after "move <line> (<kind>)").
FIRST_USER_TEXT = ("to the end of the first user message (move_lines ... to: first_user_end): "
                   "the stable rest becomes a shared prefix and every later turn keeps its "
                   "history")
LAST_USER_TEXT = ("to the end of the last user message (move_lines ... to: last_user_end): "
                  "the stable rest becomes a shared prefix and, as the value changes every "
                  "request, only the newest turn holds it")


def _moved_to_last_user(transforms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``transforms`` with every ``move_lines`` to ``first_user_end`` sent to
    ``last_user_end`` instead (the others unchanged)."""
    return [dict(t, to="last_user_end") if t.get("type") == "move_lines"
            and t.get("to") == "first_user_end" else t for t in transforms]


#: Characters after a volatile value's label beyond which its line is content, not a label
#: and value: it is not moved and only the value becomes a placeholder.
MAX_MOVED_LINE_TAIL = 120


def _long_line(g: dict[str, Any]) -> bool:
    """Whether the breaker's line goes on for more than :data:`MAX_MOVED_LINE_TAIL`
    characters after its stable label in any recorded example (a document on one line)."""
    prefix = g.get("prefix") or ""
    return any(len(new) - len(prefix) > MAX_MOVED_LINE_TAIL for new, _ in g.get("pairs") or ())


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _escape(text: str) -> str:
    """``text`` as a literal in a regular expression, escaping only what is special (spaces and
    dashes stay readable in the layout file)."""
    return re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text)


def _compose(base: Layout | None, extra: list[dict[str, Any]], name: str) -> Layout | None:
    if not extra:
        return base
    transforms = [t.model_dump(by_alias=True) for t in base.transforms] if base else []
    return Layout.model_validate({"name": name, "transforms": transforms + extra})


class _Chain:
    """A layout followed by counterfactual changes (what a counterfactual replay applies)."""

    def __init__(self, name: str, steps: list[Any]) -> None:
        self.name, self.steps = name, steps

    def apply(self, body: Any) -> dict[str, Any]:
        out = dict(body)
        for st in self.steps:
            out = st.apply(out)
        return out


def _counterfactual(base: Layout | None, extra: list[Any], name: str) -> Any:
    """``base`` then ``extra`` (layout transforms as dicts, or :class:`_Counterfactual`
    objects), in order."""
    if all(isinstance(t, dict) for t in extra):
        return _compose(base, extra, name)
    steps: list[Any] = [base] if base is not None else []
    run: list[dict[str, Any]] = []
    for t in extra:
        if isinstance(t, dict):
            run.append(t)
            continue
        if run:
            steps.append(Layout.model_validate({"name": name, "transforms": run}))
            run = []
        steps.append(t)
    if run:
        steps.append(Layout.model_validate({"name": name, "transforms": run}))
    return _Chain(name, steps)


def _what_if(s: SimSummary, before: SimSummary) -> dict[str, Any]:
    return {"hit_rate": s.hit_rate, "cached_tokens": s.cached_tokens,
            "cached_tokens_delta": s.cached_tokens - before.cached_tokens,
            "prompt_tokens": s.prompt_tokens,
            "prefill_saved_tokens": prefill_saved(before, s)}


def diagnose(spec: DiagnoseSpec, *, max_levels: int = MAX_LEVELS,
             max_measured: int = MAX_MEASURED, measure: bool = True,
             allow_rewrites: bool = False) -> Diagnosis:
    """Diagnose a trace: attribution, breakers ranked by lost tokens per level, the suggested
    layout and its exact replay.

    Args:
        spec: the trace and the cache (``replay sim``'s options).
        max_levels: levels diagnosed at most.
        max_measured: breakers per level measured by counterfactual replay.
        measure: False skips every counterfactual replay (attribution and counts only).
        allow_rewrites: also suggest transforms that rewrite values (placeholders, whitespace
            normalisation), labelled as changing the prompt; off: only moves and
            normalisations of tool order and JSON key order.

    Returns:
        :class:`Diagnosis`. Its suggested layout keeps only the fixes that lower the prefill
        (prompt tokens computed), each checked by replay in rank order on top of the ones kept,
        so its ``what_if`` never computes more prompt tokens than the trace as recorded.
    """
    base = attribution_pass(spec)
    passes = 1
    breakers: list[Breaker] = []
    seen: set[Any] = set()
    applied: list[Any] = []  # neutralisers of the levels below
    level_pass, level_total = base, base.summary
    neutralised: SimSummary | None = None
    for level in range(1, max_levels + 1):
        groups = {k: g for k, g in level_pass.groups.items()
                  if k not in seen and g["kind"] not in NOT_BREAKERS}
        if not groups:
            break
        seen.update(groups)
        order = sorted(groups.items(), key=lambda kv: (-kv[1]["tokens_after"], -kv[1]["requests"]))
        level_breakers = []
        for n, (_key, g) in enumerate(order):
            neut = neutraliser(g)
            text, transforms, fixable = suggestion(g, allow_rewrites=allow_rewrites)
            lost, measured, wi, cf = g["tokens_after"], False, None, None
            if measure and n < max_measured and (neut or g["kind"] == "evicted"):
                if g["kind"] == "evicted":
                    cf = replay_totals(spec, layout=_counterfactual(spec.layout, applied, "cf"),
                                       capacity_blocks=None)
                else:
                    cf = replay_totals(spec, layout=_counterfactual(spec.layout, applied + neut,
                                                                    "counterfactual"))
                passes += 1
                lost, measured = max(0, cf.cached_tokens - level_total.cached_tokens), True
                wi = _what_if(cf, base.summary)
            level_breakers.append(Breaker(
                level=level, kind=g["kind"], position=g["position"], requests=g["requests"],
                distinct_values=len(g["distinct"]), lost_tokens=lost, measured=measured,
                suggestion=text, fixable=fixable, transforms=transforms, neutraliser=neut,
                example_request=g["example"], earlier_request=g["earlier"], detail=g["detail"],
                what_if=wi, value_digests=sorted(g["distinct"])[:16], counterfactual=cf,
                fields=g.get("fields"), rewrites_prompt=fixable and any(
                    t.get("type") in REWRITING_TYPES for t in transforms)))
            if g["kind"] in CLIENT_FIXES and not fixable:
                level_breakers[-1].client_fix = _client_fix(
                    spec, g, level_total, applied, measure=measure and n < max_measured)
                passes += int(level_breakers[-1].client_fix.get("measured", False)
                              and g["kind"] == "changing_region")
        # A span whose counterfactual gains nothing is not a breaker (it changes, but what
        # follows it differs anyway).
        level_breakers = [b for b in level_breakers if not (b.measured and b.lost_tokens == 0)]
        level_breakers.sort(key=lambda b: (not b.measured, -b.lost_tokens, -b.requests))
        breakers.extend(level_breakers)
        new_neut = [t for b in level_breakers if b.neutraliser for t in b.neutraliser]
        if not measure or not new_neut or level == max_levels:
            break
        applied = applied + new_neut
        level_pass = attribution_pass(spec, layout=_counterfactual(spec.layout, applied, "fixed"))
        passes += 1
        level_total = level_pass.summary
        neutralised = level_total
    missed = base.summary.prompt_tokens - base.summary.cached_tokens
    for i, b in enumerate(breakers, start=1):
        b.rank = i
        b.share = (b.lost_tokens / missed) if missed else None
    suggested, what_if, n = _suggest(spec, breakers, base.summary, measure=measure)
    passes += n
    notes = []
    s = base.summary
    if s.rejected_requests:
        every = "every request" if s.counted_requests == 0 and s.rejected_requests == s.requests \
            else f"{s.rejected_requests:,} of {s.requests:,} requests"
        notes.append(f"{every} rejected, not counted: vLLM refuses a request that needs more "
                     "blocks than the cache holds (or is longer than --max-model-len); give a "
                     "bigger --capacity-blocks")
    if base.shared_prefix_requests == 0 and s.counted_requests > 0:
        if breakers:
            # Content is shared after a difference in the first block: what the breakers
            # below would gain, not "nothing can be served".
            notes.append("no two requests share a full block as recorded: the breakers below "
                         "keep apart content they do share")
        else:
            notes.append("no two requests share a full block: nothing in this trace can be "
                         "served from cache at this block size")
    return Diagnosis(spec=spec, base=base, breakers=breakers, suggested_layout=suggested,
                     what_if=what_if, neutralised=neutralised, levels=max(
                         [b.level for b in breakers], default=0), passes=passes, notes=notes,
                     allow_rewrites=allow_rewrites)


def _client_fix(spec: DiagnoseSpec, g: dict[str, Any], before: SimSummary, applied: list[Any],
                *, measure: bool) -> dict[str, Any]:
    """The client change that fixes breaker ``g`` (:data:`CLIENT_FIXES`), replayed with that
    change applied on top of the neutralisers of the levels below when it can be: a changing
    block moved after the history; earlier replies sent back verbatim; a tool held at one
    version. Rewritten history cannot be replayed (the older turns are not in the log).
    ``prefill_saved_tokens`` is against ``before``: the trace with the lower levels'
    neutralisers applied (as recorded at level 1)."""
    kind = g["kind"]
    change: list[Any] | None = None
    if kind == "changing_region" and g.get("region"):
        i, role, lo, hi, fixed = g["region"][:5]
        change = [MoveRegionAfterHistory(i, role, lo, hi, fixed)]
    elif kind in ("reply_resent", "tool_description", "tool_schema", "template_text"):
        change = [x for x in neutraliser(g) or [] if not isinstance(x, dict)] or None
    fix: dict[str, Any] = {"change": CLIENT_FIXES[kind], "measured": False, "hit_rate": None,
                           "cached_tokens": None, "prompt_tokens": None,
                           "prefill_saved_tokens": None}
    if change is None or not measure:
        return fix
    s = replay_totals(spec, layout=_counterfactual(spec.layout, applied + change, "client fix"))
    fix.update(measured=True, hit_rate=s.hit_rate, cached_tokens=s.cached_tokens,
               prompt_tokens=s.prompt_tokens, prefill_saved_tokens=prefill_saved(before, s))
    return fix


def _suggest(spec: DiagnoseSpec, breakers: list[Breaker], before: SimSummary, *, measure: bool
             ) -> tuple[Layout | None, SimSummary | None, int]:
    """(the suggested layout, its replay, replays run). Each fixable breaker's transforms, in
    rank order, are replayed on top of the ones kept (a moved line both to the end of the first
    and of the last user message) and kept only when they lower the prefill; the breaker's
    transforms and text follow the target kept. Unmeasured (``measure`` False): every fix,
    not replayed."""
    fixes: list[dict[str, Any]] = []
    if not measure:
        for b in breakers:
            for t in b.transforms if b.fixable else []:
                if t not in fixes:
                    fixes.append(t)
        return (_compose(spec.layout, fixes, "suggested") if fixes else None), None, 0
    current, replays = before, 0
    for b in breakers:
        new = [t for t in (b.transforms if b.fixable else []) if t not in fixes]
        if not new:
            continue
        options = [new]
        if _moved_to_last_user(new) != new:
            # A value that changes every request is better at the end of the last user message
            # (the history before it stays a prefix); one that changes once a day or session is
            # better at the end of the first (every later turn keeps it in place).
            options.append(_moved_to_last_user(new))
        best: tuple[int, list[dict[str, Any]], SimSummary] | None = None
        for opt in options:
            s = replay_totals(spec, layout=_compose(spec.layout, fixes + opt, "suggested"))
            replays += 1
            saved = prefill_saved(current, s)
            if saved > 0 and (best is None or saved > best[0]):
                best = (saved, opt, s)
        if best is None:
            b.fixable, b.transforms = False, []
            b.suggestion = ("not suggested: the fix replayed computes no fewer prompt tokens "
                            "(" + b.suggestion + ")")
            continue
        _, opt, current = best
        fixes.extend(opt)
        if opt is not new:
            b.transforms = opt
            b.suggestion = b.suggestion.replace(FIRST_USER_TEXT, LAST_USER_TEXT)
    if not fixes:
        return None, None, replays
    return _compose(spec.layout, fixes, "suggested"), current, replays


def suggested_layout_file(d: Diagnosis) -> str:
    """The suggested layout as YAML text (the file ``--suggest`` writes), each transform after
    a comment naming the breaker that suggested it."""
    if d.suggested_layout is None:
        return ""
    lines = ["# Suggested by prefixscope diagnose (docs/diagnose.md): one transform per fixable",
             "# breaker, replayed through the exact cache model.", "name: suggested",
             "description: fixes of the breakers found by prefixscope diagnose", "transforms:"]
    done: list[dict[str, Any]] = []
    base = [t.model_dump(by_alias=True) for t in d.spec.layout.transforms] if d.spec.layout else []
    for t in base:
        lines.append("  # from the layout given with --layout")
        lines.append(_yaml_item(t))
        done.append(t)
    for b in d.breakers:
        for t in b.transforms if b.fixable else []:
            if t in done:
                continue
            done.append(t)
            pos = b.position
            where = f"{pos.segment}" + (f" {pos.message_index} ({pos.role}) line {pos.line}"
                                        if pos and pos.segment == "message" else "") if pos else ""
            lines.append(f"  # breaker {b.rank}: {b.kind} at {where}, {b.lost_tokens:,} lost tokens")
            lines.append(_yaml_item(t))
    return "\n".join(lines) + "\n"


def _yaml_item(t: dict[str, Any]) -> str:
    import json

    # A JSON object is a YAML flow mapping: exact strings (newlines, backslashes) on one line.
    return "  - " + json.dumps(t, ensure_ascii=False)


def with_layout(spec: DiagnoseSpec, layout: Layout | None) -> DiagnoseSpec:
    """``spec`` with another layout."""
    return replace(spec, layout=layout)
