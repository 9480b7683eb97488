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
    NOT_BREAKERS,
    DiagnoseSpec,
    Pass,
    attribution_pass,
    replay_totals,
)
from prefixscope.replay.diagnose_render import Position
from prefixscope.replay.layouts import Layout
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
    "history_rewritten": "earlier turns were rewritten (summarised or truncated): every "
                         "rewrite starts the conversation's cache again",
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

    @property
    def summary(self) -> SimSummary:
        """The exact model's totals as recorded (= ``replay sim``)."""
        return self.base.summary


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


def neutraliser(g: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Layout transforms that make a breaker's span match across requests (the counterfactual
    of its lost tokens), or None when no layout can (new tools, salts, evictions...)."""
    kind, pos = g["kind"], g["position"]
    if kind == "tools_reordered":
        return [{"type": "sort_tools"}]
    if kind == "tool_schema":
        return [{"type": "canonical_tool_json"}]
    if pos is None or pos.segment != "message":
        return None
    sel = _selector_in(pos)
    if kind == "whitespace":
        return [{"type": "replace", "pattern": r"[ \t]+$", "with": "", "in": sel},
                {"type": "replace", "pattern": r"\s+", "with": " ", "in": sel}]
    prefix = (g.get("prefix") or "").rstrip()
    if kind in ("timestamp", "id", "number", "name"):
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


def suggestion(g: dict[str, Any]) -> tuple[str, list[dict[str, Any]], bool]:
    """(what to do, layout transforms that do it, fixable by layout) for one breaker."""
    kind, pos = g["kind"], g["position"]
    if kind == "tools_reordered":
        return "sort the tool list by name (sort_tools)", [{"type": "sort_tools"}], True
    if kind == "tool_schema":
        return ("render tool schemas with sorted keys (canonical_tool_json); if the schema "
                "itself changed, keep one version", [{"type": "canonical_tool_json"}], True)
    if kind in ("timestamp", "id", "number", "name") and pos is not None \
            and pos.segment == "message":
        prefix = g.get("prefix") or ""
        where = f"line {pos.line} of the {pos.role} message"
        if len(prefix.rstrip()) >= 3 and not _long_line(g):
            move = {"type": "move_lines", "pattern": "^" + _escape(prefix),
                    "from": _selector_in(pos), "to": "first_user_end", "separator": "\n\n"}
            if pos.role in ("system", "developer"):
                return (f"move {where} ({_article(kind)} {kind}) {FIRST_USER_TEXT}", [move], True)
        t = neutraliser(g) or []
        if t:
            return (f"replace the {kind} on {where} with a fixed placeholder (replace)"
                    + (" or round it (round_times)" if kind == "timestamp" else ""), t, True)
    if kind == "whitespace":
        return "normalise whitespace in that message (replace)", neutraliser(g) or [], True
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


def _what_if(s: SimSummary, before: SimSummary) -> dict[str, Any]:
    return {"hit_rate": s.hit_rate, "cached_tokens": s.cached_tokens,
            "cached_tokens_delta": s.cached_tokens - before.cached_tokens,
            "prompt_tokens": s.prompt_tokens}


def diagnose(spec: DiagnoseSpec, *, max_levels: int = MAX_LEVELS,
             max_measured: int = MAX_MEASURED, measure: bool = True) -> Diagnosis:
    """Diagnose a trace: attribution, breakers ranked by lost tokens per level, the suggested
    layout and its exact replay.

    Args:
        spec: the trace and the cache (``replay sim``'s options).
        max_levels: levels diagnosed at most.
        max_measured: breakers per level measured by counterfactual replay.
        measure: False skips every counterfactual replay (attribution and counts only).

    Returns:
        :class:`Diagnosis`.
    """
    base = attribution_pass(spec)
    passes = 1
    breakers: list[Breaker] = []
    seen: set[Any] = set()
    applied: list[dict[str, Any]] = []  # neutralisers of the levels below
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
            text, transforms, fixable = suggestion(g)
            lost, measured, wi, cf = g["tokens_after"], False, None, None
            if measure and n < max_measured and (neut or g["kind"] == "evicted"):
                if g["kind"] == "evicted":
                    cf = replay_totals(spec, layout=_compose(spec.layout, applied, "cf"),
                                       capacity_blocks=None)
                else:
                    cf = replay_totals(spec, layout=_compose(spec.layout, applied + neut,
                                                             "counterfactual"))
                passes += 1
                lost, measured = max(0, cf.cached_tokens - level_total.cached_tokens), True
                wi = _what_if(cf, base.summary)
                if lost == 0 and g["kind"] == "tool_schema":
                    # Sorted keys did not help: the schema itself changed.
                    lost, measured, wi, neut, cf = g["tokens_after"], False, None, None, None
                    text, transforms, fixable = ("not fixable by layout: the tool schema "
                                                 "changed: keep one version of every tool",
                                                 [], False)
            level_breakers.append(Breaker(
                level=level, kind=g["kind"], position=g["position"], requests=g["requests"],
                distinct_values=len(g["distinct"]), lost_tokens=lost, measured=measured,
                suggestion=text, fixable=fixable, transforms=transforms, neutraliser=neut,
                example_request=g["example"], earlier_request=g["earlier"], detail=g["detail"],
                what_if=wi, value_digests=sorted(g["distinct"])[:16], counterfactual=cf))
        # A span whose counterfactual gains nothing is not a breaker (it changes, but what
        # follows it differs anyway).
        level_breakers = [b for b in level_breakers if not (b.measured and b.lost_tokens == 0)]
        level_breakers.sort(key=lambda b: (not b.measured, -b.lost_tokens, -b.requests))
        breakers.extend(level_breakers)
        new_neut = [t for b in level_breakers if b.neutraliser for t in b.neutraliser]
        if not measure or not new_neut or level == max_levels:
            break
        applied = applied + new_neut
        level_pass = attribution_pass(spec, layout=_compose(spec.layout, applied, "fixed"))
        passes += 1
        level_total = level_pass.summary
        neutralised = level_total
    missed = base.summary.prompt_tokens - base.summary.cached_tokens
    for i, b in enumerate(breakers, start=1):
        b.rank = i
        b.share = (b.lost_tokens / missed) if missed else None
    fixes = []
    for b in breakers:
        if b.fixable:
            for t in b.transforms:
                if t not in fixes:
                    fixes.append(t)
    suggested = _compose(spec.layout, fixes, "suggested") if fixes else None
    what_if = None
    if suggested is not None and measure:
        what_if = replay_totals(spec, layout=suggested)
        passes += 1
        alternative = _moved_to_last_user(fixes)
        if alternative != fixes:
            # A value that changes every request is better at the end of the last user message
            # (the history before it stays a prefix); one that changes once a day or session is
            # better at the end of the first (every later turn keeps it in place). The replay
            # decides: the target with more cached tokens is suggested.
            alt_layout = _compose(spec.layout, alternative, "suggested")
            alt = replay_totals(spec, layout=alt_layout)
            passes += 1
            if alt.cached_tokens > what_if.cached_tokens:
                suggested, what_if = alt_layout, alt
                for b in breakers:
                    if b.fixable and _moved_to_last_user(b.transforms) != b.transforms:
                        b.transforms = _moved_to_last_user(b.transforms)
                        b.suggestion = b.suggestion.replace(
                            FIRST_USER_TEXT, LAST_USER_TEXT)
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
                         [b.level for b in breakers], default=0), passes=passes, notes=notes)


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
